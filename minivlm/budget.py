"""VRAM budget: weights, KV cache, vision tokens and activation peaks of a Qwen-VL deployment in one view.

estimate() is a pure function of a model config and settings; the engine sizes its own KV pool with it, so the
calculator and the engine cannot disagree. The KV pool rule (vLLM's):

    usable     = floor(memory · gpu_memory_utilization) − weights − activation peak − framework overhead
    num_blocks = max(0, usable // (block_size · kv_bytes_per_token))
    KV pool    = num_blocks · block_size · kv_bytes_per_token; per layer K and V are [num_blocks, block_size,
                 kv_heads, head_dim] tensors of kv_dtype, so
    kv_bytes_per_token = 2 · layers · kv_heads · head_dim · bytes(kv_dtype)
"""
import json
import math
import os
from dataclasses import dataclass, field

from minivlm.param_count import PRESET_DIR, ModelShape, decoder_linears, model_shape, text_params, vision_params
from minivlm.vision_tokens import processor_settings, smart_resize

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}
QUANTIZED = ("int8", "int4")
INT4_GROUP = 128  # GPTQ/AWQ-style group size: one fp16 scale and one 4-bit zero point per 128 input weights
DEFAULT_OVERHEAD_BYTES = 512 * 2 ** 20  # CUDA context, cuBLAS workspaces, allocator fragmentation
ATTENTION = ("sdpa", "flash_attention_2", "paged", "eager")  # only eager materialises heads x tokens² scores


@dataclass
class BudgetItem:
    """One row of the breakdown: what, how many bytes, and the formula in words (with the numbers used)."""
    name: str
    bytes: int
    formula: str


@dataclass
class Estimate:
    """Everything the VRAM panel shows; bytes unless named otherwise."""
    weights_bytes: int
    predicted_weights_bytes: int
    text_weights_bytes: int
    vision_weights_bytes: int
    num_parameters: int
    kv_bytes_per_token: int
    block_size: int
    num_blocks: int
    kv_cache_bytes: int
    max_concurrency: float
    vision_tokens_per_image: int
    resized_image: tuple[int, int]
    tokens_per_request: int
    fits_context: bool
    workload_concurrency: int
    vision_peak_bytes: int
    prefill_peak_bytes: int
    activation_peak_bytes: int
    overhead_bytes: int
    memory_bytes: int
    usable_bytes: int
    fits: bool
    breakdown: list[BudgetItem] = field(default_factory=list)


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


def weight_bytes(s: ModelShape, dtype: str) -> tuple[int, int, str, str]:
    """(LLM bytes, vision bytes, their formulas). int8/int4 quantize only the decoder's Linear weights; embeddings,
    lm_head, norms, biases and the vision tower stay bfloat16, as GPTQ/AWQ checkpoints of Qwen-VL do."""
    text, vision = sum(text_params(s).values()), sum(vision_params(s).values())
    if dtype not in QUANTIZED:
        b = DTYPE_BYTES[dtype]
        return text * b, vision * b, f"{text:,} params × {b} B ({dtype})", f"{vision:,} params × {b} B ({dtype})"
    linears = decoder_linears(s)
    quantized = s.layers * sum(linear_bytes(lin.out_features, lin.in_features, dtype) for lin in linears)
    plain = text - s.layers * sum(lin.out_features * lin.in_features for lin in linears)
    overhead = "fp16 scale per output row" if dtype == "int8" else f"fp16 scale + 4-bit zero per {INT4_GROUP} weights"
    return (quantized + 2 * plain, 2 * vision,
            f"{text:,} params: decoder Linear weights in {dtype} (+ {overhead}), the rest bfloat16",
            f"{vision:,} params × 2 B (bfloat16, not quantized)")


def kv_bytes_per_token(s: ModelShape, kv_dtype: str) -> int:
    """K and V of every layer for one token: 2 · layers · kv_heads · head_dim · bytes (GQA: kv_heads, not heads)."""
    return 2 * s.layers * s.kv_heads * s.head_dim * DTYPE_BYTES[kv_dtype]


def vision_peak(s: ModelShape, patches: int, act: int, eager: bool) -> tuple[int, str]:
    """Live bytes at the peak of encoding one image of `patches` ViT patches (images are encoded one by one)."""
    w, i, head_dim = s.vision_width, s.vision_intermediate, s.vision_width // s.vision_heads
    pixels = patches * s.in_channels * s.temporal_patch_size * s.patch_size ** 2 * 4  # float32 pixel_values
    # MLP intermediates alive at once: gated SiLU (2.5) holds gate, up, product; quick_gelu (2) fc1, sigmoid, product;
    # Qwen3's fused tanh-GELU only fc1 and its output
    mlp_live = 2 if s.family == "qwen3_vl" else 3
    # block input + residual + normed input, plus the attention (q, k, v, rotated q/k, output: 6 widths) or the
    # MLP intermediates; rotary cos/sin; Qwen3-VL also keeps the patch + position-table sum alive
    per_patch = max(9 * w, 3 * w + mlp_live * i) + 2 * head_dim + (w if s.family == "qwen3_vl" else 0)
    deepstack = s.deepstack * (patches // s.merge_size ** 2) * s.vision_out  # kept for the LLM until the end
    scores = s.vision_heads * patches ** 2 * (act + 4) if eager else 0  # eager: scores + fp32 softmax per head
    total = pixels + (patches * per_patch + deepstack) * act + scores
    return total, (f"{patches} patches × (max(9·{w}, 3·{w}+{mlp_live}·{i}) + 2·{head_dim}"
                   + (f" + {w}" if s.family == "qwen3_vl" else "") + f") · {act} B + float32 pixel values"
                   + (f" + {s.deepstack} deepstack features" if s.deepstack else "")
                   + (f" + {s.vision_heads} heads × {patches}² eager scores" if eager else ""))


def prefill_peak(s: ModelShape, tokens: int, num_seqs: int, act: int, eager: bool) -> tuple[int, str]:
    """Live bytes at the peak of one LLM forward over `tokens` step tokens (paged attention: no tokens² term)."""
    h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    attn = 3 * h + 3 * q + 3 * kv + (q + kv if s.family == "qwen3_vl" else 0)  # + q/k norm outputs in Qwen3
    per_token = max(attn, 3 * h + 3 * s.intermediate) + 2 * s.head_dim  # layer input, residual, normed + rotary
    logits = num_seqs * s.vocab * (act + 4)  # last-position logits per sequence, upcast to float32 for sampling
    scores = s.heads * tokens ** 2 * (act + 4) if eager else 0
    return (tokens * per_token * act + logits + scores,
            f"{tokens} tokens × (max({attn} attention, 3·{h}+3·{s.intermediate} MLP) + 2·{s.head_dim}) · {act} B"
            f" + {num_seqs} × {s.vocab} logits · ({act}+4) B"
            + (f" + {s.heads} heads × {tokens}² eager scores" if eager else ""))


def load_device_preset(name: str) -> dict:
    """A device of assets/presets/devices.json ('L4', 'H100 80GB', 'Apple M-series 16 GB', ...)."""
    with open(os.path.join(PRESET_DIR, "devices.json")) as f:
        devices = json.load(f)["devices"]
    if name not in devices:
        raise ValueError(f"unknown device preset {name!r}; known: {sorted(devices)}")
    return devices[name]


def device_memory(device=None, device_memory_gb=None, device_memory_bytes=None) -> int:
    """Bytes the budget may plan with: exactly one of a preset name (times its working-set fraction), a size in
    GiB (2^30 bytes; presets carry exact figures), or exact bytes (the engine passes the device's free memory)."""
    given = [x is not None for x in (device, device_memory_gb, device_memory_bytes)]
    if sum(given) != 1:
        raise ValueError("give exactly one of device (a preset), device_memory_gb or device_memory_bytes")
    if device is not None:
        preset = load_device_preset(device)
        return int(preset["memory_bytes"] * preset["working_set_fraction"])
    memory = device_memory_bytes if device_memory_bytes is not None else int(device_memory_gb * 2 ** 30)
    if memory <= 0:
        raise ValueError(f"device memory must be positive, got {memory} bytes")
    return int(memory)


def estimate(model_config, dtype="bfloat16", kv_dtype="auto", max_model_len=4096, num_seqs=8,
             images_per_request=1, image_size=(1024, 768), device_memory_gb=None, gpu_memory_utilization=0.9,
             block_size=16, min_pixels=None, max_pixels=None, *, device=None, device_memory_bytes=None,
             weights_bytes=None, max_num_batched_tokens=None, text_tokens_per_request=512, overhead_bytes=None,
             attn_implementation="sdpa") -> Estimate:
    """The memory plan of one deployment (see the module doc for the num_blocks rule).

    image_size is each image's (width, height), as PIL's Image.size; the encoder peak is for one such image.
    dtype: float32 | bfloat16 | float16 | int8 | int4 (int weights compute in bfloat16); kv_dtype "auto" = the
    compute dtype, or a float type / fp8. max_num_batched_tokens (the step token budget of the prefill peak)
    defaults to max_model_len. weights_bytes replaces the predicted weights with measured ones; overhead_bytes
    replaces DEFAULT_OVERHEAD_BYTES. Memory: exactly one of device (preset), device_memory_gb (GiB) or
    device_memory_bytes."""
    s = model_shape(model_config)
    dtype = dtype_name(dtype)
    act_dtype = "bfloat16" if dtype in QUANTIZED else dtype
    kv_dtype = act_dtype if kv_dtype == "auto" else dtype_name(kv_dtype)
    if kv_dtype in QUANTIZED:
        raise ValueError(f"kv_dtype {kv_dtype} is not supported; use a float type or fp8")
    for name, value in (("max_model_len", max_model_len), ("num_seqs", num_seqs), ("block_size", block_size)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if images_per_request < 0:
        raise ValueError(f"images_per_request must be >= 0, got {images_per_request}")
    if len(image_size) != 2 or min(image_size) <= 0:
        raise ValueError(f"image_size must be (width, height) with positive sides, got {image_size!r}")
    if attn_implementation not in ATTENTION:
        raise ValueError(f"attn_implementation must be one of {ATTENTION}, got {attn_implementation!r}")
    memory = device_memory(device, device_memory_gb, device_memory_bytes)
    act, eager = DTYPE_BYTES[act_dtype], attn_implementation == "eager"

    text_b, vision_b, text_formula, vision_formula = weight_bytes(s, dtype)
    predicted = text_b + vision_b
    used_weights = predicted if weights_bytes is None else int(weights_bytes)
    per_token = kv_bytes_per_token(s, kv_dtype)

    proc = processor_settings(model_config, min_pixels, max_pixels)
    factor = proc["patch_size"] * proc["merge_size"]
    width, height = image_size
    resized = smart_resize(height, width, factor, proc["min_pixels"], proc["max_pixels"])
    image_tokens = (resized[0] // factor) * (resized[1] // factor)
    patches = image_tokens * proc["merge_size"] ** 2
    needed_tokens = images_per_request * (image_tokens + 2) + text_tokens_per_request  # + vision start/end
    request_tokens = min(max_model_len, needed_tokens)

    vis_peak, vis_formula = vision_peak(s, patches, act, eager) if images_per_request else (0, "no images")
    step_tokens = max_num_batched_tokens or max_model_len
    llm_peak, llm_formula = prefill_peak(s, step_tokens, min(num_seqs, step_tokens), act, eager)
    peak = max(vis_peak, llm_peak)  # the encoder's activations are freed before the LLM forward runs
    overhead = DEFAULT_OVERHEAD_BYTES if overhead_bytes is None else int(overhead_bytes)

    budget = int(memory * gpu_memory_utilization)
    usable = budget - used_weights - peak - overhead
    block_bytes = block_size * per_token
    num_blocks = max(0, usable // block_bytes)
    kv_cache = num_blocks * block_bytes
    workload = num_blocks // math.ceil(request_tokens / block_size)
    breakdown = [
        BudgetItem("LLM weights", text_b, text_formula + ("; lm_head tied to the embeddings" if s.tied else "")),
        BudgetItem("Vision tower weights", vision_b, vision_formula),
        BudgetItem("Activation peak", peak, f"max(vision encoder {vis_peak:,}, LLM prefill {llm_peak:,})"),
        BudgetItem("Vision encoder peak (largest image)", vis_peak, vis_formula),
        BudgetItem("LLM prefill peak (step token budget)", llm_peak, llm_formula),
        BudgetItem("Framework overhead", overhead, "CUDA context, library workspaces, allocator fragmentation"),
        BudgetItem("KV cache pool", kv_cache, f"{num_blocks} blocks × {block_size} tokens × {per_token:,} B/token "
                   f"(2 · {s.layers} layers · {s.kv_heads} kv heads · {s.head_dim} head_dim · "
                   f"{DTYPE_BYTES[kv_dtype]} B {kv_dtype})"),
        *([BudgetItem("Measured weights beyond the prediction", used_weights - predicted,
                      f"weights_bytes {used_weights:,} passed in minus the formula's {predicted:,}")]
          if used_weights != predicted else []),
        BudgetItem("Unallocated" if usable >= 0 else "Over budget", budget - used_weights - peak - overhead - kv_cache,
                   f"{gpu_memory_utilization} × {memory:,} B minus all of the above"),
    ]
    return Estimate(
        weights_bytes=used_weights, predicted_weights_bytes=predicted, text_weights_bytes=text_b,
        vision_weights_bytes=vision_b, num_parameters=sum(text_params(s).values()) + sum(vision_params(s).values()),
        kv_bytes_per_token=per_token, block_size=block_size, num_blocks=num_blocks, kv_cache_bytes=kv_cache,
        max_concurrency=num_blocks / math.ceil(max_model_len / block_size), vision_tokens_per_image=image_tokens,
        resized_image=resized, tokens_per_request=request_tokens, fits_context=needed_tokens <= max_model_len,
        workload_concurrency=workload, vision_peak_bytes=vis_peak, prefill_peak_bytes=llm_peak,
        activation_peak_bytes=peak, overhead_bytes=overhead, memory_bytes=memory, usable_bytes=usable,
        fits=workload >= num_seqs and needed_tokens <= max_model_len, breakdown=breakdown)
