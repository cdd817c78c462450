"""Attention over the paged KV cache: write new K/V into their slots, then read each request's blocks."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minivlm.model import paged_cpu, paged_flex

try:  # optional on CUDA: flash-attn's paged kernels (flash-attn 2 needs pages of a multiple of 256 tokens)
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
except ImportError:
    flash_attn_varlen_func = flash_attn_with_kvcache = None
FLASH_ATTN_ENABLED = True  # False forces SDPA over gathered blocks even where flash-attn is installed (comparisons)
CHUNK_IN_PLACE = 16  # CPU: chunks up to this many tokens read the pool in place; longer ones gather (SDPA's GEMMs win)


@dataclass
class AttentionMetadata:
    """Where this step's tokens go and what they may see.
    prefill: tokens of each sequence are contiguous in the batch (q_lens); ctx_lens = cached + new tokens.
    decode: one token per sequence; block_tables [B, max_blocks] padded with block 0, masked by ctx_lens.
    mixed (chunked prefill): both kinds in one batch; `parts` splits it into a decode and a prefill part."""
    is_prefill: bool
    slot_mapping: torch.Tensor      # [T] flat slot (block_id * block_size + offset) of each new token
    q_lens: list[int]
    ctx_lens: list[int]
    block_tables: torch.Tensor      # [B, max_blocks]
    ctx_lens_t: torch.Tensor        # [B] on device
    block_size: int
    decode_mask: torch.Tensor | None = None  # built by the first layer of a decode step, reused by the others
    parts: list | None = None  # mixed steps: [(token rows, metadata of those sequences)] for decodes, then prefills
    token_queries: tuple | None = None  # short chunks: (block table, length) of every token, built by the 1st layer
    flex_mask: object = None  # FlexAttention's block mask of this step's queries, built by the first layer

    @classmethod
    def build(cls, slots, q_lens: list[int], ctx_lens: list[int], tables: torch.Tensor, block_size: int, device):
        """The step's metadata; in a mixed step the one-token sequences (decodes, or a 1-token last chunk: the
        same arithmetic) keep the batched decode path instead of each taking the per-sequence prefill path."""
        meta = cls(max(q_lens) > 1, slots, q_lens, ctx_lens, tables, torch.tensor(ctx_lens, device=device), block_size)
        if not meta.is_prefill:  # a decode step (the hot path): nothing to split
            return meta
        one = [i for i, q in enumerate(q_lens) if q == 1]
        if not one:
            return meta
        starts = torch.tensor([0] + q_lens).cumsum(0).tolist()
        many = [i for i, q in enumerate(q_lens) if q > 1]
        meta.parts = []
        for seqs, prefill in ((one, False), (many, True)):
            rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in seqs]).to(device)
            idx, ctx = torch.tensor(seqs, device=device), [ctx_lens[i] for i in seqs]
            width = -(-max(ctx) // block_size)  # decodes gather only as many blocks as their longest context
            meta.parts.append((rows, cls(prefill, slots[rows], [q_lens[i] for i in seqs], ctx,
                                         tables[idx, :width], meta.ctx_lens_t[idx], block_size)))
        return meta


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor):
    """Scatter this step's K/V [T, kv_heads, head_dim] into the cache [num_blocks, block_size, kv_heads, head_dim]."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """One sequence's first `length` cached tokens, in logical order: [length, kv_heads, head_dim]."""
    bs = cache.shape[1]
    blocks = block_table[: (length + bs - 1) // bs]
    # index_select copies whole rows; on CPU it is ~10x faster than advanced indexing (cache[blocks])
    return cache.index_select(0, blocks).reshape(-1, *cache.shape[2:])[:length]


def paged_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                    kv_written: bool = False) -> torch.Tensor:
    """q [T, heads, d], k/v [T, kv_heads, d] of the new tokens -> output [T, heads, d]. kv_written: the caller has
    already stored k/v at the step's slots (decode_ops.rope_store)."""
    if not kv_written:
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    if use_flash_attn(q, meta):
        return _flash(q, k_cache, v_cache, meta, scale)
    if meta.is_prefill and max(meta.q_lens) <= CHUNK_IN_PLACE and in_place_available(q, k_cache):
        return _every_token_in_place(q, k_cache, v_cache, meta, scale)
    if meta.parts:  # mixed: decodes batched, prefill chunks each on their own
        out = torch.empty_like(q)
        for rows, part in meta.parts:
            out[rows] = (_prefill(q[rows], k[rows], v[rows], k_cache, v_cache, part, scale) if part.is_prefill
                         else _decode(q[rows], k_cache, v_cache, part, scale))
        return out
    if meta.is_prefill:
        return _prefill(q, k, v, k_cache, v_cache, meta, scale)
    return _decode(q, k_cache, v_cache, meta, scale)


def _prefill(q, k, v, k_cache, v_cache, meta, scale):
    outs, start = [], 0
    for i, (q_len, ctx) in enumerate(zip(meta.q_lens, meta.ctx_lens)):
        chunk = q[start:start + q_len]
        if ctx > q_len and q_len <= CHUNK_IN_PLACE and in_place_available(chunk, k_cache):  # short, after a prefix
            outs.append(_chunk_in_place(chunk, k_cache, v_cache, meta.block_tables[i], ctx, scale))
            start += q_len
            continue
        qi = chunk.transpose(0, 1)
        if ctx == q_len:  # nothing cached: the new K/V are the whole context
            ki, vi = k[start:start + q_len], v[start:start + q_len]
            mask, causal = None, True
        else:  # a cached prefix: read it back from this sequence's blocks
            ki = gather_kv(k_cache, meta.block_tables[i], ctx)
            vi = gather_kv(v_cache, meta.block_tables[i], ctx)
            mask = torch.ones(q_len, ctx, dtype=torch.bool, device=q.device).tril(ctx - q_len)
            causal = False
        # 4-D on purpose: CPU SDPA sends 3-D inputs to its unfused math path (25x slower at 1,536 tokens)
        o = F.scaled_dot_product_attention(qi[None], ki.transpose(0, 1)[None], vi.transpose(0, 1)[None],
                                           attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
        outs.append(o[0].transpose(0, 1))
        start += q_len
    return torch.cat(outs, dim=0)


def _chunk_in_place(q, k_cache, v_cache, table, ctx: int, scale: float) -> torch.Tensor:
    """A prefill chunk's attention read in place: its K/V are already in the pool, so each of its q_len tokens is
    a decode query over the first (its position + 1) tokens of the same block table (causal, no context copy)."""
    q_len = q.shape[0]
    lens = torch.arange(ctx - q_len + 1, ctx + 1, device=q.device)
    return in_place(q, k_cache, v_cache, table[None].expand(q_len, -1), lens, scale)


def _every_token_in_place(q, k_cache, v_cache, meta, scale) -> torch.Tensor:
    """A step of decodes and short chunks (chunked prefill's mixed steps) as one in-place call: every new token is a
    decode query over its own sequence's tokens up to itself, since the step's K/V are already written."""
    return in_place(q, k_cache, v_cache, *token_queries(meta), scale, meta)


def token_queries(meta) -> tuple[torch.Tensor, torch.Tensor]:
    """(block table, context length) of every new token of the step as its own query: a sequence's table repeated
    for each of its new tokens, whose lengths count up to the sequence's (made once a step, kept in meta)."""
    if meta.token_queries is None:
        q_lens = torch.tensor(meta.q_lens, device=meta.block_tables.device)
        tables = meta.block_tables.repeat_interleave(q_lens, dim=0)
        lens = torch.cat([torch.arange(c - n + 1, c + 1) for n, c in zip(meta.q_lens, meta.ctx_lens)]).to(
            meta.block_tables.device)
        meta.token_queries = (tables, lens)
    return meta.token_queries


def _decode(q, k_cache, v_cache, meta, scale):
    if in_place_available(q, k_cache):  # no copy of any context
        return in_place(q, k_cache, v_cache, meta.block_tables, meta.ctx_lens_t, scale, meta)
    return gathered_decode(q, k_cache, v_cache, meta, scale)


def in_place_available(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether len(q) one-token queries can read the pool in place now: the C kernel (CPU, fp32), or FlexAttention
    compiled for this pool and query count (paged_flex: CUDA, or wherever MINIVLM_FLEX names)."""
    return paged_cpu.available(q) or paged_flex.ready(q, k_cache)


def in_place(q, k_cache, v_cache, tables, lens, scale: float, meta=None) -> torch.Tensor:
    """Every query [n, heads, d] over the first lens[i] tokens of tables[i], read where they lie in the pool."""
    if paged_cpu.available(q):
        return paged_cpu.paged_decode(q, k_cache, v_cache, tables, lens, scale)
    return paged_flex.paged_attention(q, k_cache, v_cache, tables, lens, scale, meta)


def gathered_decode(q, k_cache, v_cache, meta, scale):
    """Every sequence's padded context copied out of the pool (per layer, K and V), then one SDPA call: the path
    where the in-place kernel is not available, and the reference it is tested against."""
    bsz, max_blocks = meta.block_tables.shape
    heads, kv_heads, d = q.shape[1], k_cache.shape[2], q.shape[2]
    flat = meta.block_tables.reshape(-1)
    keys = k_cache.index_select(0, flat).view(bsz, max_blocks * meta.block_size, kv_heads, d)
    values = v_cache.index_select(0, flat).view(bsz, max_blocks * meta.block_size, kv_heads, d)
    if meta.decode_mask is None:  # the same for every layer of this step; additive, so SDPA need not convert it
        past = torch.arange(keys.shape[1], device=q.device)[None, :] >= meta.ctx_lens_t[:, None]
        meta.decode_mask = torch.zeros(past.shape, dtype=q.dtype, device=q.device).masked_fill_(past, float("-inf"))
        meta.decode_mask = meta.decode_mask[:, None, None, :]  # [B, 1, 1, S]
    # GQA folded into the query axis: the heads sharing a KV head become `group` queries against it, all with the
    # same mask (one token per sequence), so K/V are read once per KV head instead of being expanded per head.
    grouped = q.view(bsz, kv_heads, heads // kv_heads, d)
    o = F.scaled_dot_product_attention(grouped, keys.transpose(1, 2), values.transpose(1, 2),
                                       attn_mask=meta.decode_mask, scale=scale)
    return o.reshape(bsz, heads, d)


def attention_backend(device, dtype, block_size: int, flex: str | None = None) -> str:
    """Which decode attention an engine on this device, dtype and block size runs, in words (the status line).
    flex: its pool's FlexAttention status (ModelRunner.flex_status), where that path was started."""
    kind = torch.device(device).type
    if kind == "cpu" and dtype == torch.float32 and paged_cpu.ENABLED and paged_cpu.kernel():
        return "in-place paged decode (C kernel over the block tables); prefill: SDPA"
    if flash_applies(device, dtype, block_size):
        return "flash-attn paged kernels"
    if flex == "ready":
        return "in-place paged decode (FlexAttention over the block tables, compiled); prefill: SDPA"
    if flex is not None:
        return f"SDPA over gathered blocks (FlexAttention in place: {flex})"
    why = ""
    if kind == "cuda":
        why = (" (flash-attn not installed)" if flash_attn_with_kvcache is None else
               " (flash-attn's paged kernel needs fp16/bf16 and a block size that is a multiple of 256)")
    elif kind == "cpu":
        why = " (in-place kernel: " + ("fp32 only" if dtype != torch.float32 else "off, MINIVLM_PAGED_CPU=0"
                                       if not paged_cpu.ENABLED else paged_cpu.error) + ")"
    return "SDPA over gathered blocks" + why


def flex_wanted(device, dtype, block_size: int) -> bool:
    """FlexAttention is this engine's in-place path: enabled for the device (paged_flex.DEVICES), and neither the
    C kernel nor flash-attn serves it."""
    return (paged_flex.enabled(device) and not flash_applies(device, dtype, block_size)
            and not paged_cpu.available(torch.empty(0, dtype=dtype, device=device)))


def flash_applies(device, dtype, block_size: int) -> bool:
    """flash-attn's paged kernels serve this engine: CUDA, fp16/bf16, pages of a multiple of 256 tokens."""
    return (FLASH_ATTN_ENABLED and flash_attn_with_kvcache is not None and torch.device(device).type == "cuda"
            and dtype in (torch.float16, torch.bfloat16) and block_size % 256 == 0)


def use_flash_attn(q: torch.Tensor, meta: AttentionMetadata) -> bool:
    return flash_applies(q.device, q.dtype, meta.block_size)


def _flash(q, k_cache, v_cache, meta, scale):
    """Both phases straight from the paged cache, as nano-vllm does: varlen prefill, kv-cache decode."""
    tables = meta.block_tables.to(torch.int32)
    if not meta.is_prefill:
        return flash_attn_with_kvcache(q[:, None], k_cache, v_cache, cache_seqlens=meta.ctx_lens_t.to(torch.int32),
                                       block_table=tables, softmax_scale=scale, causal=True)[:, 0]
    cu_q = F.pad(torch.tensor(meta.q_lens, device=q.device).cumsum(0), (1, 0)).to(torch.int32)
    cu_k = F.pad(meta.ctx_lens_t.cumsum(0), (1, 0)).to(torch.int32)
    return flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, max(meta.q_lens), max(meta.ctx_lens),
                                  softmax_scale=scale, causal=True, block_table=tables)
