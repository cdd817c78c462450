"""The CPU fp32 matrix products of decode batches of up to MAX_ROWS sequences (gemv.c), called through ctypes.
linears.py sends inputs of at most MAX_ROWS rows here where it kept a dense weight (the kernel reads [out, in])."""
import ctypes
import os

import torch

from minivlm.model.backends.cpu_kernels.c_build import LazyKernels

MAX_ROWS = 16  # measured here (bench.decode_linears): ahead of oneDNN's prepacked GEMM up to 16 rows, behind at 32
_p, _i = ctypes.c_void_p, ctypes.c_int64
KERNELS = LazyKernels(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemv.c"),
                      {"gemv_f32": [_p, _p, _p, _p, _i, _i, _i, ctypes.c_int]})


def kernel_variant(*defines: str):
    """The kernel built with extra -D flags, e.g. GEMV_NO_512: the 8-wide (AVX2) tile on an AVX-512 CPU (the tests
    and bench.decode_linears check and time it beside the default build)."""
    return KERNELS.variant(*defines).gemv_f32


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fn=None) -> torch.Tensor:
    """F.linear(x, weight, bias) for fp32 CPU tensors, x of at most a few rows; weight dense [out, in]. fn: a
    kernel_variant instead of the default build."""
    out_features, in_features = weight.shape
    flat = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, in_features).contiguous()  # decode: as is
    y = torch.empty(flat.shape[0], out_features, dtype=x.dtype)
    (fn or KERNELS.get().gemv_f32)(flat.data_ptr(), weight.data_ptr(), bias.data_ptr() if bias is not None else None,
                                   y.data_ptr(), flat.shape[0], out_features, in_features, torch.get_num_threads())
    return y if flat is x else y.reshape(*x.shape[:-1], out_features)
