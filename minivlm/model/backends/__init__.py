"""The model backends, and the one place that picks them: once, when an engine is built (pick) or a model is loaded
(prepare_linears). The reference (model/) runs everywhere; a backend runs the same arithmetic faster where it
serves, and says so in words (Engine.decode_backend, attention_backend, linear_backend: the status line).

    cpu_kernels/  CPU, fp32: C kernels for attention in place, a whole decode step, the small ops, small matmuls;
                  bf16 (bf16_step.py): the whole decode step over bf16 weights and pool
    flash.py      CUDA, fp16/bf16, pages of 256 tokens: flash-attn's paged kernels
    flex.py       CUDA (or where MINIVLM_FLEX names): FlexAttention in place, compiled in the background
    base.py       the interface: Attention (the reference's, as a backend) and Backend (the step), Limits, Said

Each attention module's attention(model, config, kv_caches) returns an Attention, a reason (a Said) it does not
serve this engine, or None where it does not apply; the first that serves is picked, else the reference with the
first reason. Modules are imported when asked, so an engine loads only the kernels it may run."""
import importlib

import torch

from minivlm.model.backends import quantized
from minivlm.model.backends.base import WORDS, Attention, Backend, Limits, Said

__all__ = ["pick", "prepare_linears", "quantized", "Attention", "Backend", "Limits", "Said", "WORDS"]
ATTENTION = ("cpu_kernels", "flash", "flex")  # best first


def _module(name: str):
    return importlib.import_module(f"minivlm.model.backends.{name}")


def cpu_fp32(device, dtype) -> bool:
    return torch.device(device).type == "cpu" and dtype == torch.float32


def pick(model, config, kv_caches) -> Backend:
    """The backend of an engine on `model` (a LoadedModel) with `config` (an EngineConfig) over its pool's
    [(k_cache, v_cache)] per layer (FlexAttention starts compiling for it here)."""
    if getattr(model.decoder, "layer_specs", None):  # a hybrid model: the reference, group by group
        return Backend(Attention(Said("engine.why_hybrid")), Said("engine.decode_torch", why=Said("engine.decode_hybrid")))
    reasons = []
    for name in ATTENTION:
        got = _module(name).attention(model, config, kv_caches)
        if isinstance(got, Attention):
            attention = got
            break
        reasons += [got] if got else []
    else:
        attention = Attention(reasons[0] if reasons else "")
    if cpu_fp32(model.device, model.dtype):  # quantized: the fused small ops around PyTorch's int8 / int4 products
        kernels = _module("cpu_kernels").backend(model, config, attention)
        if config.enforce_eager or type(kernels) is Backend:
            return kernels  # asked for PyTorch's ops, or the C step is off
        if getattr(model, "quantization", None) == "int8":  # which int8 kernel runs decode rows
            return _module("calibrate").choose_int8(kernels, model.decoder, kv_caches, config.block_size)
        if getattr(model, "quantization", None):
            return kernels
        return _module("calibrate").choose(kernels, model.decoder, kv_caches, config.block_size)
    if torch.device(model.device).type == "cpu" and model.dtype == torch.bfloat16:  # bf16 or int8 weights, one C call
        return _module("cpu_kernels.bf16_step").backend(model, config, attention, kv_caches)
    if getattr(model, "quantization", None):  # the fused C paths run on the CPU
        return Backend(attention, Said("engine.decode_torch", why=Said("engine.decode_quantized")))
    return Backend(attention, Said("engine.decode_torch", why=Said("engine.decode_not_cpu")))


def prepare_linears(module, device, dtype, small_batches: bool = False) -> Said:
    """Give a loaded module's linear layers the device's linear backend (the CPU's in fp32: oneDNN prepacked, and
    with small_batches gemv.c for decode batches); returns which, in words. Elsewhere they stay nn.Linear."""
    if cpu_fp32(device, dtype):
        return _module("cpu_kernels").prepare_linears(module, small_batches)
    return Said("engine.linear_default")
