"""The CPU fp32 matrix products of decode batches of up to MAX_ROWS sequences (gemv.c), called through ctypes. FastLinear sends
inputs of at most MAX_ROWS rows here when the kernel is built; `available` says no (and `error` why) otherwise."""
import ctypes
import os
import threading

import torch

from minivlm.model.c_build import build

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemv.c")
ENABLED = os.environ.get("MINIVLM_GEMV", "1") != "0"  # 0: oneDNN for every batch size (comparisons, debugging)
MAX_ROWS = 16  # measured here (bench.decode_linears): ahead of oneDNN's prepacked GEMM up to 16 rows, behind at 32
_lock = threading.Lock()
_lib: list = []  # [] not tried yet, [None] unavailable, [fn] loaded
error: str | None = None


def kernel():
    """The loaded kernel function, or None (see `error`)."""
    global error
    if not _lib:
        with _lock:
            if not _lib:
                lib, error = build(SOURCE) if ENABLED else (None, "MINIVLM_GEMV=0")
                _lib.append(_typed(lib) if lib is not None else None)
    return _lib[0]


def _typed(lib):
    fn = lib.gemv_f32
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes, fn.restype = [ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int], None
    return fn


def kernel_variant(*defines: str):
    """The kernel built with extra -D flags, e.g. GEMV_NO_512: the 8-wide (AVX2) tile on an AVX-512 CPU (the tests
    and bench.decode_linears check and time it beside the default build)."""
    lib, why = build(SOURCE, defines)
    if lib is None:
        raise RuntimeError(why)
    return _typed(lib)


def available() -> bool:
    return ENABLED and kernel() is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fn=None) -> torch.Tensor:
    """F.linear(x, weight, bias) for fp32 CPU tensors, x of at most a few rows; weight dense [out, in]. fn: a
    kernel_variant instead of the default build."""
    out_features, in_features = weight.shape
    flat = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, in_features).contiguous()  # decode: as is
    y = torch.empty(flat.shape[0], out_features, dtype=x.dtype)
    (fn or kernel())(flat.data_ptr(), weight.data_ptr(), bias.data_ptr() if bias is not None else None,
                     y.data_ptr(), flat.shape[0], out_features, in_features, torch.get_num_threads())
    return y if flat is x else y.reshape(*x.shape[:-1], out_features)
