"""Attention over the paged KV cache, in PyTorch: write the step's new K/V into their slots, then read each
request's blocks back and run SDPA. This is the reference: a backend (model/backends/) subclasses PagedAttention
and overrides what it runs faster, and is checked against it."""
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor):
    """Scatter this step's K/V [T, kv_heads, head_dim] into the cache [num_blocks, block_size, kv_heads, head_dim]."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None, spans,
            spans_past_window: bool = False) -> torch.Tensor:
    """Which keys each query sees [q, k], by absolute position: causal, OR both inside one span (Gemma 3's image
    runs see each other both ways), AND (sliding layers) at most window-1 positions back: HF's
    AND(sliding_window, OR(causal, same-image-block)); with spans_past_window (Gemma 4 12B, as HF's
    Gemma4UnifiedModel.forward masks it) OR(AND(causal, sliding_window), same-image-block)."""
    seen = k_pos[None, :] <= q_pos[:, None]
    if window is not None and spans_past_window:
        seen &= k_pos[None, :] > q_pos[:, None] - window
    for a, b in spans:
        seen |= ((q_pos >= a) & (q_pos < b))[:, None] & ((k_pos >= a) & (k_pos < b))[None, :]
    if window is not None and not spans_past_window:
        seen &= k_pos[None, :] > q_pos[:, None] - window
    return seen


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """One sequence's first `length` cached tokens, in logical order: [length, kv_heads, head_dim]."""
    bs = cache.shape[1]
    blocks = block_table[: (length + bs - 1) // bs]
    # index_select copies whole rows; on CPU it is ~10x faster than advanced indexing (cache[blocks])
    return cache.index_select(0, blocks).reshape(-1, *cache.shape[2:])[:length]


class PagedAttention:
    """SDPA over gathered blocks. Called with q [T, heads, d] and k/v [T, kv_heads, d] of the step's new tokens,
    returns [T, heads, d]."""

    def __call__(self, q, k, v, k_cache, v_cache, meta: "AttentionMetadata", scale: float) -> torch.Tensor:
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        return self.attend(q, k, v, k_cache, v_cache, meta, scale)

    def attend(self, q, k, v, k_cache, v_cache, meta: "AttentionMetadata", scale: float) -> torch.Tensor:
        """The same, once the step's K/V are in the pool."""
        if meta.parts:  # mixed: decodes batched, prefill chunks each on their own
            out = torch.empty_like(q)
            for rows, part in meta.parts:
                out[rows] = (self.prefill(q[rows], k[rows], v[rows], k_cache, v_cache, part, scale) if part.is_prefill
                             else self.decode(q[rows], k_cache, v_cache, part, scale))
            return out
        if meta.is_prefill:
            return self.prefill(q, k, v, k_cache, v_cache, meta, scale)
        return self.decode(q, k_cache, v_cache, meta, scale)

    def prefill(self, q, k, v, k_cache, v_cache, meta, scale):
        outs, start = [], 0
        masked = meta.window is not None or meta.spans is not None  # else the plain causal chunk, as always
        for i, (q_len, ctx) in enumerate(zip(meta.q_lens, meta.ctx_lens)):
            rows = slice(start, start + q_len)
            extra = dict(window=meta.window, spans=meta.spans[i] if meta.spans else (),
                         spans_past_window=meta.spans_past_window) if masked else {}
            outs.append(self.chunk(q[rows], k[rows], v[rows], k_cache, v_cache, meta.block_tables[i], ctx, scale,
                                   **extra))
            start += q_len
        return torch.cat(outs, dim=0)

    def chunk(self, q, k, v, k_cache, v_cache, table, ctx: int, scale: float, window: int | None = None,
              spans=(), spans_past_window: bool = False) -> torch.Tensor:
        """One sequence's new tokens q [q_len, heads, d]: the last q_len of its ctx tokens, causal (or as `visible`
        says, given a window or spans)."""
        q_len = q.shape[0]
        if window is not None or spans:
            return self.masked_chunk(q, k, v, k_cache, v_cache, table, ctx, scale, window, spans, spans_past_window)
        if ctx == q_len:  # nothing cached: the new K/V are the whole context
            ki, vi, mask, causal = k, v, None, True
        else:  # a cached prefix: read it back from this sequence's blocks
            ki, vi = gather_kv(k_cache, table, ctx), gather_kv(v_cache, table, ctx)
            mask = torch.ones(q_len, ctx, dtype=torch.bool, device=q.device).tril(ctx - q_len)
            causal = False
        # 4-D on purpose: CPU SDPA sends 3-D inputs to its unfused math path (25x slower at 1,536 tokens)
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], ki.transpose(0, 1)[None], vi.transpose(0, 1)[None],
                                           attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
        return o[0].transpose(0, 1)

    def masked_chunk(self, q, k, v, k_cache, v_cache, table, ctx: int, scale: float, window, spans,
                     spans_past_window: bool = False):
        """chunk() under a sliding window and/or bidirectional spans: keys from the oldest block any query of the
        chunk may see (a window's older blocks, maybe freed, are never read), the mask from `visible`."""
        q_len, bs = q.shape[0], k_cache.shape[1]
        first = ctx - q_len  # position of the chunk's first token
        spans = [(a, b) for a, b in spans if a < ctx and b > first]  # the spans this chunk's queries lie in
        for a, b in spans:
            if b > ctx:  # its earlier tokens would have to see tokens not computed yet: no chunk may end inside
                raise ValueError(f"a prefill chunk ends at token {ctx}, inside the bidirectional span [{a}, {b}): "
                                 f"an image's tokens must be computed in one chunk (or come from the prefix cache)")
        lo = 0 if window is None else max(0, first - window + 1) // bs * bs  # block-aligned oldest visible key
        if window is not None and spans_past_window and spans:  # an image's queries see its whole span
            if min(a for a, _ in spans) < lo:  # begun in the cache past the window: those blocks may be gone
                raise ValueError(f"a prefill chunk starts at token {first}, inside an image span that began more than "
                                 f"the sliding window ({window}) before it: its blocks are not kept")
            lo = min([lo] + [a // bs * bs for a, _ in spans])
        if ctx == q_len and lo == 0:  # nothing cached: the new K/V are the whole context
            ki, vi = k, v
        else:
            ki, vi = gather_kv(k_cache, table[lo // bs:], ctx - lo), gather_kv(v_cache, table[lo // bs:], ctx - lo)
        mask = visible(torch.arange(first, ctx, device=q.device), torch.arange(lo, ctx, device=q.device), window,
                       spans, spans_past_window)
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], ki.transpose(0, 1)[None], vi.transpose(0, 1)[None],
                                           attn_mask=mask, scale=scale, enable_gqa=True)
        return o[0].transpose(0, 1)

    def decode(self, q, k_cache, v_cache, meta, scale):
        return gathered_decode(q, k_cache, v_cache, meta, scale)


REFERENCE = PagedAttention()


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
    attention: PagedAttention = REFERENCE  # what every layer's attention calls: the engine's backend picks it once
    decode_mask: torch.Tensor | None = None  # built by the first layer of a decode step, reused by the others
    parts: list | None = None  # mixed steps: [(token rows, metadata of those sequences)] for decodes, then prefills
    scratch: dict = field(default_factory=dict)  # what a backend builds in the first layer and the others reuse
    window: int | None = None  # sliding-window group: a query sees the `window` tokens ending at itself (HF's rule)
    spans: list | None = None  # per sequence: [(a, b)] token ranges that see each other both ways (Gemma 3's images)
    spans_past_window: bool = False  # a span's tokens see each other whole, past the window (Gemma 4 12B's images)

    @classmethod
    def build(cls, slots, q_lens: list[int], ctx_lens: list[int], tables: torch.Tensor, block_size: int, device,
              attention: PagedAttention = REFERENCE, window: int | None = None, spans: list | None = None):
        """The step's metadata; in a mixed step the one-token sequences (decodes, or a 1-token last chunk: the
        same arithmetic) keep the batched decode path instead of each taking the per-sequence prefill path.
        window / spans (a sliding-window group; Gemma 3's image runs, per sequence) go with each part."""
        meta = cls(max(q_lens) > 1, slots, q_lens, ctx_lens, tables, torch.tensor(ctx_lens, device=device), block_size,
                   attention, window=window, spans=spans)
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
                                         tables[idx, :width], meta.ctx_lens_t[idx], block_size, attention,
                                         window=window, spans=[spans[i] for i in seqs] if spans else None)))
        return meta


def gathered_decode(q, k_cache, v_cache, meta, scale):
    """Every sequence's padded context copied out of the pool (per layer, K and V), then one SDPA call: the path
    where the in-place kernel is not available, and the reference it is tested against."""
    tables = meta.block_tables if meta.window is None else window_tables(meta)
    bsz, max_blocks = tables.shape
    heads, kv_heads, d = q.shape[1], k_cache.shape[2], q.shape[2]
    flat = tables.reshape(-1)
    keys = k_cache.index_select(0, flat).view(bsz, max_blocks * meta.block_size, kv_heads, d)
    values = v_cache.index_select(0, flat).view(bsz, max_blocks * meta.block_size, kv_heads, d)
    if meta.decode_mask is None:  # the same for every layer of this step; additive, so SDPA need not convert it
        pos = torch.arange(keys.shape[1], device=q.device)[None, :]
        if meta.window is None:
            past = pos >= meta.ctx_lens_t[:, None]
        else:  # positions from each sequence's first windowed block; a query sees the `window` tokens up to itself
            pos = pos + meta.scratch["window_start"][:, None]
            past = (pos >= meta.ctx_lens_t[:, None]) | (pos < meta.ctx_lens_t[:, None] - meta.window)
        meta.decode_mask = torch.zeros(past.shape, dtype=q.dtype, device=q.device).masked_fill_(past, float("-inf"))
        meta.decode_mask = meta.decode_mask[:, None, None, :]  # [B, 1, 1, S]
    # GQA folded into the query axis: the heads sharing a KV head become `group` queries against it, all with the
    # same mask (one token per sequence), so K/V are read once per KV head instead of being expanded per head.
    grouped = q.view(bsz, kv_heads, heads // kv_heads, d)
    o = F.scaled_dot_product_attention(grouped, keys.transpose(1, 2), values.transpose(1, 2),
                                       attn_mask=meta.decode_mask, scale=scale)
    return o.reshape(bsz, heads, d)


def window_tables(meta) -> torch.Tensor:
    """A sliding-window decode's block tables [B, W]: each sequence's blocks from the one holding its oldest visible
    token (ctx - window), so a step reads ~window tokens per sequence however long it is, and never a block that
    left the window (the engine may have freed it). Made once a step; scratch["window_start"]: each row's first
    position."""
    if "window_tables" not in meta.scratch:
        bs, cols = meta.block_size, meta.block_tables.shape[1]
        first = (meta.ctx_lens_t - meta.window).clamp(min=0) // bs
        width = min(cols, -(-(meta.window + bs - 1) // bs))  # blocks any `window` consecutive tokens can touch
        # past a table's last column: its last block again, at positions >= ctx (masked)
        idx = (first[:, None] + torch.arange(width, device=first.device)).clamp(max=cols - 1)
        meta.scratch["window_tables"] = meta.block_tables.gather(1, idx)
        meta.scratch["window_start"] = first * bs
    return meta.scratch["window_tables"]
