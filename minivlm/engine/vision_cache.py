"""LRU cache of vision-tower outputs keyed by the image's strategy-C identity, bounded by bytes."""
from collections import OrderedDict

import torch


class VisionCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, tuple[torch.Tensor, list[torch.Tensor]]] = OrderedDict()
        self.bytes = 0
        self.hits = 0

    @staticmethod
    def _size(value) -> int:
        embeds, deep = value
        return sum(t.numel() * t.element_size() for t in [embeds, *deep])

    def __contains__(self, key: str) -> bool:  # a peek: no hit counted, no LRU update
        return key in self.entries

    def get(self, key: str):
        value = self.entries.get(key)
        if value is None:
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: str, value):
        size = self._size(value)
        if size > self.max_bytes or key in self.entries:
            return
        self.entries[key] = value
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self.entries.popitem(last=False)
            self.bytes -= self._size(old)

    def clear(self):
        self.entries.clear()
        self.bytes = 0
