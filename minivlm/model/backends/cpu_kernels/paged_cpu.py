"""Decode attention that reads the paged KV pool in place on the CPU (paged_decode.c, called through ctypes): every
query over the first `len` tokens of its block table, where they lie, with no copy of any context."""
import ctypes
import os

import torch

from minivlm.model.backends.cpu_kernels.c_build import LazyKernels

_p, _i = ctypes.c_void_p, ctypes.c_int64
KERNELS = LazyKernels(os.path.join(os.path.dirname(os.path.abspath(__file__)), "paged_decode.c"), {
    "paged_decode_f32": [_p, _i, _p, _p, _p, _i, _p, _p, _i, _i, _i, _i, _i, ctypes.c_float, ctypes.c_int]})


def paged_decode(q, k_cache, v_cache, block_tables, ctx_lens, scale: float, fn=None) -> torch.Tensor:
    """q [B, heads, d] (one token per sequence; rows may be strided), caches [blocks, block_size, kv_heads, d],
    block_tables [B, width], ctx_lens [B] (any integer dtype) -> [B, heads, d]. fn: another build (tests)."""
    bsz, heads, d = q.shape
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    tables, lens = block_tables.to(torch.int64).contiguous(), ctx_lens.to(torch.int64).contiguous()  # int32 too
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the kernel indexes the pool as one dense array"
    out = torch.empty(bsz, heads, d, dtype=q.dtype)
    (fn or KERNELS.get().paged_decode_f32)(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                           tables.data_ptr(), tables.shape[1], lens.data_ptr(), out.data_ptr(), bsz,
                                           heads, k_cache.shape[2], d, k_cache.shape[1], scale,
                                           torch.get_num_threads())
    return out
