"""Attention that reads the paged pool in place (no copy of any context): what the CPU's C kernel and FlexAttention
share. Every query is one token over the first `len` tokens of a block table: a decode, or one token of a chunk
whose K/V are already in the pool (causal by construction). Decodes always qualify; a prefill chunk of at most
CHUNK_IN_PLACE tokens too (longer ones run the reference's SDPA, whose GEMMs win)."""
import torch

from minivlm.model.backends.base import Attention

CHUNK_IN_PLACE = 16  # chunks up to this many tokens read the pool in place; longer ones gather (SDPA's GEMMs win)


def token_queries(meta) -> tuple[torch.Tensor, torch.Tensor]:
    """(block table, context length) of every new token of the step as its own query: a sequence's table repeated
    for each of its new tokens, whose lengths count up to the sequence's (made once a step, kept in meta)."""
    if "token_queries" not in meta.scratch:
        q_lens = torch.tensor(meta.q_lens, device=meta.block_tables.device)
        tables = meta.block_tables.repeat_interleave(q_lens, dim=0)
        lens = torch.cat([torch.arange(c - n + 1, c + 1) for n, c in zip(meta.q_lens, meta.ctx_lens)]).to(
            meta.block_tables.device)
        meta.scratch["token_queries"] = (tables, lens)
    return meta.scratch["token_queries"]


class InPlaceAttention(Attention):
    """The reference's structure, with decodes and short chunks read in place where `ready` says so."""

    def ready(self, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        """Whether len(q) one-token queries can read this pool in place now."""
        return True

    def in_place(self, q, k_cache, v_cache, tables, lens, scale: float, meta=None) -> torch.Tensor:
        """Every query [n, heads, d] over the first lens[i] tokens of tables[i], read where they lie in the pool."""
        raise NotImplementedError

    def attend(self, q, k, v, k_cache, v_cache, meta, scale):
        if meta.is_prefill and max(meta.q_lens) <= CHUNK_IN_PLACE and self.ready(q, k_cache):
            # decodes and short chunks (chunked prefill's mixed steps) as one call: every new token is a query over
            # its own sequence's tokens up to itself, since the step's K/V are already written
            return self.in_place(q, k_cache, v_cache, *token_queries(meta), scale, meta)
        return super().attend(q, k, v, k_cache, v_cache, meta, scale)

    def chunk(self, q, k, v, k_cache, v_cache, table, ctx: int, scale: float):
        q_len = q.shape[0]
        if ctx > q_len and q_len <= CHUNK_IN_PLACE and self.ready(q, k_cache):  # short, after a cached prefix
            lens = torch.arange(ctx - q_len + 1, ctx + 1, device=q.device)
            return self.in_place(q, k_cache, v_cache, table[None].expand(q_len, -1), lens, scale)
        return super().chunk(q, k, v, k_cache, v_cache, table, ctx, scale)

    def decode(self, q, k_cache, v_cache, meta, scale):
        if self.ready(q, k_cache):  # no copy of any context
            return self.in_place(q, k_cache, v_cache, meta.block_tables, meta.ctx_lens_t, scale, meta)
        return super().decode(q, k_cache, v_cache, meta, scale)
