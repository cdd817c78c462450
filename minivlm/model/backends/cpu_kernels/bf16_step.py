"""A bf16 engine's decode step on the CPU: decode_layer.c over the bf16 weights and the bf16 pool in one C call
(decode_layer_bf16.c; int8 weights, quantization="int8": decode_layer_int8_bf16.c), for decode steps of 1 to
gemv.MAX_ROWS sequences. A step reads two bytes a weight, as llama.cpp's F16 does; PyTorch's bf16 ops on a CPU
without native bf16 convert each weight on its way through oneDNN or MKL and ran 0.37-0.43x llama.cpp F16 on the
348M bench checkpoint (bench/RESULTS.md, sessions 18-20).

Between the reads the step computes in fp32: norms, RoPE, attention and the residual stream stay fp32 inside the
call, and only what leaves it is rounded to bf16 (each K/V row written to the pool, the final hidden state before
the lm_head). HF's bf16 model rounds after every op, so a decode step here is closer to fp32 than HF bf16's is
(tests/test_bf16_step.py). Prompts, long or short, run PyTorch's bf16 ops as HF does: what a prompt leaves in the
pool is HF bf16's."""
import torch

from minivlm.model.backends.base import Backend, Said
from minivlm.model.backends.cpu_kernels import decode_layer, gemv

SWITCH = "MINIVLM_DECODE_LAYER"  # 0: PyTorch's bf16 ops for every step (the same switch as the fp32 C step's)


class Bf16Step(Backend):
    """Decode steps of a few sequences in one C call; everything else (prompts, larger batches) the reference."""

    def __init__(self, attention, threads: str = "", weights: str = "bf16"):
        super().__init__(attention, Said("engine.decode_layer_bf16", rows=gemv.MAX_ROWS, weights=weights,
                                         threads=threads))
        self.weights = weights

    def describe(self) -> dict[str, Said]:  # decode attention runs inside the call; the reference's serves prompts
        return {"decode": self.decode, "attention": Said("engine.attn_bf16_step")}

    def forward(self, decoder, embeds, positions, kv_caches, meta, deepstack=None, last=None):
        step = None if meta.is_prefill or deepstack is not None else decode_layer.prepare(embeds, meta)
        if step is None:
            return decoder(embeds, positions, kv_caches, meta, deepstack, last)
        cos, sin = decoder.rope(positions, torch.float32)  # HF's tables are fp32 before its cast to bf16
        x = embeds.float()
        out = decode_layer.run(decoder.layers, decoder.norm, x, cos, sin, kv_caches, step).to(embeds.dtype)
        return out if last is None else decoder.compute_logits(out[last])  # the lm_head on bf16, as HF's


def backend(model, config, attention, kv_caches) -> Backend:
    """The C step where it builds and every layer has dense bf16 or int8 weights (then timed against PyTorch's bf16
    ops, calibrate.choose_bf16), else the reference, saying why."""
    from minivlm.model.backends import calibrate
    from minivlm.model.backends.cpu_kernels import off, threads
    if config.enforce_eager:
        return Backend(attention, Said("engine.decode_torch", why="enforce_eager"))
    layers = model.decoder.layers
    kernels = decode_layer.kernels_of(layers, torch.bfloat16) \
        if all(decode_layer.layer_struct(layer) is not None for layer in layers) else None
    if kernels is None:  # int4, or weights the step cannot read
        return Backend(attention, Said("engine.decode_torch", why=Said("engine.no_bf16_step_weights")))
    why = off(SWITCH, kernels)
    if why is not None:
        return Backend(attention, Said("engine.decode_torch", why=why))
    step = Bf16Step(attention, threads(kernels), layers[0]._c_kind)
    return calibrate.choose_bf16(step, model.decoder, kv_caches, config.block_size)
