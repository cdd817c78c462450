"""The event log: every decision the engine makes, in order, tagged with its scheduler step. It is the one
source for replay (the KV state at any step), step-through, timelines and per-run counters. Block events use
vLLM's KV-event names (BlockStored, BlockRemoved, AllBlocksCleared) and fields."""
import dataclasses
import json
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

KINDS = ("arrived", "scheduled", "cache_lookup", "allocated", "BlockStored", "freed", "BlockRemoved",
         "AllBlocksCleared", "preempted", "finished", "vision_encoded")


@dataclass
class EngineEvent:
    """One decision. Kind-specific fields (see KINDS and docs/API.md) read as attributes: ev.block_ids, ev.reason."""
    seq: int                      # position in the log, monotonic from 1
    step: int                     # the scheduler step it happened in
    kind: str
    request_id: str | None        # None for block-only events
    fields: dict = field(default_factory=dict)

    def __getattr__(self, name):
        try:
            return self.__dict__["fields"][name]
        except KeyError:
            raise AttributeError(f"{self.kind} event has no field {name!r}") from None

    def to_dict(self) -> dict:
        """Plain JSON-ready data (CacheHits become dicts, tuples lists)."""
        def plain(v):
            if dataclasses.is_dataclass(v):
                return dataclasses.asdict(v)
            return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v
        return {"seq": self.seq, "step": self.step, "kind": self.kind, "request_id": self.request_id,
                **{k: plain(v) for k, v in self.fields.items()}}


class EventLog:
    """A ring of the last `capacity` events (0 = logging off); `dropped` counts the ones pushed out."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.ring: deque[EngineEvent] = deque(maxlen=max(capacity, 1))
        self.next_seq, self.dropped, self.step = 1, 0, 0

    def emit(self, kind: str, request_id: str | None = None, **fields):
        if not self.capacity:
            return
        if len(self.ring) == self.capacity:
            self.dropped += 1
        self.ring.append(EngineEvent(self.next_seq, self.step, kind, request_id, fields))
        self.next_seq += 1

    def since(self, seq: int = 0) -> list[EngineEvent]:
        """Events with .seq > seq, in order (seq numbers in the ring are consecutive)."""
        if not self.ring:
            return []
        return list(islice(self.ring, max(0, seq + 1 - self.ring[0].seq), None))

    def newer_than(self, seq: int) -> list[EngineEvent]:
        """Like since(seq), read from the newest end: cheap when few events are newer (once per step)."""
        n = min(self.last_seq - seq, len(self.ring))
        return list(islice(reversed(self.ring), n))[::-1] if n > 0 else []

    @property
    def last_seq(self) -> int:
        return self.next_seq - 1


def to_jsonl(events: list[EngineEvent]) -> str:
    return "".join(json.dumps(e.to_dict()) + "\n" for e in events)
