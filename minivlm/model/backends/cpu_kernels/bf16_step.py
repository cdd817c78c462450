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

from minivlm.model.backends.base import Backend, Hooks, Said
from minivlm.model.backends.cpu_kernels import decode_layer, gemv, off, threads

SWITCH = "MINIVLM_DECODE_LAYER"  # 0: PyTorch's bf16 ops for every step (the same switch as the fp32 C step's)


class Bf16Step(Hooks):
    """Decode steps of a few sequences in one C call (the decoder's whole_step hook); everything else (prompts,
    larger batches) the reference's layers."""
    name = "bf16_step"

    @classmethod
    def runs_on(cls, model, config) -> bool:
        return torch.device(model.device).type == "cpu" and model.dtype == torch.bfloat16

    @classmethod
    def serves(cls, model, config) -> Said | None:
        """Where it builds and every layer has dense bf16 or int8 weights."""
        if config.enforce_eager:
            return "enforce_eager"
        kind = decode_layer.weights_kind(model.decoder)
        kernels = decode_layer.kernels_of(kind, torch.bfloat16) if kind else None
        if kernels is None:  # int4, or weights the step cannot read
            return Said("engine.no_bf16_step_weights")
        return off(SWITCH, kernels)

    @classmethod
    def make(cls, model, config, attention, kv_caches) -> Backend:
        """Timed against PyTorch's bf16 ops (calibrate.choose_bf16)."""
        from minivlm.model.backends import calibrate
        step = cls(attention, model.decoder)
        return calibrate.choose_bf16(step, model.decoder, kv_caches, config.block_size)

    def __init__(self, attention, decoder):
        self.step_weights = decode_layer.StepWeights.of_decoder(decoder)  # the C call's, made once
        self.weights = self.step_weights.kind  # "bf16" or "int8": the status line's word
        kernels = decode_layer.kernels_of(self.weights, torch.bfloat16)
        super().__init__(attention, Said("engine.decode_layer_bf16", rows=gemv.MAX_ROWS, weights=self.weights,
                                         threads=threads(kernels)))
        self.layers = decoder.layers  # prompts and larger batches: the reference's layers

    def describe(self) -> dict[str, Said]:  # decode attention runs inside the call; the reference's serves prompts
        return {"decode": self.decode, "attention": Said("engine.attn_bf16_step")}

    def whole_step(self, decoder, embeds, positions, kv_caches, meta, last) -> torch.Tensor | None:
        step = None if meta.is_prefill else decode_layer.prepare(embeds, meta)
        if step is None:
            return None
        cos, sin = decoder.rope(positions, torch.float32)  # HF's tables are fp32 before its cast to bf16
        x = embeds.float()
        out = decode_layer.run(self.step_weights, x, cos, sin, kv_caches, step).to(embeds.dtype)
        return out if last is None else decoder.compute_logits(out[last])  # the lm_head on bf16, as HF's
