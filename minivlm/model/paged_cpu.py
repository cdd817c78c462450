"""Decode attention that reads the paged KV pool in place on the CPU: paged_decode.c, compiled once with the
system's C compiler (about a second) into a per-user cache and called through ctypes. Where there is no compiler,
or the tensors are not fp32 on the CPU, `available` says no and attention.py gathers blocks as before."""
import ctypes
import os
import threading

import torch

from minivlm.model.c_build import build

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paged_decode.c")
ENABLED = os.environ.get("MINIVLM_PAGED_CPU", "1") != "0"  # 0 forces the gather path (comparisons, debugging)
_lock = threading.Lock()
_lib: list = []  # [] not tried yet, [None] unavailable, [fn] loaded
error: str | None = None  # why the kernel is unavailable, for the status line


def _build():
    """The compiled kernel, or None (and `error` set), so the engine falls back instead of failing a request."""
    global error
    lib, error = build(SOURCE)
    if lib is None:
        return None
    fn = lib.paged_decode_f32
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    fn.restype = None
    return fn


def kernel():
    """The loaded kernel function, or None (see `error`)."""
    if not _lib:
        with _lock:
            if not _lib:
                _lib.append(_build() if ENABLED else None)
    return _lib[0]


def available(q: torch.Tensor) -> bool:
    return ENABLED and q.device.type == "cpu" and q.dtype == torch.float32 and kernel() is not None


def paged_decode(q, k_cache, v_cache, block_tables, ctx_lens, scale: float) -> torch.Tensor:
    """q [B, heads, d] (one token per sequence; rows may be strided), caches [blocks, block_size, kv_heads, d],
    block_tables [B, width], ctx_lens [B] (any integer dtype) -> [B, heads, d]."""
    bsz, heads, d = q.shape
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    tables, lens = block_tables.to(torch.int64).contiguous(), ctx_lens.to(torch.int64).contiguous()  # int32 too
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the kernel indexes the pool as one dense array"
    out = torch.empty(bsz, heads, d, dtype=q.dtype)
    kernel()(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), tables.shape[1],
             lens.data_ptr(), out.data_ptr(), bsz, heads, k_cache.shape[2], d, k_cache.shape[1], scale,
             torch.get_num_threads())
    return out
