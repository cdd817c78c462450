"""Bytes of weights and of one token's KV cache on one GPU, for float, int8 and int4 checkpoints."""
import math

from minivlm.budget.params import decoder_linears, layer_linears, text_params, vision_params  # noqa: F401
from minivlm.budget.shapes import ModelShape
from minivlm.budget.tensor_parallel import kv_heads_per_gpu

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}
QUANTIZED = ("int8", "int4")
INT4_GROUP = 128  # GPTQ/AWQ-style group size: one fp16 scale and one 4-bit zero point per 128 input weights


def dtype_name(dtype) -> str:
    """Canonical name of a dtype given as a string ('bf16', 'bfloat16') or a torch.dtype."""
    name = str(dtype).removeprefix("torch.").lower()
    name = ALIASES.get(name, name)
    if name not in DTYPE_BYTES and name not in QUANTIZED:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES) + list(QUANTIZED)}")
    return name


def linear_bytes(out_features: int, in_features: int, dtype: str) -> int:
    """Bytes of one weight matrix; int8 adds an fp16 scale per output row, int4 a scale + zero per group."""
    if dtype == "int8":
        return out_features * in_features + 2 * out_features
    if dtype == "int4":
        groups = out_features * math.ceil(in_features / INT4_GROUP)
        return (out_features * in_features + 1) // 2 + 2 * groups + (groups + 1) // 2
    return out_features * in_features * DTYPE_BYTES[dtype]


def weight_bytes(s: ModelShape, dtype: str, tp: int = 1,
                 counts: tuple[int, int] | None = None) -> tuple[int, int, str, str]:
    """(LLM bytes, vision bytes, their formulas) on one of tp GPUs. int8/int4 quantize only the decoder's Linear
    weights; embeddings, lm_head, norms, biases and the vision tower stay bfloat16, as GPTQ/AWQ checkpoints of
    Qwen-VL do. counts: the (LLM, vision) parameters per GPU, when the caller has them already."""
    text, vision = counts or (sum(text_params(s, tp).values()), sum(vision_params(s, tp).values()))
    if dtype not in QUANTIZED:
        b = DTYPE_BYTES[dtype]
        return text * b, vision * b, f"{text:,} params × {b} B ({dtype})", f"{vision:,} params × {b} B ({dtype})"
    layers = layer_linears(s, tp)  # hybrid models: each layer's own kind (Gemma 4: each layer's own shapes)
    quantized = sum(linear_bytes(lin.out_features, lin.in_features, dtype) for linears in layers for lin in linears)
    plain = text - sum(lin.out_features * lin.in_features for linears in layers for lin in linears)
    overhead = "fp16 scale per output row" if dtype == "int8" else f"fp16 scale + 4-bit zero per {INT4_GROUP} weights"
    return (quantized + 2 * plain, 2 * vision,
            f"{text:,} params: decoder Linear weights in {dtype} (+ {overhead}), the rest bfloat16",
            f"{vision:,} params × 2 B (bfloat16, not quantized)")


def kv_bytes_per_token(s: ModelShape, kv_dtype: str, tp: int = 1) -> int:
    """K and V of every layer for one token on one GPU: 2 · layers · kv heads per GPU · head_dim · bytes (GQA: KV
    heads, not query heads; split over the GPUs, at least one each). Gemma 4: each layer's own heads and head_dim,
    nothing for the layers that read another layer's K/V."""
    if s.layer_kv:
        return sum(2 * kv_heads_per_gpu(h, tp) * d * DTYPE_BYTES[kv_dtype] for i, (h, d) in enumerate(s.layer_kv)
                   if i not in s.shared_kv)
    return 2 * s.layers * kv_heads_per_gpu(s.kv_heads, tp) * s.head_dim * DTYPE_BYTES[kv_dtype]
