"""int4 weights for the C kernels (int4_weights.h): the nibble layout packed from quantized.Int4Linear's values, and
one product a call (gemv_int4.c) for the tests and bench.quantized_linears. The engine runs the same tiles inside
the one-call decode step (decode_layer_int4.c) where the load's calibration finds it faster than PyTorch's int4
kernel (calibrate.choose_int4)."""
import ctypes
import os

import torch

from minivlm.model.backends.cpu_kernels.c_build import LazyKernels

_p, _i = ctypes.c_void_p, ctypes.c_int64
KERNELS = LazyKernels(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemv_int4.c"),
                      {"gemv_int4": [_p, _p, _p, _i, _p, _p, _i, _i, _i, ctypes.c_int], "int4_path": [_p]})
CHUNK = 64  # weights a 32-byte chunk of the layout; a group must be a multiple
PATHS = {2: "AVX-512 VNNI", 1: "AVX2", 0: "portable C"}


def fits(in_features: int, group: int) -> bool:
    """Whether the kernels take a matrix of this width and group (Int4Linear's groups of 64 or 128 do)."""
    return in_features % CHUNK == 0 and group % CHUNK == 0 and in_features % group == 0


def path() -> str | None:
    """Which integer dot this build runs (PATHS), None where it did not build."""
    lib, which = KERNELS.get(), ctypes.c_int(0)
    if lib is None:
        return None
    lib.int4_path(ctypes.byref(which))
    return PATHS[which.value]


def pack(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [out, in] in 0..15, scale and minimum [out, in / group] (w = q * scale + minimum) -> (nibbles uint8
    [out, in / 2]: byte j of a 64-weight chunk holds weight j low and weight j + 32 high; fp32 [out, groups, 2])."""
    out, width = q.shape
    chunks = q.to(torch.uint8).reshape(out, width // CHUNK, 2, CHUNK // 2)
    nibbles = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(out, width // 2).contiguous()
    return nibbles, torch.stack([scale.float(), minimum.float()], -1).contiguous()


def unpack(nibbles: torch.Tensor, sm: torch.Tensor, group: int) -> torch.Tensor:
    """pack's weight back in fp32 [out, in]: q * scale + minimum (tests' and the calibration's reference)."""
    out, half = nibbles.shape
    chunks = nibbles.reshape(out, half // (CHUNK // 2), CHUNK // 2)
    q = torch.stack([chunks & 15, chunks >> 4], 2).reshape(out, 2 * half).float()  # a chunk: low nibbles, high ones
    return q * sm[..., 0].repeat_interleave(group, 1) + sm[..., 1].repeat_interleave(group, 1)


def q8_round(x: torch.Tensor) -> torch.Tensor:
    """x [rows, in] as the kernels multiply it: blocks of 32 rounded to int8 steps of max |x| / 127 (Q8_0;
    gemv_int8.q8_reference's numbers, on every build: the portable path quantizes too)."""
    rows, n = x.shape
    blocks = x.double().reshape(rows, n // 32, 32)
    step = (blocks.float().abs().amax(-1, keepdim=True) / 127).double()
    return torch.where(step > 0, torch.round(blocks / step) * step, torch.zeros_like(blocks)).reshape(rows, n)


def linear(x: torch.Tensor, nibbles: torch.Tensor, sm: torch.Tensor, group: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in] fp32 (a few rows) times the packed weight (pack), + bias: [rows, out]."""
    rows, width = x.shape
    x = x.contiguous()
    y = torch.empty(rows, nibbles.shape[0], dtype=torch.float32)
    KERNELS.get().gemv_int4(x.data_ptr(), nibbles.data_ptr(), sm.data_ptr(), group,
                            bias.data_ptr() if bias is not None else None, y.data_ptr(), rows, nibbles.shape[0],
                            width, torch.get_num_threads())
    return y
