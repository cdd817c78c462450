"""Decode products with int8 weights (gemv_int8.c), called through ctypes: quantized.Int8Linear sends fp32 inputs of
at most gemv.MAX_ROWS rows here when the calibration at load found it faster than PyTorch's int8 kernel. On x86 with
AVX2 the inputs are quantized to int8 in blocks of 32 on the way in (q8_activations.h), as llama.cpp's Q8_0 does."""
import ctypes
import os

import torch

from minivlm.model.backends.cpu_kernels.c_build import LazyKernels

_p, _i = ctypes.c_void_p, ctypes.c_int64
KERNELS = LazyKernels(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemv_int8.c"),
                      {"gemv_int8": [_p, _p, _p, _p, _p, _i, _i, _i, ctypes.c_int], "q8_activations": [_p]})
Q8_BLOCK = 32  # q8_activations.h: input values a scale, where the build takes int8 inputs


def q8_activations() -> bool:
    """Whether this build multiplies int8 weights by int8 inputs (x86 with AVX2) where the width is a multiple of
    Q8_BLOCK; elsewhere each weight is widened to a float."""
    lib, on = KERNELS.get(), ctypes.c_int(0)
    if lib is not None:
        lib.q8_activations(ctypes.byref(on))
    return bool(on.value)


def q8_reference(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel multiplies it (float64): each block of Q8_BLOCK values rounded to int8 steps of max |x| / 127
    (llama.cpp's Q8_0 activations), where q8_activations() and the width apply; else x."""
    rows, n = x.shape
    if not q8_activations() or n % Q8_BLOCK:
        return x.double()
    blocks = x.double().reshape(rows, n // Q8_BLOCK, Q8_BLOCK)
    step = (blocks.float().abs().amax(-1, keepdim=True) / 127).double()  # the kernel's scale is an fp32 number
    return torch.where(step > 0, torch.round(blocks / step) * step, torch.zeros_like(blocks)).reshape(rows, n)


def linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(x @ q.T) * scale + bias for fp32 x of a few rows, q int8 [out, in] contiguous, scale fp32 [out]."""
    out_features, in_features = q.shape
    flat = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, in_features).contiguous()
    y = torch.empty(flat.shape[0], out_features, dtype=torch.float32)
    KERNELS.get().gemv_int8(flat.data_ptr(), q.data_ptr(), scale.data_ptr(),
                            bias.data_ptr() if bias is not None else None, y.data_ptr(), flat.shape[0], out_features,
                            in_features, torch.get_num_threads())
    return y if flat is x else y.reshape(*x.shape[:-1], out_features)
