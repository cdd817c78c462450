"""dtype="auto" on the CPU follows the checkpoint's saved dtype (issue #57), as transformers and vLLM do: bf16 for a
bf16 checkpoint, fp32 for an fp32 one such as the tiny model. Until then it was fp32, or bf16 where this CPU computes
bf16 natively (AVX512-BF16 or AMX) and a short timed product showed the halved bytes pay: a dtype the checkpoint was
not saved in, chosen differently from one CPU to the next, so the same model gave different numbers on two machines.
What is timed now is the path for the chosen dtype (calibrate.py: the C step against PyTorch's ops, per precision).
Quantized weights (int8 / int4) run in fp32: their products take bf16 inputs inside where PyTorch's weight-only
kernels run, and the layers' small ops and attention run the fused C kernels, which are fp32's. The choice and its
reason are the status line's (`engine.dtype_reason`)."""
import torch

from minivlm.model.backends.base import Said


def saved_dtype(hf_config, state_dict=None) -> torch.dtype | None:
    """The dtype the checkpoint was saved in, as transformers' and vLLM's dtype="auto" read it: the config's `dtype`
    (`torch_dtype` in older configs; the text config's where the outer one has none), else the first floating
    tensor's dtype among the weights; None where neither says."""
    for cfg in (hf_config, getattr(hf_config, "text_config", None)):
        for name in ("dtype", "torch_dtype"):
            value = getattr(cfg, name, None) if cfg is not None else None
            if isinstance(value, str):
                value = getattr(torch, value.removeprefix("torch."), None)
            if isinstance(value, torch.dtype) and value.is_floating_point:
                return value
    return next((t.dtype for t in (state_dict or {}).values() if torch.is_floating_point(t)), None)


def pick_cpu_dtype(text_config, quantization: str | None, saved: torch.dtype | None = None) -> tuple[torch.dtype, Said]:
    """The CPU's dtype for dtype="auto", and why in words: the checkpoint's saved dtype (issue #57, as transformers
    and vLLM do: bf16 for a bf16 checkpoint, fp32 for an fp32 one; fp16 becomes bf16, as vLLM's CPU backend does,
    since no x86 kernel here computes in fp16); quantized weights run in fp32. The load's calibration then picks the
    fastest path for that dtype (calibrate.py)."""
    if quantization:
        return torch.float32, Said("engine.dtype_quantized", method=quantization)
    if saved is None:
        return torch.float32, Said("engine.dtype_unsaved")
    name = str(saved).removeprefix("torch.")
    if saved == torch.float16:
        return torch.bfloat16, Said("engine.dtype_checkpoint_fp16")
    if saved in (torch.bfloat16, torch.float32):
        return saved, Said("engine.dtype_checkpoint", dtype=name)
    return torch.float32, Said("engine.dtype_checkpoint_other", dtype=name)
