"""Pick the device and dtype (cuda > mps > cpu) and ask each kind of device how much memory it has."""
import os

os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")  # ops MPS lacks fall back to CPU instead of failing

import torch  # noqa: E402

from minivlm.config import DEFAULT_MODEL  # noqa: E402
from minivlm.model.backends.base import Said  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def available_devices() -> dict[str, str | None]:
    """Each device kind -> None if usable, else the reason it is not (a Said: English with its message id)."""
    mps = getattr(torch.backends, "mps", None)
    return {
        "cuda": None if torch.cuda.is_available() else Said("engine.no_cuda"),
        "mps": None if mps is not None and mps.is_available() else Said("engine.no_mps"),
        "cpu": None,
    }


def pick_device(name: str = "auto", model: str | None = None) -> torch.device:
    """auto = cuda > mps > cpu, except that the shipped tiny model skips mps (its steps are too small for the GPU
    to pay off, and the CPU path is the tested one); an explicit but unavailable device is a clear error."""
    avail = available_devices()
    if name == "auto":
        tiny = model is not None and os.path.abspath(model) == os.path.abspath(DEFAULT_MODEL)
        name = next(k for k in ("cuda", "mps", "cpu") if avail[k] is None and not (tiny and k == "mps"))
    if name not in avail:
        raise ValueError(f"unknown device {name!r}; choose auto, cuda, mps or cpu")
    if avail[name] is not None:
        raise ValueError(f"device {name!r} is not available: {avail[name]}")
    return torch.device(name)


# A CPU decode step reads every weight once: at 1 GiB of weights and a desktop's 20-35 GB/s the bandwidth bound is
# 20-35 tokens a second and a step reaches about half of it (bench/RESULTS.md: the 234 MB checkpoint, 26-72 % of
# its bound), so from here on a GPU is worth saying; below it (the tiny model, small test checkpoints, SmolVLM2-256M
# in fp32) the CPU is quick enough to say nothing.
SLOW_ON_CPU_BYTES = 2**30


def cpu_fallback_warning(device: str | torch.device, weights_bytes: int) -> str | None:
    """What to tell someone whose --device auto found no GPU: a warning when the engine runs on the CPU with at
    least SLOW_ON_CPU_BYTES of weights (their size and the threshold said), else None."""
    why = available_devices()["cuda"]
    if torch.device(device).type != "cpu" or weights_bytes < SLOW_ON_CPU_BYTES or why is None:
        return None
    return (f"minivlm: warning: --device auto found no GPU ({why}): running on cpu, which is slow for this model "
            f"({weights_bytes / 2**30:.1f} GiB of weights, each read once a token; slow from "
            f"{SLOW_ON_CPU_BYTES / 2**30:.0f} GiB)")


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on CUDA with compute capability >= 8, fp16 on older CUDA and on MPS, fp32 on CPU."""
    if name != "auto":
        if name not in TORCH_DTYPES:
            raise ValueError(f"unknown dtype {name!r}; choose auto, float32, bfloat16 or float16")
        return TORCH_DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def free_memory_bytes(device: torch.device, cpu_budget: int) -> int:
    """Memory the engine may plan with: CUDA free memory, MPS recommended working set, CPU a fixed budget."""
    if device.type == "cuda":  # torch's cached-but-unused memory is as good as free for our allocations
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory()) - int(torch.mps.driver_allocated_memory())
    return cpu_budget


def peak_bytes(device: torch.device) -> int | None:
    """Peak bytes allocated so far, where the device can tell (None on CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type == "mps":
        return int(torch.mps.driver_allocated_memory())
    return None
