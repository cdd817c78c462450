"""The encoder cache, as vLLM's: each image's vision-tower output, kept by its vision key (the image's content
identity under its request's cache salt: differently salted requests never share one) and sized in embeddings,
rows of the tower's output (vLLM's `encoder_cache_size`).

Two halves. The scheduler's `EncoderCacheManager` decides: which outputs exist, which live request uses which, what
a step encodes (a miss) and what it frees, and it counts hits and misses. The runner holds the tensors
(`ModelRunner.encoder_cache`) and does what the plan says: it deletes the plan's `free_encoder_keys`, stores what
the plan's `EncodeJob`s encode, and its forward reads each request's image rows by (vision key, row).

- **In use**: an output a live request references: from the step whose plan takes the request's images (its first
  chunk with image tokens; a miss encodes the output, a hit finds it) until the request finishes, fails or is
  aborted. A preempted request keeps its references: it recomputes its image tokens from them (its pixels are
  dropped once its images are taken, so the output is what it has of them).
- **Cached**: an output no live request uses. It stays for later requests (their hits) while the outputs held fit
  in the size; the least recently released goes first.
- **Freed**: evicted. The manager drops the cached outputs that no longer fit (or all of them, on a reset) and
  the next plan's `free_encoder_keys` has the runner delete them. An output in use is never freed, so while live
  requests use more than the size nothing stays cached: the size bounds what is kept for later."""
from collections import OrderedDict
from dataclasses import dataclass

import torch

# 64 MiB (the old vision_cache_bytes default) of 2048-wide fp32 rows (Qwen2.5-VL-3B, Qwen3-VL-2B): 32 images of 448²
DEFAULT_ENCODER_CACHE_SIZE = 8192


@dataclass(frozen=True, eq=False)
class ImageInputs:
    """A request's pixels on their way from intake to the runner, which keeps them until its images are taken."""
    images: tuple                         # ImageInfo of each image (pixel rows, grid or tiles)
    keys: tuple[str, ...]                 # each image's vision key
    pixel_values: torch.Tensor            # every image's rows in order: Qwen's patches or a tiled family's tiles
    pixel_mask: torch.Tensor | None       # SmolVLM: which pixels of each padded tile are real


def embedding_bytes(model) -> int:
    """Bytes of one row of the tower's output (its deepstack features included): what vision_cache_bytes divides."""
    deep = len(getattr(getattr(model.hf_config, "vision_config", None), "deepstack_visual_indexes", None) or ())
    return model.text_config.hidden_size * torch.finfo(model.dtype).bits // 8 * (1 + deep)


def encoder_cache_size(config, model) -> int:
    """EngineConfig.encoder_cache_size, or vision_cache_bytes in this model's embeddings, or the default."""
    if config.encoder_cache_size is not None:
        return config.encoder_cache_size
    if config.vision_cache_bytes is not None:
        return config.vision_cache_bytes // embedding_bytes(model)
    return DEFAULT_ENCODER_CACHE_SIZE


class EncoderCacheManager:
    """The scheduler's book of the runner's encoder outputs (the module's docstring says the policy)."""

    def __init__(self, size: int):
        self.size = size                                   # embeddings that may stay held
        self.rows: dict[str, int] = {}                     # vision key -> embeddings, every output held
        self.users: dict[str, set[int]] = {}               # vision key -> the live requests using it
        self.taken: dict[int, tuple[str, ...]] = {}        # seq_id -> its images' keys, once taken
        self.unused: OrderedDict[str, None] = OrderedDict()  # cached outputs, the least recently released first
        self.used = 0                                      # embeddings held, in use or cached
        self.hits = self.misses = 0
        self._freed: list[str] = []                        # evicted since the last plan
        self._new: set[str] = set()                        # this step's misses (encoded in it)

    def took(self, seq_id: int) -> bool:
        """Whether the request's images are taken (they are, from its first chunk with image tokens on)."""
        return seq_id in self.taken

    def take(self, seq_id: int, keys: tuple[str, ...], rows: list[int]) -> tuple[int, ...]:
        """A request's images, taken by the step of its first chunk with image tokens: each a hit (its output is
        held, or encoded in this step for another image or request) or a miss (encoded in this step). Returns the
        images its EncodeJob encodes: the misses, and the hits on outputs encoded in this step (the runner runs each
        output once; the job holds them too so that it can encode them alone if the step's shared tower call fails)."""
        todo = []
        for i, (key, n) in enumerate(zip(keys, rows)):
            if key in self.rows:
                self.hits += 1
                self.unused.pop(key, None)
            else:
                self.misses += 1
                self.rows[key], self.used = n, self.used + n
                self._new.add(key)
            if key in self._new:
                todo.append(i)
            self.users.setdefault(key, set()).add(seq_id)
        self.taken[seq_id] = tuple(keys)
        self._evict()
        return tuple(todo)

    def release(self, seq_id: int):
        """The request left the engine: outputs no other live request uses become cached (released last, freed
        last); what no longer fits is freed."""
        for key in dict.fromkeys(self.taken.pop(seq_id, ())):
            users = self.users.get(key)
            if users is None:
                continue
            users.discard(seq_id)
            if not users:
                del self.users[key]
                self.unused[key] = None
        self._evict()

    def lost(self, keys):
        """Outputs a plan encoded that the runner does not hold (every request that needed them failed first):
        forgotten, so that the next request encodes them."""
        for key in keys:
            if key in self.rows:
                self.used -= self.rows.pop(key)
                self.unused.pop(key, None)
                self.users.pop(key, None)

    def reset(self):
        """Free every cached output (outputs in use stay)."""
        size, self.size = self.size, 0
        self._evict()
        self.size = size

    def _evict(self):
        while self.used > self.size and self.unused:
            key, _ = self.unused.popitem(last=False)
            self.used -= self.rows.pop(key)
            self._freed.append(key)

    def end_step(self) -> tuple[str, ...]:
        """The keys freed since the last plan (the runner deletes them before the step's encodes); the step's
        misses become plain held outputs."""
        freed, self._freed, self._new = tuple(self._freed), [], set()
        return freed

    def stats(self) -> dict[str, int]:
        """hits, misses (images looked up when their requests' images were taken), size, used (embeddings held),
        in_use (of them, used by live requests), entries (outputs held)."""
        in_use = sum(self.rows[k] for k in self.users if k in self.rows)
        return {"hits": self.hits, "misses": self.misses, "size": self.size, "used": self.used, "in_use": in_use,
                "entries": len(self.rows)}
