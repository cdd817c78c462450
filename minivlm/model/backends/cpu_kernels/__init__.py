"""The CPU fp32 backend: C kernels (README.md) built once with the system's compiler while the weights load, and
chosen once when the engine is built. Attention reads the pool in place (paged_decode.c); a step of up to 16 rows
runs every layer in one C call (decode_layer.c); a larger one runs layer by layer with the small ops fused
(decode_ops.c); the decoder's linear layers run oneDNN with gemv.c for small batches (linears.py). Each part
falls back to the reference (and the status line says why) where its kernel does not build or its switch is 0:
MINIVLM_PAGED_CPU, MINIVLM_DECODE_LAYER, MINIVLM_DECODE_OPS (both), MINIVLM_GEMV (read at load)."""
import functools
import os

import torch

from minivlm.model.backends.base import Attention, Backend, Hooks, Limits, Said
from minivlm.model.backends.cpu_kernels import decode_layer, decode_ops, gemv, gemv_int8, linears, paged_cpu
from minivlm.model.backends.in_place import InPlaceAttention


def start():
    """Build every kernel on background threads (the loader: they compile while the weights load)."""
    for kernels in (gemv.KERNELS, gemv_int8.KERNELS, paged_cpu.KERNELS, decode_ops.KERNELS, decode_layer.KERNELS,
                    decode_layer.KERNELS_INT8, decode_layer.KERNELS_INT4):
        kernels.start()


def off(switch: str, kernels) -> str | None:
    """None if the kernels are on and built (waits for a build in progress), else why not."""
    if os.environ.get(switch, "1") == "0":
        return f"{switch}=0"
    return None if kernels.get() is not None else kernels.error


def threads(kernels) -> str:
    """"" where the kernels run a thread team, else why they run on one thread (no OpenMP)."""
    why = getattr(kernels.get(), "no_openmp", None)
    return Said("engine.one_thread", why=why) if why else ""


def prepare_linears(module, small_batches: bool) -> Said:
    """The linear backend of a module loaded on the CPU in fp32 (linears.py), in words."""
    start()
    if not linears.ONEDNN:  # other CPUs (Apple silicon) keep nn.Linear
        return Said("engine.linear_default")
    why = linears.prepare(module, small_batches, off("MINIVLM_GEMV", gemv.KERNELS))
    if why:
        return Said("engine.linear_onednn", why=why)
    return Said("engine.linear_gemv", rows=gemv.MAX_ROWS, threads=threads(gemv.KERNELS))


class PagedCpu(InPlaceAttention):
    """Attention that reads the pool in place on the CPU in fp32 (paged_decode.c)."""
    name = "paged_decode.c"

    @classmethod
    def runs_on(cls, model, config) -> bool:
        return torch.device(model.device).type == "cpu"

    @classmethod
    def serves(cls, model, config) -> Said | None:
        if model.dtype != torch.float32:
            return Said("engine.why_kernel", why=Said("engine.fp32_only"))
        why = off("MINIVLM_PAGED_CPU", paged_cpu.KERNELS)
        return None if why is None else Said("engine.why_kernel", why=why)

    def in_place(self, q, k_cache, v_cache, tables, lens, scale: float, meta=None) -> torch.Tensor:
        return paged_cpu.paged_decode(q, k_cache, v_cache, tables, lens, scale)

    def describe(self) -> Said:
        return Said("engine.attn_inplace", threads=threads(paged_cpu.KERNELS))


class CpuKernels(Hooks):
    """The step on the CPU in fp32: decode_layer.c for steps of up to 16 rows (the decoder's whole_step hook, where
    `one_call`), else decode_ops.c's fused small ops layer by layer (its layers hook)."""
    name = "cpu_kernels"

    @classmethod
    def runs_on(cls, model, config) -> bool:
        return torch.device(model.device).type == "cpu" and model.dtype == torch.float32

    @classmethod
    def serves(cls, model, config) -> Said | None:
        if config.enforce_eager:
            return "enforce_eager"
        why = off("MINIVLM_DECODE_OPS", decode_ops.KERNELS)
        return None if why is None else Said("engine.why_decode_ops_off", why=why)

    @classmethod
    def make(cls, model, config, attention: Attention, kv_caches) -> Backend:
        """The fused ops, and the one call where its kernels, the attention and the weights allow; quantized int8
        weights and dense fp32 ones then timed against PyTorch's ops (calibrate.py)."""
        from minivlm.model.backends import calibrate
        kind = decode_layer.weights_kind(model.decoder)
        why = off("MINIVLM_DECODE_LAYER", decode_layer.KERNELS) or off("MINIVLM_GEMV", gemv.KERNELS)
        if why is None and not isinstance(attention, PagedCpu):  # the C step attends with paged_decode.c
            why = off("MINIVLM_PAGED_CPU", paged_cpu.KERNELS) or "the attention is not paged_decode.c"
        if why is None and kind is None:
            why = Said("engine.no_dense_weights")
        if why is None and kind in ("int8", "int4"):  # quantized layers: their own build
            why = off("MINIVLM_DECODE_LAYER", decode_layer.kernels_of(kind))
        kernels = cls(attention, model.decoder, why)
        quantization = getattr(model, "quantization", None)
        if quantization == "int8":  # which int8 kernel runs decode rows
            return calibrate.choose_int8(kernels, model.decoder, kv_caches, config.block_size)
        if quantization:  # int4: the C step over int4 weights or the fused ops around PyTorch's kernel
            return calibrate.choose_int4(kernels, model.decoder, kv_caches, config.block_size)
        return calibrate.choose(kernels, model.decoder, kv_caches, config.block_size)

    def __init__(self, attention: Attention, decoder, no_one_call: str | None):
        self.one_call = no_one_call is None
        decode = Said("engine.decode_layer", rows=gemv.MAX_ROWS, threads=threads(decode_layer.KERNELS)) \
            if self.one_call else Said("engine.decode_ops", why=no_one_call, threads=threads(decode_ops.KERNELS))
        super().__init__(attention, decode)
        self.limits = Limits(fast_rows=gemv.MAX_ROWS if self.one_call else None)
        self.step_weights = decode_layer.StepWeights.of_decoder(decoder) if self.one_call else None  # the call's
        self.layers = [functools.partial(fused_layer, layer, i == 0) for i, layer in enumerate(decoder.layers)]
        self.decoder = decoder

    def layer_by_layer(self, why: str) -> "CpuKernels":
        """The same backend without the one call (`why` says why): calibrate.choose_int8's other candidate."""
        return CpuKernels(self.attention, self.decoder, why)

    def whole_step(self, decoder, embeds, positions, kv_caches, meta, last) -> torch.Tensor | None:
        """A decode step of a few sequences: every layer, the final norm, the logits in one call."""
        step = decode_layer.prepare(embeds, meta) if self.one_call else None
        if step is None:
            return None
        cos, sin = decoder.rope(positions, embeds.dtype)
        x = embeds.clone()  # the call adds into x in place: never into the caller's
        return decode_layer.run(self.step_weights, x, cos, sin, kv_caches, step,
                                *((decoder.lm_head, last) if last is not None else ()))


def fused_layer(layer, first: bool, x, cos, sin, kv_cache, meta) -> torch.Tensor:
    """DecoderLayer.forward in decode_ops.c's calls: norm; qkv; q/k norm, RoPE and the K/V write in one call (in
    place on qkv); attention; o; the residual add inside the second norm's call (in place on x: the first layer's
    on a copy, never on the caller's embeddings); the MLP."""
    attn, mlp, norm1, norm2 = layer.self_attn, layer.mlp, layer.input_layernorm, layer.post_attention_layernorm
    if first:
        x = x.clone()
    T, h, kv = x.shape[0], attn.heads, attn.kv_heads
    qkv = attn.qkv_proj(decode_ops.rms_norm(x, norm1.weight, norm1.eps)).view(T, h + 2 * kv, attn.head_dim)
    norms = (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps) if attn.q_norm is not None else ()
    decode_ops.rope_store(qkv, cos, sin, h, kv_cache[0], kv_cache[1], meta.slot_mapping, *norms)
    o = meta.attention.attend(qkv[:, :h], qkv[:, h:h + kv], qkv[:, h + kv:], kv_cache[0], kv_cache[1], meta,
                              attn.head_dim ** -0.5)
    h2 = decode_ops.rms_norm(x, norm2.weight, norm2.eps, delta=attn.o_proj(o.reshape(T, -1)))
    return x.add_(mlp.down_proj(decode_ops.silu_mul(mlp.gate_up_proj(h2))))
