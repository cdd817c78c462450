"""Paged attention in place on any device torch.compile targets: PyTorch's FlexAttention over the whole KV pool, with
a block mask made from the block tables, so each query reads its own sequence's blocks where they lie (no gather,
no new dependency). It is CUDA's in-place path at the default block size (flash-attn's paged kernels need pages of
256 tokens); flex.py is the backend around it. On the CPU the C kernel (paged_decode.c) is faster, so this runs
there only when asked (MINIVLM_FLEX=cpu): the tests check it on the CPU, where inductor compiles the same code to C++.

Every query is one token against the first `len` tokens of its block table: a decode, or one token of a short
chunk whose K/V are already in the pool (causal by construction), as in the C kernel. Compiling takes seconds per
shape, so the queries of a call are padded to a few bucket sizes, compiled on a background thread when an engine
starts (until its bucket is ready a step gathers blocks) and checked against gathering on first use."""
import os
import threading
import time

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

DEVICES = {d for d in os.environ.get("MINIVLM_FLEX", "cuda").split(",") if d}  # device types it runs on ("0": off)
BUCKETS = (16, 32, 64, 128, 256, 512)  # queries padded to these: six shapes, each compiled once per pool
CHECKED = 16  # queries of a bucket's first call that are also gathered and compared
Q_TILE = 16  # the mask's query tile: one tile row (a query is one token); the decoding kernel tiles queries by 16
_lock = threading.Lock()
_compiled: list = []  # [torch.compile(flex_attention)], made on first use
_ready: set[tuple] = set()  # shape keys (see _key) compiled
_checked: set[tuple] = set()  # and checked against gathering on a real step
status: dict[tuple, str] = {}  # pool key -> "compiling 2/6" | "ready" | "failed: ..." (the status line)
compile_s: dict[tuple, float] = {}  # pool key -> seconds its buckets took to compile


def enabled(device) -> bool:
    return torch.device(device).type in DEVICES


def bucket(n: int) -> int | None:
    """The padded query count for n queries, or None past the largest bucket (such a step gathers)."""
    return next((b for b in BUCKETS if n <= b), None)


def pool_key(k_cache: torch.Tensor, heads: int) -> tuple:
    return (k_cache.device.type, k_cache.dtype, tuple(k_cache.shape), heads)


def _key(k_cache: torch.Tensor, heads: int, n: int) -> tuple:
    return pool_key(k_cache, heads) + (bucket(n),)


def ready(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether n = len(q) queries over this pool run compiled now (never compiles here: a step must not wait)."""
    return bool(_ready) and _key(k_cache, q.shape[1], q.shape[0]) in _ready


def block_mask(tables: torch.Tensor, lens: torch.Tensor, num_blocks: int, block_size: int, rows: int) -> BlockMask:
    """Query b may read the first lens[b] tokens of tables[b]; `rows` >= len(tables) pads with queries of one token
    (block 0's first slot). The mask function alone is exact (physical slot -> its logical position in b's
    table, or -1); the block lists let the kernel skip every other block: all of b's blocks but the last as full
    (no mask evaluated), the last, maybe partial, as the one masked."""
    n, width, dev = tables.shape[0], tables.shape[1], tables.device
    lens_p = torch.ones(rows, dtype=torch.int64, device=dev)
    lens_p[:n] = lens
    tables_p = torch.zeros(rows, width, dtype=torch.int64, device=dev)
    tables_p[:n] = tables
    blocks = (lens_p + block_size - 1) // block_size
    cols = torch.arange(width, device=dev, dtype=torch.int32).expand(rows, width)
    unused = torch.full_like(tables_p, num_blocks)  # a table's padding goes to a spare column, dropped after
    logical = torch.full((rows, num_blocks + 1), -1, dtype=torch.int32, device=dev)
    logical = logical.scatter_(1, torch.where(cols < blocks[:, None], tables_p, unused), cols)[:, :num_blocks]
    full = torch.zeros(rows, 1, 1, num_blocks, dtype=torch.int32, device=dev)
    full[:, 0, 0, :width] = tables_p
    last = torch.zeros(rows, 1, 1, num_blocks, dtype=torch.int32, device=dev)
    last[:, 0, 0, 0] = tables_p.gather(1, (blocks - 1)[:, None])[:, 0]

    def inside(b, h, q_idx, kv_idx):
        pos = logical[b, kv_idx // block_size]
        return (pos >= 0) & (pos * block_size + kv_idx % block_size < lens_p[b])

    return BlockMask.from_kv_blocks(torch.ones(rows, 1, 1, dtype=torch.int32, device=dev), last,
                                    (blocks - 1).to(torch.int32).view(rows, 1, 1), full,
                                    BLOCK_SIZE=(Q_TILE, block_size), mask_mod=inside,
                                    seq_lengths=(1, num_blocks * block_size), compute_q_blocks=False)


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: BlockMask, scale: float,
           compiled: bool = True) -> torch.Tensor:
    """q [n, heads, d] against the pool [blocks, block_size, kv_heads, d] under `mask` (rows >= n) -> [n, heads, d].
    compiled=False: flex's unfused implementation (it materializes every score over the whole pool: tests only)."""
    n, heads, d = q.shape
    rows = mask.kv_num_blocks.shape[0]
    slots, kv_heads = k_cache.shape[0] * k_cache.shape[1], k_cache.shape[2]
    qp = q.new_zeros(rows, heads, 1, d)
    qp[:n, :, 0] = q
    keys = k_cache.view(1, slots, kv_heads, d).transpose(1, 2)  # [1, kv_heads, slots, d]: a view of the pool
    values = v_cache.view(1, slots, kv_heads, d).transpose(1, 2)
    fn = _compiled_fn() if compiled else flex_attention
    return fn(qp, keys, values, block_mask=mask, scale=scale, enable_gqa=True)[:n, :, 0]


def paged_attention(q, k_cache, v_cache, tables, lens, scale: float, meta=None) -> torch.Tensor:
    """What paged_cpu.paged_decode computes (every query over its table's first lens tokens), compiled; the mask is
    built once a step and kept in `meta.scratch` for the other layers. A bucket's first real call is also computed by
    gathering, and a bucket that disagrees is dropped for good (its steps gather): the compiled kernel is checked
    on the device's own compiler and on real K/V, once."""
    mask = meta.scratch.get("flex_mask") if meta is not None else None
    if mask is None:
        mask = block_mask(tables.to(torch.int64), lens.to(torch.int64), k_cache.shape[0], k_cache.shape[1],
                          bucket(q.shape[0]))
        if meta is not None:
            meta.scratch["flex_mask"] = mask
    out = attend(q, k_cache, v_cache, mask, scale)
    key = _key(k_cache, q.shape[1], q.shape[0])
    if key not in _checked:  # its first CHECKED queries (a gather of every context could be gigabytes)
        want = reference(q[:CHECKED], k_cache, v_cache, tables[:CHECKED], lens[:CHECKED], scale)
        err = (out[:CHECKED].float() - want.float()).abs().max().item()
        _checked.add(key)
        if not err <= (1e-4 if q.dtype == torch.float32 else 2e-2):
            _ready.discard(key)
            status[pool_key(k_cache, q.shape[1])] = f"failed: {bucket(q.shape[0])} queries differ by {err:.2e}"
            return torch.cat([want, reference(q[CHECKED:], k_cache, v_cache, tables[CHECKED:], lens[CHECKED:],
                                              scale)]) if q.shape[0] > CHECKED else want
    return out


def reference(q, k_cache, v_cache, tables, lens, scale: float) -> torch.Tensor:
    """The same attention by gathering each query's blocks, in fp32, each KV head's group of query heads against
    it (the first-use check, and tests)."""
    n, heads, d = q.shape
    kv_heads = k_cache.shape[2]
    keys = k_cache[tables].reshape(n, -1, kv_heads, d).float()
    values = v_cache[tables].reshape(n, -1, kv_heads, d).float()
    scores = torch.einsum("nkgd,nskd->nkgs", q.float().view(n, kv_heads, heads // kv_heads, d), keys) * scale
    past = torch.arange(keys.shape[1], device=q.device) >= lens.to(q.device)[:, None, None, None]
    out = torch.einsum("nkgs,nskd->nkgd", scores.masked_fill(past, float("-inf")).softmax(-1), values)
    return out.reshape(n, heads, d).to(q.dtype)


def _compiled_fn():
    if not _compiled:
        with _lock:
            if not _compiled:
                import torch._dynamo
                # one compiled shape per (pool, bucket): an engine and its isolated() twins need more than dynamo's
                # default of 8 before it silently falls back to the unfused reference
                torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
                _compiled.append(torch.compile(flex_attention, dynamic=False))
    return _compiled[0]


def warm(k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int, scale: float, most: int,
         block_size: int, stop: threading.Event | None = None) -> str:
    """Compile every bucket up to `most` queries for this pool (one call each on random queries); each joins
    `ready` as it is done. `stop` set: no further bucket (the engine is closing, and its pool must go). Returns
    the status."""
    pool = pool_key(k_cache, heads)
    sizes = [b for b in BUCKETS if b < 2 * max(most, 1)][:len(BUCKETS)] or [BUCKETS[0]]
    dev, start = k_cache.device, time.perf_counter()
    try:
        for i, size in enumerate(sizes):
            if stop is not None and stop.is_set():
                status[pool] = f"stopped after {i} of {len(sizes)}: the engine closed"
                return status[pool]
            status[pool] = f"compiling {i + 1}/{len(sizes)}"
            lens = torch.randint(1, 3 * block_size, (size,), device=dev)
            tables = torch.randint(0, k_cache.shape[0], (size, 3), device=dev)
            q = torch.randn(size, heads, k_cache.shape[-1], device=dev, dtype=k_cache.dtype)
            attend(q, k_cache, v_cache, block_mask(tables, lens, k_cache.shape[0], block_size, size), scale)
            _ready.add(pool + (size,))
        status[pool], compile_s[pool] = "ready", time.perf_counter() - start
    except Exception as e:  # no compiler for this device: the engine keeps gathering, and says why
        status[pool] = f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
    return status[pool]


def warm_async(k_cache, v_cache, heads: int, scale: float, most: int, block_size: int,
               stop: threading.Event) -> threading.Thread:
    """warm() on a daemon thread: the engine serves (gathering) while it compiles."""
    status[pool_key(k_cache, heads)] = "compiling"
    t = threading.Thread(target=warm, args=(k_cache, v_cache, heads, scale, most, block_size, stop),
                         name="minivlm-flex-compile", daemon=True)
    t.start()
    return t
