"""The model backends, and the one place that picks them: once, when an engine is built (pick) or a model is loaded
(prepare_linears). The reference (model/) runs everywhere; a backend runs the same arithmetic faster where it
serves, and says so in words (Engine.decode_backend, attention_backend, linear_backend: the status line).

    cpu_kernels/  CPU, fp32: C kernels for attention in place, a whole decode step, the small ops, small matmuls;
                  bf16 (bf16_step.py): the whole decode step over bf16 weights and pool
    flash.py      CUDA, fp16/bf16, pages of 256 tokens: flash-attn's paged kernels
    flex.py       CUDA (or where MINIVLM_FLEX names): FlexAttention in place, compiled in the background
    base.py       the interface: Attention (the reference's, as a backend), Backend (the step) and Hooks (a step
                  that replaces parts of the decoder's loop), Limits, Said, WORDS

The registry is two lists of classes, best first: the attention every layer calls (ATTENTION) and the step around
it (STEP). pick asks each class made for the model's device and dtype (runs_on) whether it serves this engine
(serves: None, or why not), and makes the first that does; where none does, the reference, saying the first
reason it was given. A new backend is one more class behind this interface (base.py), named in its list. Modules
are imported when asked, so an engine loads only the kernels it may run."""
import importlib

import torch

from minivlm.model.backends import quantized
from minivlm.model.backends.base import WORDS, Attention, Backend, Hooks, Limits, Said

__all__ = ["pick", "prepare_linears", "quantized", "Attention", "Backend", "Hooks", "Limits", "Said", "WORDS"]
ATTENTION = ("cpu_kernels.PagedCpu", "flash.FlashAttention", "flex.FlexAttention")  # best first
STEP = ("cpu_kernels.CpuKernels", "cpu_kernels.bf16_step.Bf16Step")  # best first; else the reference


def _class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(f"minivlm.model.backends.{module}"), name)


def cpu_fp32(device, dtype) -> bool:
    return torch.device(device).type == "cpu" and dtype == torch.float32


def first_that_serves(registry: tuple[str, ...], model, config) -> tuple[type | None, dict]:
    """The first class of the registry made for this model's device and dtype that serves this engine (None if
    none does), and why each one asked before it did not ({name: why}, in the order asked)."""
    passed_over = {}
    for cls in map(_class, registry):
        if cls.runs_on(model, config):
            why = cls.serves(model, config)
            if why is None:
                return cls, passed_over
            passed_over[cls.name] = why
    return None, passed_over


def pick(model, config, kv_caches) -> Backend:
    """The backend of an engine on `model` (a LoadedModel) with `config` (an EngineConfig) over its pool's
    [(k_cache, v_cache)] per layer (FlexAttention starts compiling for it here). Its `passed_over` says why each
    class asked before the picked ones did not serve ({name: why})."""
    if getattr(model.decoder, "layer_specs", None):  # a hybrid model: the reference, group by group
        return Backend(Attention(Said("engine.why_hybrid")),
                       Said("engine.decode_torch", why=Said("engine.decode_hybrid")))
    cls, attention_passed = first_that_serves(ATTENTION, model, config)
    attention = cls.make(model, config, kv_caches) if cls else Attention(next(iter(attention_passed.values()), ""))
    cls, step_passed = first_that_serves(STEP, model, config)
    if cls is not None:
        backend = cls.make(model, config, attention, kv_caches)
    else:
        why = next(iter(step_passed.values()), None) or Said(  # else no step is made for this device and dtype
            "engine.decode_quantized" if getattr(model, "quantization", None) else "engine.decode_not_cpu")
        backend = Backend(attention, Said("engine.decode_torch", why=why))
    backend.passed_over = attention_passed | step_passed
    return backend


def prepare_linears(module, device, dtype, small_batches: bool = False) -> Said:
    """Give a loaded module's linear layers the device's linear backend (the CPU's in fp32: oneDNN prepacked, and
    with small_batches gemv.c for decode batches); returns which, in words. Elsewhere they stay nn.Linear."""
    if cpu_fp32(device, dtype):
        return importlib.import_module("minivlm.model.backends.cpu_kernels").prepare_linears(module, small_batches)
    return Said("engine.linear_default")
