"""Decode products with int8 weights (gemv_int8.c), called through ctypes: quantized.Int8Linear sends fp32 inputs of
at most gemv.MAX_ROWS rows here when the calibration at load found it faster than PyTorch's int8 kernel."""
import ctypes
import os

import torch

from minivlm.model.backends.cpu_kernels.c_build import LazyKernels

_p, _i = ctypes.c_void_p, ctypes.c_int64
KERNELS = LazyKernels(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemv_int8.c"),
                      {"gemv_int8": [_p, _p, _p, _p, _p, _i, _i, _i, ctypes.c_int]})


def linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(x @ q.T) * scale + bias for fp32 x of a few rows, q int8 [out, in] contiguous, scale fp32 [out]."""
    out_features, in_features = q.shape
    flat = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, in_features).contiguous()
    y = torch.empty(flat.shape[0], out_features, dtype=torch.float32)
    KERNELS.get().gemv_int8(flat.data_ptr(), q.data_ptr(), scale.data_ptr(),
                            bias.data_ptr() if bias is not None else None, y.data_ptr(), flat.shape[0], out_features,
                            in_features, torch.get_num_threads())
    return y if flat is x else y.reshape(*x.shape[:-1], out_features)
