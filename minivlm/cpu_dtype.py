"""dtype="auto" on the CPU: fp32, or bf16 where this CPU computes bf16 natively (AVX512-BF16 or AMX) and a short
calibration on the model's own largest matrix shows the halved bytes pay. A decode step reads every weight once, so
on a CPU whose oneDNN multiplies bf16 in hardware bf16 reads half the bytes for the same work; without those
instructions bf16 is emulated and slower (bench/RESULTS.md, session 16: 0.71x fp32 on an AMD EPYC without them).
Quantized weights (int8 / int4) run in fp32: their products take bf16 inputs inside (PyTorch's weight-only kernels
are fast with them only), and the layers' small ops and attention run the fused C kernels, which are fp32's. The
choice and its reason are the status line's."""
import time

import torch
import torch.nn.functional as F

from minivlm.model.backends.base import Said

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo's names for the instructions oneDNN's bf16 kernels use
MIN_BYTES = 16 * 2**20  # a largest matrix smaller than this (fp32) fits in caches: its step is overhead, not bytes
GAIN = 1.15             # bf16 is chosen only when it is this much faster (a calibration is a few timed products)


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def native_bf16(flags: set[str]) -> str | None:
    """The first native-bf16 instruction set this CPU has, if any."""
    return next((f for f in BF16_FLAGS if f in flags), None)


def largest_matrix(text_config) -> tuple[int, int]:
    """(out, in) of the decoder's largest matrix: the MLP's gate and up projections side by side."""
    hidden = text_config.hidden_size
    return 2 * getattr(text_config, "intermediate_size", 4 * hidden), hidden


def time_product(out: int, inp: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """Median seconds of one decode row times a random [out, in] weight in dtype (after two warm-up calls)."""
    w, x = torch.randn(out, inp).to(dtype), torch.randn(1, inp).to(dtype)
    times = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        F.linear(x, w)
        if i >= 2:
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def pick_cpu_dtype(text_config, quantization: str | None, flags: set[str] | None = None,
                   timer=time_product) -> tuple[torch.dtype, Said]:
    """The CPU's dtype for dtype="auto", and why in words."""
    if quantization:
        return torch.float32, Said("engine.dtype_quantized", method=quantization)
    flag = native_bf16(cpu_flags() if flags is None else flags)
    if flag is None:
        return torch.float32, Said("engine.dtype_no_bf16")
    out, inp = largest_matrix(text_config)
    if out * inp * 4 < MIN_BYTES:
        return torch.float32, Said("engine.dtype_small", mib=f"{out * inp * 4 / 2**20:.1f}")
    fp32, bf16 = timer(out, inp, torch.float32), timer(out, inp, torch.bfloat16)
    said = Said("engine.dtype_calibrated", flag=flag, bf16=f"{bf16 * 1e3:.2f}", fp32=f"{fp32 * 1e3:.2f}")
    return (torch.bfloat16 if bf16 * GAIN < fp32 else torch.float32), said
