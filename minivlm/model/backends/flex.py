"""FlexAttention in place (paged_flex.py): CUDA's in-place path at any block size, and the CPU's where MINIVLM_FLEX
names it. Compiled on a background thread when the engine starts, a bucket of query counts at a time; until a
step's bucket is ready, that step gathers blocks (the reference). enforce_eager compiles nothing."""
import gc
import threading

import torch

from minivlm.model.backends import paged_flex
from minivlm.model.backends.base import Said
from minivlm.model.backends.in_place import CHUNK_IN_PLACE, InPlaceAttention


def most_queries(max_num_seqs: int, chunked: bool, max_num_batched_tokens: int) -> int:
    """The most queries one in-place call of an engine can have: a decode step's sequences, a short chunk's
    tokens after a cached prefix, or (chunked prefill) a mixed step's tokens when every chunk is short."""
    most = max(max_num_seqs, CHUNK_IN_PLACE)
    return max(most, min(max_num_batched_tokens, CHUNK_IN_PLACE * max_num_seqs)) if chunked else most


class FlexAttention(InPlaceAttention):
    name = "flex_attention"
    key = warmup = None  # the pool it compiles for, and the thread that compiles (start)

    @classmethod
    def runs_on(cls, model, config) -> bool:  # enforce_eager compiles nothing
        return not config.enforce_eager and paged_flex.enabled(model.device)

    @classmethod
    def make(cls, model, config, kv_caches) -> "FlexAttention":
        """Its compile starts here, for this engine's pool."""
        cfg = model.text_config
        return cls().start(kv_caches, cfg.num_attention_heads, cfg.head_dim ** -0.5,
                           most_queries(config.max_num_seqs, config.enable_chunked_prefill,
                                        config.max_num_batched_tokens), config.block_size)

    def start(self, kv_caches, heads: int, scale: float, most: int, block_size: int) -> "FlexAttention":
        """Compile every bucket up to `most` queries for this pool, on a background thread."""
        k, v = kv_caches[0]
        self.key, self.stop = paged_flex.pool_key(k, heads), threading.Event()
        self.warmup = paged_flex.warm_async(k, v, heads, scale, most, block_size, self.stop)
        return self

    def ready(self, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        return paged_flex.ready(q, k_cache)

    def in_place(self, q, k_cache, v_cache, tables, lens, scale: float, meta=None) -> torch.Tensor:
        return paged_flex.paged_attention(q, k_cache, v_cache, tables, lens, scale, meta)

    def status(self) -> str:
        """"compiling 2/6", "ready", "failed: ...", "stopped after ...": this pool's compile."""
        return paged_flex.status.get(self.key, "compiling")

    def describe(self) -> Said:
        state = self.status()
        return Said("engine.attn_flex") if state == "ready" else \
            Said("engine.attn_gathered", why=Said("engine.why_flex", state=state))

    def release(self):
        """A compile in progress stops after its bucket (it holds the pool while it runs); what it traced refers to
        the pool through cycles, collected here so that the pool's memory goes back at close."""
        if self.warmup is not None:
            self.stop.set()
            self.warmup.join()
            gc.collect()

