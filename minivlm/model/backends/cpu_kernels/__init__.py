"""The CPU fp32 backend: C kernels (README.md) built once with the system's compiler while the weights load, and
chosen once when the engine is built. Attention reads the pool in place (paged_decode.c); a step of up to 16 rows
runs every layer in one C call (decode_layer.c); a larger one runs layer by layer with the small ops fused
(decode_ops.c); the decoder's linear layers run oneDNN with gemv.c for small batches (linears.py). Each part
falls back to the reference (and the status line says why) where its kernel does not build or its switch is 0:
MINIVLM_PAGED_CPU, MINIVLM_DECODE_LAYER, MINIVLM_DECODE_OPS (both), MINIVLM_GEMV (read at load)."""
import os

import torch

from minivlm.model.backends.base import Attention, Backend, Limits, Said
from minivlm.model.backends.cpu_kernels import decode_layer, decode_ops, gemv, gemv_int8, linears, paged_cpu
from minivlm.model.backends.in_place import InPlaceAttention


def start():
    """Build every kernel on background threads (the loader: they compile while the weights load)."""
    for kernels in (gemv.KERNELS, gemv_int8.KERNELS, paged_cpu.KERNELS, decode_ops.KERNELS, decode_layer.KERNELS,
                    decode_layer.KERNELS_INT8):
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
    def in_place(self, q, k_cache, v_cache, tables, lens, scale: float, meta=None) -> torch.Tensor:
        return paged_cpu.paged_decode(q, k_cache, v_cache, tables, lens, scale)

    def describe(self) -> Said:
        return Said("engine.attn_inplace", threads=threads(paged_cpu.KERNELS))


def attention(model, config, kv_caches) -> Attention | Said | None:
    if torch.device(model.device).type != "cpu":
        return None
    if model.dtype != torch.float32:
        return Said("engine.why_kernel", why=Said("engine.fp32_only"))
    why = off("MINIVLM_PAGED_CPU", paged_cpu.KERNELS)
    return PagedCpu() if why is None else Said("engine.why_kernel", why=why)


def backend(model, config, attention: Attention) -> Backend:
    """The step on the CPU in fp32: one C call, or fused small ops layer by layer, or (enforce_eager, or
    decode_ops.c off) the reference's PyTorch ops."""
    if config.enforce_eager:
        return Backend(attention, Said("engine.decode_torch", why="enforce_eager"))
    why = off("MINIVLM_DECODE_OPS", decode_ops.KERNELS)
    if why:
        return Backend(attention, Said("engine.decode_torch_off", why=why))
    why = off("MINIVLM_DECODE_LAYER", decode_layer.KERNELS) or off("MINIVLM_GEMV", gemv.KERNELS)
    if why is None and not isinstance(attention, PagedCpu):  # the C step attends with paged_decode.c
        why = off("MINIVLM_PAGED_CPU", paged_cpu.KERNELS) or "the attention is not paged_decode.c"
    if why is None and any(decode_layer.layer_struct(layer) is None for layer in model.decoder.layers):
        why = Said("engine.no_dense_weights")
    if why is None and decode_layer.kernels_of(model.decoder.layers) is decode_layer.KERNELS_INT8:
        why = off("MINIVLM_DECODE_LAYER", decode_layer.KERNELS_INT8)  # int8 layers: their own build
    return CpuKernels(attention, why)


class CpuKernels(Backend):
    """decode_ops.c's fused small ops layer by layer, and (one_call) decode_layer.c for steps of up to 16 rows."""

    def __init__(self, attention: Attention, no_one_call: str | None):
        self.one_call = no_one_call is None
        decode = Said("engine.decode_layer", rows=gemv.MAX_ROWS, threads=threads(decode_layer.KERNELS)) \
            if self.one_call else Said("engine.decode_ops", why=no_one_call, threads=threads(decode_ops.KERNELS))
        super().__init__(attention, decode)
        self.limits = Limits(fast_rows=gemv.MAX_ROWS if self.one_call else None)

    def forward(self, decoder, embeds, positions, kv_caches, meta, deepstack=None, last=None):
        """Decoder.forward, its layers' small ops fused (or the whole step in one C call where it fits)."""
        cos, sin = decoder.rope(positions, embeds.dtype)
        x = embeds.clone()  # the fused layers add into x in place: never into the caller's
        step = decode_layer.prepare(x, meta) if self.one_call and deepstack is None else None
        if step is not None:  # a decode step of a few sequences: every layer, the final norm, the logits in one call
            return decode_layer.run(decoder.layers, decoder.norm, x, cos, sin, kv_caches, step,
                                    *((decoder.lm_head, last) if last is not None else ()))
        for i, layer in enumerate(decoder.layers):
            x = fused_layer(layer, x, cos, sin, kv_caches[i], meta)
            if deepstack is not None and i < len(deepstack[1]):
                x = x.index_add(0, deepstack[0], deepstack[1][i].to(x.dtype))  # ViT layer features at image tokens
        x = decoder.norm(x)
        return x if last is None else decoder.compute_logits(x[last])


def fused_layer(layer, x, cos, sin, kv_cache, meta) -> torch.Tensor:
    """DecoderLayer.forward in decode_ops.c's calls: norm; qkv; q/k norm, RoPE and the K/V write in one call (in
    place on qkv); attention; o; the residual add inside the second norm's call (in place on x); the MLP."""
    attn, mlp, norm1, norm2 = layer.self_attn, layer.mlp, layer.input_layernorm, layer.post_attention_layernorm
    T, h, kv = x.shape[0], attn.heads, attn.kv_heads
    qkv = attn.qkv_proj(decode_ops.rms_norm(x, norm1.weight, norm1.eps)).view(T, h + 2 * kv, attn.head_dim)
    norms = (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps) if attn.q_norm is not None else ()
    decode_ops.rope_store(qkv, cos, sin, h, kv_cache[0], kv_cache[1], meta.slot_mapping, *norms)
    o = meta.attention.attend(qkv[:, :h], qkv[:, h:h + kv], qkv[:, h + kv:], kv_cache[0], kv_cache[1], meta,
                              attn.head_dim ** -0.5)
    h2 = decode_ops.rms_norm(x, norm2.weight, norm2.eps, delta=attn.o_proj(o.reshape(T, -1)))
    return x.add_(mlp.down_proj(decode_ops.silu_mul(mlp.gate_up_proj(h2))))
