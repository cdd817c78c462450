"""A decode step's decoder layers, final norm and logits as one C call (decode_layer.c), on the CPU in fp32 for one
to gemv.MAX_ROWS sequences: the CPU's counterpart of a captured decode step. The layers' kernels are those of the
layer-by-layer path (gemv.c, decode_ops.c, paged_decode.c), so the numbers are the same; what goes is the Python
between them (about 2 ms of a 13 ms single-stream step on the bench model) and most of the waits between the
threads. Chunked prefill's mixed steps (decodes and chunks of at most CHUNK_IN_PLACE tokens) run the same way.
`prepare` returns None (and the backend runs layer by layer) for anything else: longer chunks, more rows."""
import ctypes
import os
from dataclasses import dataclass

import torch

from minivlm.model.backends.cpu_kernels import gemv
from minivlm.model.backends.cpu_kernels.c_build import LazyKernels
from minivlm.model.backends.in_place import CHUNK_IN_PLACE, token_queries

_p, _i = ctypes.c_void_p, ctypes.c_int64
_ARGS = [_p, _i, _p, _i, _p, _p, _p, _p, _i, _p, _p, _i, _p, _p, _i, _p, ctypes.c_float, _p, _p, _i, _p, _i, _p, _p,
         ctypes.c_int]
_HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = LazyKernels(os.path.join(_HERE, "decode_layer.c"), {"decode_layers_f32": _ARGS})
KERNELS_INT8 = LazyKernels(os.path.join(_HERE, "decode_layer_int8.c"), {"decode_layers_int8": _ARGS})  # int8 layers
KERNELS_BF16 = LazyKernels(os.path.join(_HERE, "decode_layer_bf16.c"), {"decode_layers_bf16": _ARGS})  # bf16 ones
KERNELS_INT4 = LazyKernels(os.path.join(_HERE, "decode_layer_int4.c"), {"decode_layers_int4": _ARGS})  # int4 layers
KERNELS_INT8_BF16 = LazyKernels(os.path.join(_HERE, "decode_layer_int8_bf16.c"),
                                {"decode_layers_int8_bf16": _ARGS})  # int8 layers over a bf16 engine's pool
# by the layers' weights (layer_struct) and the pool's dtype: the build and its function
BUILDS = {("f32", torch.float32): (KERNELS, "decode_layers_f32"),
          ("int8", torch.float32): (KERNELS_INT8, "decode_layers_int8"),
          ("int4", torch.float32): (KERNELS_INT4, "decode_layers_int4"),
          ("bf16", torch.bfloat16): (KERNELS_BF16, "decode_layers_bf16"),
          ("int8", torch.bfloat16): (KERNELS_INT8_BF16, "decode_layers_int8_bf16")}


class Layer(ctypes.Structure):  # decode_layer.c's Layer, field for field
    _fields_ = [(name, _p) for name in ("input_norm", "post_norm", "q_norm", "k_norm", "qkv", "qkv_bias", "o",
                                        "o_bias", "gate_up", "down")] + \
               [(name, _i) for name in ("hidden", "heads", "kv_heads", "head_dim", "intermediate")] + \
               [(name, ctypes.c_float) for name in ("eps", "qk_eps", "scale")] + \
               [(name, _p) for name in ("qkv_scale", "o_scale", "gate_up_scale", "down_scale")]  # int8 only


class Int4W(ctypes.Structure):  # int4_weights.h's Int4W: a matrix's nibbles, group scales and minima, group size
    _fields_ = [("q", _p), ("sm", _p), ("group", _i)]


_ONE_EACH = [torch.arange(1, rows + 1) for rows in range(gemv.MAX_ROWS + 1)]  # a decode step's seq_ends, made once


@dataclass
class DecodeStep:
    """The step's arguments besides the layers (made once per step). tables / lens: each row's (a chunk's tokens
    each have their own); seq_ends: where each sequence's rows end."""
    rows: int
    slots: torch.Tensor
    tables: torch.Tensor
    lens: torch.Tensor
    seq_ends: torch.Tensor
    threads: int

    def scratch_floats(self, c: Layer) -> int:  # decode_layer.c's shared buffers, then each thread's two
        width = (c.heads + 2 * c.kv_heads) * c.head_dim
        return self.rows * (width + c.heads * c.head_dim + 3 * c.intermediate + 2 * c.hidden) + \
            self.threads * 2 * self.rows * c.hidden


def _dense(linear) -> torch.Tensor | None:
    """The plain [out, in] weight gemv.c reads: the dense copy beside a packed weight (linears.py), or the weight;
    None for a quantized layer (no fp32 weight)."""
    weight = getattr(linear, "weight", None)
    if weight is None:
        return None
    w = getattr(linear, "dense", None) if weight.is_mkldnn else weight
    return w if w is not None and w.is_contiguous() and w.dtype == torch.float32 else None


def _ptr(t) -> int | None:
    return None if t is None else t.data_ptr()


def _int8(linear) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(int8 [out, in], fp32 scales [out]) of a quantized.Int8Linear, else None (also where its columns were padded
    for PyTorch's kernel: the step reads rows of `in`; that layer's step runs layer by layer)."""
    q, scales = getattr(linear, "qweight", None), getattr(linear, "scales_f32", None)
    return (q, scales) if q is not None and q.dtype == torch.int8 and scales is not None and \
        q.shape[1] == linear.in_features else None


def _int4(linear) -> Int4W | None:
    """The C step's view of a quantized.Int4Linear (its nibble copy: Int4Linear.c_nibbles), else None (a layer
    whose width or group the kernels do not take, or whose copy the calibration freed)."""
    q, sm = getattr(linear, "c_nibbles", None), getattr(linear, "c_sm", None)
    return Int4W(q.data_ptr(), sm.data_ptr(), linear.group) if q is not None and sm is not None else None


def _bf16(linear) -> torch.Tensor | None:
    """The bf16 [out, in] weight of a bf16 engine's nn.Linear, else None."""
    w = getattr(linear, "weight", None)
    return w if isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 and w.is_contiguous() else None


def f32_copy(t: torch.Tensor | None) -> torch.Tensor | None:
    """t as the C step reads it (fp32): a bf16 engine's norm weights and biases, copied once and kept by the
    caller (StepWeights.kept)."""
    return None if t is None or t.dtype == torch.float32 else t.float()


def _matrices(layer) -> tuple[list, list, str] | None:
    """The layer's four matrices (qkv, o, gate_up, down) as the C call reads them, their int8 scales, and their
    kind: all dense fp32 ("f32"), all int8 (with scales), all int4 (Int4W structs) or all bf16; else None."""
    attn, mlp = layer.self_attn, layer.mlp
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    mats, scales, kind = [_dense(m) for m in linears], [None] * 4, "f32"
    if any(m is None for m in mats) and all(_int8(m) for m in linears):
        (mats, scales), kind = zip(*(_int8(m) for m in linears)), "int8"
    elif any(m is None for m in mats) and all(_int4(m) for m in linears):
        mats, kind = [_int4(m) for m in linears], "int4"  # the scales are in each Int4W
    elif any(m is None for m in mats) and all(_bf16(m) is not None for m in linears):
        mats, kind = [_bf16(m) for m in linears], "bf16"
    return (mats, scales, kind) if all(m is not None for m in mats) else None


def weights_kind(decoder) -> str | None:
    """"f32", "int8", "int4" or "bf16" where every layer's matrices are of that kind, else None (no C step)."""
    kinds = {found[2] if found else None for found in map(_matrices, decoder.layers)}
    return kinds.pop() if len(kinds) == 1 else None


def layer_struct(layer, kept: list) -> Layer:
    """The layer's weights and shape for the C call (the weights never move after load); a bf16 engine's norms and
    biases as fp32 copies, appended to `kept` (whoever holds the struct keeps them alive)."""
    attn, down = layer.self_attn, layer.mlp.down_proj
    mats, scales, kind = _matrices(layer)
    if kind == "int4":  # the structs the layer's pointers point to, kept alive with the rest
        kept.extend(mats)
        mats = [ctypes.addressof(m) for m in mats]

    def floats(t):  # a small vector as fp32
        copy = f32_copy(t)
        if copy is None:
            return _ptr(t)
        kept.append(copy)
        return _ptr(copy)
    norms = (attn.q_norm.weight, attn.k_norm.weight) if attn.q_norm is not None else (None, None)
    ptr = (lambda m: m) if kind == "int4" else _ptr
    return Layer(floats(layer.input_layernorm.weight), floats(layer.post_attention_layernorm.weight),
                 *map(floats, norms), ptr(mats[0]), floats(attn.qkv_proj.bias), ptr(mats[1]),
                 floats(attn.o_proj.bias), ptr(mats[2]), ptr(mats[3]), down.out_features, attn.heads,
                 attn.kv_heads, attn.head_dim, down.in_features, layer.input_layernorm.eps,
                 attn.q_norm.eps if attn.q_norm is not None else 0.0, attn.head_dim ** -0.5, *map(_ptr, scales))


@dataclass
class StepWeights:
    """What the C step reads of a decoder besides the step's own arguments, made once when its backend is made
    (the backend holds it; nothing is stored on the modules): every layer's struct as the one array the call takes,
    the matrices' kind, the final norm's weight in fp32 and its eps, and the fp32 copies the structs point into."""
    layers: ctypes.Array
    kind: str
    norm: torch.Tensor
    eps: float
    kept: list

    @classmethod
    def of(cls, structs: list[Layer], final_norm, kind: str = "f32", kept: list = ()) -> "StepWeights":
        """From Layer structs (tests make their own) and the final RMSNorm."""
        norm = f32_copy(final_norm.weight)
        return cls((Layer * len(structs))(*structs), kind, final_norm.weight if norm is None else norm,
                   final_norm.eps, [*kept, norm])

    @classmethod
    def of_decoder(cls, decoder) -> "StepWeights":
        """A decoder's (weights_kind(decoder) is not None)."""
        kept = []
        structs = [layer_struct(layer, kept) for layer in decoder.layers]
        return cls.of(structs, decoder.norm, weights_kind(decoder), kept)


def kernels_of(kind: str, pool_dtype: torch.dtype = torch.float32) -> LazyKernels | None:
    """The build that runs layers of this kind (fp32, int8, int4 or bf16 weights) over a pool of pool_dtype; None if none
    does."""
    build = BUILDS.get((kind, pool_dtype))
    return build[0] if build else None


def prepare(x: torch.Tensor, meta) -> DecodeStep | None:
    """The step's shared arguments if its layers can run as one C call (the backend checked the kernels and
    weights once, at load), else None. A mixed step of decodes and short prefill chunks (chunked prefill's)
    qualifies too: each chunk token is a decode query over its sequence's tokens up to itself (a sequence's tokens
    in order, each one's K/V written before it attends), as in_place.py computes it layer by layer."""
    if x.shape[0] > gemv.MAX_ROWS:
        return None
    if meta.is_prefill and max(meta.q_lens) > CHUNK_IN_PLACE:  # a long chunk: SDPA's GEMMs win (layer by layer)
        return None
    tables, lens = token_queries(meta) if meta.is_prefill else (meta.block_tables, meta.ctx_lens_t)
    seq_ends = torch.tensor(meta.q_lens, dtype=torch.int64).cumsum(0) if meta.is_prefill else _ONE_EACH[x.shape[0]]
    return DecodeStep(x.shape[0], meta.slot_mapping.to(torch.int64).contiguous(), tables.to(torch.int64).contiguous(),
                      lens.to(torch.int64).contiguous(), seq_ends, torch.get_num_threads())


def kernel_variant(*defines: str):
    """decode_layers_f32 built with extra -D flags (SPIN_NS=0: OpenMP's barrier): tests and benches."""
    return KERNELS.variant(*defines).decode_layers_f32


def run(weights: StepWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_caches, step: DecodeStep,
        lm_head=None, last: torch.Tensor | None = None, fn=None) -> torch.Tensor:
    """Every layer on x [rows, hidden] (fp32: the step's own embeddings), then the final norm, in place; each
    layer's K/V go into its kv_caches entry. Returns x, or with lm_head the logits of the rows `last` [n] (in the
    same call where its weight is dense fp32 and the layers are too; else lm_head's own, on x).
    fn: another build of decode_layers_f32 (kernel_variant)."""
    structs = weights.layers
    ks, vs = ((_p * len(structs))(*(kv[j].data_ptr() for kv in kv_caches)) for j in (0, 1))
    scratch = torch.empty(step.scratch_floats(structs[0]))
    w = _dense(lm_head) if lm_head is not None and weights.kind == "f32" else None  # else the lm_head after the call
    if fn is None:
        kernels, name = BUILDS[weights.kind, kv_caches[0][0].dtype]
        fn = getattr(kernels.get(), name)
    rows_out = last.to(torch.int64).contiguous() if w is not None else None
    logits = torch.empty(len(rows_out), w.shape[0]) if w is not None else None
    fn(structs, len(structs), x.data_ptr(), step.rows, cos.data_ptr(), sin.data_ptr(), ks, vs,
       kv_caches[0][0].shape[1], step.slots.data_ptr(), step.tables.data_ptr(), step.tables.shape[1],
       step.lens.data_ptr(), step.seq_ends.data_ptr(), len(step.seq_ends), weights.norm.data_ptr(), weights.eps,
       _ptr(w), _ptr(getattr(lm_head, "bias", None)), 0 if w is None else w.shape[0], _ptr(rows_out),
       0 if w is None else len(rows_out), _ptr(logits), scratch.data_ptr(), step.threads)
    if lm_head is not None and w is None:  # no dense fp32 weight in the call (int8 layers): PyTorch's logits
        return lm_head(x[last])
    return x if w is None else logits
