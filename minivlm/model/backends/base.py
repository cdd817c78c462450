"""What a model backend is: the attention every decoder layer calls (an Attention: the reference's PagedAttention,
or a subclass that reads the pool its own way) and the step around it (a Backend: the reference runs the decoder
as it is; a Hooks backend replaces parts of the decoder's loop, never the loop). Each is a class that says whether
it is made for this device and dtype (`runs_on`), why it does not serve an engine there (`serves`: a Said, None if
it does) and how it is made for one (`make`); backends.pick walks its registry of them, best first, when an engine is
built. The engine reads `limits` as data and `describe()` as its status line. A backend's words are Said strings:
English, with an id and fields that a page in another language keys on (panels/i18n), never the English text."""
from dataclasses import dataclass

import torch

from minivlm.model.attention import PagedAttention

# the status line's words, by id: each English sentence written once, here (panels/i18n/chat_text.py reads them
# and adds the Chinese under the same ids)
WORDS = {
    "engine.attn_inplace": "in-place paged decode (C kernel over the block tables{threads}); prefill: SDPA",
    "engine.attn_flex": "in-place paged decode (FlexAttention over the block tables, compiled); prefill: SDPA",
    "engine.attn_flash": "flash-attn paged kernels",
    "engine.attn_bf16_step": "in-place paged decode inside the C step (the bf16 pool, read where it lies); prompts: "
                             "SDPA over gathered blocks",
    "engine.attn_gathered": "SDPA over gathered blocks{why}",
    "engine.why_kernel": " (in-place kernel: {why})",
    "engine.why_flex": " (FlexAttention in place: {state})",
    "engine.why_flash_missing": " (flash-attn not installed)",
    "engine.why_flash_shape": " (flash-attn's paged kernel needs fp16/bf16 and a block size that is a multiple of 256)",
    "engine.fp32_only": "fp32 only",
    "engine.decode_layer": "one C call a step for 1-{rows} sequences (decode_layer.c), fused small ops (decode_ops.c) "
                           "above{threads}",
    "engine.decode_ops": "fused small ops (decode_ops.c); decode_layer.c off: {why}{threads}",
    "engine.decode_torch": "PyTorch ops ({why})",
    "engine.decode_layer_bf16": "one C call a decode step for 1-{rows} sequences over the {weights} weights and the bf16 "
                                "pool, fp32 inside (decode_layer.c); prompts: PyTorch's bf16 ops{threads}",
    "engine.no_bf16_step_weights": "a bf16 engine's C step reads bf16 or int8 weights only",
    "engine.calibrated_bf16": "calibrated at load, a decode step: the C step over {weights} weights {c} ms, PyTorch's "
                              "bf16 ops {torch} ms",
    "engine.calibrated_torch_bf16": "PyTorch's bf16 ops were faster at load",
    "engine.why_decode_ops_off": "decode_ops.c off: {why}",
    "engine.decode_not_cpu": "the fused C paths are for the CPU in fp32",
    "engine.why_hybrid": " (a hybrid model: each KV-cache group's layers read their own pool)",
    "engine.decode_hybrid": "the fused C paths are for models whose layers all attend fully",
    "engine.no_dense_weights": "no dense fp32 weights",
    "engine.one_thread": "; one thread (built without OpenMP: {why})",
    "engine.linear_gemv": "gemv.c for decode batches of 1-{rows}, oneDNN (prepacked) above{threads}",
    "engine.linear_onednn": "oneDNN (prepacked); gemv.c off: {why}",
    "engine.linear_default": "PyTorch's default (nn.Linear)",
    "engine.linear_quantized": "{method} weights (PyTorch's weight-only kernel) in {n} layers",
    "engine.linear_quantized_padded": "{method} weights (PyTorch's weight-only kernel) in {n} layers ({padded} padded "
                                      "to the kernel's width)",
    "engine.decode_quantized": "the fused C paths run in fp32 or bf16",
    "engine.decode_calibrated": "calibrated at load, a decode step: C kernels {c} ms, PyTorch ops with oneDNN linears "
                                "{onednn} ms{mkl}",
    "engine.calibrated_int8": "calibrated at load, a decode step: the C kernels over int8 weights {gemv} ms, "
                              "layer by layer with PyTorch's int8 kernel {torch} ms{rows}",
    "engine.calibrated_torch_int8": "PyTorch's int8 kernel was faster at load",
    "engine.calibrated_rows": "{kernel} for the int8 decode rows was faster at load",
    "engine.calibrated_int4": "calibrated at load, a decode step: the C kernels over int4 weights {c}, layer by "
                              "layer with PyTorch's int4 kernel {torch} ms{lm_head}",
    "engine.calibrated_int4_rows": "; the int8 lm_head's rows on PyTorch's int8 kernel {torch} ms{rows}; kept: "
                                   "{kernel}",
    "engine.calibrated_torch_int4": "PyTorch's int4 kernel was faster at load",
    "engine.rows_times": "; layer by layer with gemv_int8.c {gemv}, with fbgemm's dynamic int8 linear {fbgemm}",
    "engine.rows_ms": "{ms} ms",
    "engine.rows_skipped": "not kept: {why}",
    "engine.rows_torch": "PyTorch's int8 kernel",
    "engine.rows_gemv": "gemv_int8.c (hand-written)",
    "engine.rows_fbgemm": "fbgemm's dynamic int8 linear",
    "engine.calibrated_mkl_ms": ", with nn.Linear (MKL) {ms} ms",
    "engine.calibrated_onednn": "PyTorch ops with oneDNN linears",
    "engine.calibrated_mkl": "PyTorch ops with nn.Linear (MKL)",
    "engine.dtype_checkpoint": "auto: the checkpoint's saved dtype, {dtype}",
    "engine.dtype_checkpoint_fp16": "auto: the checkpoint is saved in float16, which runs as bfloat16 on the CPU",
    "engine.dtype_checkpoint_other": "auto: the checkpoint is saved in {dtype}, which runs as float32 on the CPU",
    "engine.dtype_unsaved": "auto: the checkpoint names no dtype, float32",
    "engine.dtype_quantized": "auto: {method} weights run fastest in fp32 with the fused C ops (their products take "
                              "bf16 inputs)",
    "engine.no_cuda": "no CUDA GPU visible to this torch build",  # why a device is not available (minivlm/device.py)
    "engine.no_mps": "Apple Metal (MPS) is only on Apple-silicon Macs",
}


class Said(str):
    """A status in English, as the status line shows it, that also carries its message id and fields (each a
    plain string or a Said of its own)."""
    key: str
    fields: dict

    def __new__(cls, key: str, **fields):
        said = super().__new__(cls, WORDS[key].format(**fields))
        said.key, said.fields = key, fields
        return said

    def __getnewargs_ex__(self):  # pickle and copy make it again from its id and fields
        return (self.key,), self.fields


@dataclass(frozen=True)
class Limits:
    """What the engine needs to know of its backend, as data."""
    fast_rows: int | None = None  # the most rows a step runs as one fast call (past them it costs ~2x); None: no edge


class Registered:
    """What pick asks of every class in a registry: is it made for this model's device and dtype at all (runs_on;
    only those are asked why not), and does it serve an engine of `model` with `config` (None, else why not: the
    status line says it). The references run everywhere and serve always."""

    @classmethod
    def runs_on(cls, model, config) -> bool:
        return True

    @classmethod
    def serves(cls, model, config) -> Said | None:
        return None


class Attention(Registered, PagedAttention):
    """The reference attention as a backend: SDPA over gathered blocks, `why` (a Said, or "") no other serves.
    A subclass in the registry (backends.ATTENTION) says where it runs, whether it serves, and is made by `make`."""
    name = "gathered"

    def __init__(self, why: str = ""):
        self.why = why

    @classmethod
    def make(cls, model, config, kv_caches) -> "Attention":
        """The attention of an engine over its pool's [(k_cache, v_cache)] per layer."""
        return cls()

    def describe(self) -> Said:
        return Said("engine.attn_gathered", why=self.why)

    def release(self):
        """Let go of the pool (a backend compiling for it stops)."""


class Backend(Registered):
    """How an engine runs a step: the reference runs the decoder layer by layer in PyTorch ops. `decode` says how,
    in words (and why no faster step serves). A subclass in the registry (backends.STEP) also says where it runs,
    whether it serves, and is made by make(model, config, attention, kv_caches) (where it may time itself against the
    reference: calibrate.py); the reference itself is made by pick, with the reason no other serves."""
    name = "pytorch"
    limits = Limits()
    calibration: Said | str = ""  # the CPU fp32 step's choice at load, timed (calibrate.py), or why not timed
    passed_over: dict = {}  # the registry's classes asked before this one (and its attention), by name: why not

    def __init__(self, attention: Attention, decode: Said):
        self.attention, self.decode = attention, decode

    def forward(self, decoder, embeds, positions, kv_caches, meta, deepstack=None, last=None, input_ids=None):
        """The decoder's forward (input_ids: the step's token ids, which every decoder takes)."""
        return decoder(embeds, positions, kv_caches, meta, deepstack, last, input_ids=input_ids)

    def describe(self) -> dict[str, Said]:
        """{"decode": how a step's layers run, "attention": which attention they call}, in words."""
        return {"decode": self.decode, "attention": self.attention.describe()}

    def release(self):
        self.attention.release()


class Hooks(Backend):
    """A backend that replaces parts of the decoder's loop (Decoder.forward's `hooks`), not the loop: the whole step
    as one call where it takes it (`whole_step`), and each layer's forward (`layers`: one callable per layer,
    fn(x, cos, sin, kv_cache, meta), made once)."""
    layers: list

    def whole_step(self, decoder, embeds, positions, kv_caches, meta, last) -> torch.Tensor | None:
        """Every layer, the final norm (and the logits of the rows `last`) in one call; None: not this step."""
        return None

    def forward(self, decoder, embeds, positions, kv_caches, meta, deepstack=None, last=None, input_ids=None):
        return decoder(embeds, positions, kv_caches, meta, deepstack, last, hooks=self, input_ids=input_ids)
