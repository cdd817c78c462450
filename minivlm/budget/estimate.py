"""VRAM budget: weights, KV cache, vision tokens and activation peaks of a deployment in one view (Qwen-VL, the tiled
VLMs SmolVLM / InternVL, text-only Qwen2 / Qwen3, and the hybrid Qwen3.5 / Gemma 3 / Gemma 4).

estimate() is a pure function of a model config and settings; the engine sizes its own KV pool with it, so the
calculator and the engine cannot disagree. The KV pool rule (vLLM's), per GPU:

    usable     = floor(memory · gpu_memory_utilization) − weights − activation peak − framework overhead
    num_blocks = max(0, usable // (block_size · kv_bytes_per_token))
    KV pool    = num_blocks · block_size · kv_bytes_per_token; per layer K and V are [num_blocks, block_size,
                 kv_heads per GPU, head_dim] tensors of kv_dtype, so
    kv_bytes_per_token = 2 · layers · kv_heads per GPU · head_dim · bytes(kv_dtype)

With tensor parallelism (tensor_parallel.py) every GPU holds its share of the weights and of every token's K/V, so
a block of the pool spans all GPUs: num_blocks, the concurrency and the pool's tokens are those of the one replica.

A hybrid model's layers keep different things (kv_groups.py): its usable memory is split into KV-cache groups as the
engine splits it (full-attention blocks, sliding-window blocks, recurrent state slots); num_blocks is then the full
group's, as vLLM reports it, and kv_cache_bytes all groups together (hybrid_kv.py).
"""
import math
from dataclasses import dataclass, field

from minivlm.budget.activations import patch_embedder_peak, prefill_peak, tiled_vision_peak, vision_peak
from minivlm.budget.devices import device_memory, tensor_parallel_for
from minivlm.budget.hybrid_kv import hybrid_kv
from minivlm.budget.kv_groups import STATE_DTYPE, layer_groups
from minivlm.budget.limits import why_it_does_not_fit
from minivlm.budget.params import audio_params, mtp_params, text_params, vision_params
from minivlm.budget.shapes import HYBRID, hf_config, model_shape
from minivlm.budget.tensor_parallel import check_tensor_parallel, kv_heads_per_gpu, vision_split
from minivlm.budget.video_tokens import video_plan
from minivlm.budget.vision_tokens import ImagePlan, image_plan
from minivlm.budget.weights import DTYPE_BYTES, QUANTIZED, dtype_name, kv_bytes_per_token, weight_bytes
from minivlm.config import SpeculativeConfig

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
    """Everything the VRAM panel shows; bytes unless named otherwise, per GPU where the model is split."""
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
    tensor_parallel_size: int = 1
    kv_heads_per_gpu: int = 0
    vision_split: int = 1  # the vision tower is split over this many GPUs (1: replicated on each)
    images_per_request: int = 0
    image_marker_tokens: int = 2  # per image around its vision tokens: Qwen / InternVL start+end, SmolVLM's markers
    image_tiles: int = 1  # tiles the tower encodes per image (tiled families; 1 for Qwen-VL)
    text_only: bool = False
    text_tokens_per_request: int = 0
    needed_tokens_per_request: int = 0  # before clipping to max_model_len (tokens_per_request is clipped)
    max_model_len: int = 0
    num_seqs: int = 0
    gpu_memory_utilization: float = 0.0
    budget_bytes: int = 0
    kv_pool_tokens: int = 0
    kv_demand_tokens: int = 0  # num_seqs requests of needed_tokens_per_request, each rounded up to whole blocks
    limits: list[str] = field(default_factory=list)  # why it does not fit, one sentence per limit hit
    videos_per_request: int = 0
    video: object = None  # the VideoPlan of each video ("video: N s at F fps"), None without videos
    breakdown: list[BudgetItem] = field(default_factory=list)
    kv_groups: object = None  # hybrid models: the engine's pools per group (kv_groups.GroupSizes); None otherwise
    full_attention_concurrency: int = 0  # hybrid models: requests at once if every layer were full attention

    @property
    def hybrid(self) -> bool:
        return self.kv_groups is not None


def check_settings(max_model_len, num_seqs, block_size, gpu_memory_utilization, images_per_request, image_size,
                   attn_implementation) -> None:
    """Refuse settings no deployment can have, each with the value that is wrong."""
    for name, value in (("max_model_len", max_model_len), ("num_seqs", num_seqs), ("block_size", block_size)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if not isinstance(images_per_request, int) or images_per_request < 0:
        raise ValueError(f"images_per_request must be an int >= 0, got {images_per_request!r}")
    if len(image_size) != 2 or min(image_size) <= 0:
        raise ValueError(f"image_size must be (width, height) with positive sides, got {image_size!r}")
    if attn_implementation not in ATTENTION:
        raise ValueError(f"attn_implementation must be one of {ATTENTION}, got {attn_implementation!r}")


def images_for(s, images_per_request) -> int:
    """Images per request: None means 1 for a VLM and 0 for a text-only model; a text-only model refuses any."""
    if images_per_request is None:
        return 1 if s.has_vision else 0
    if images_per_request and not s.has_vision:
        raise ValueError(f"{s.family} is a text-only model: images_per_request must be 0, got {images_per_request}")
    return images_per_request


def drafting_head(s, speculative_config) -> int:
    """The MTP head's layers the engine loads for this speculative_config (EngineConfig's: a dict, a
    SpeculativeConfig or None): the config's mtp_num_hidden_layers with method "mtp" (or a vLLM alias), else 0."""
    spec = SpeculativeConfig.parse(speculative_config)
    if spec is None or spec.method != "mtp":
        return 0
    if not s.mtp_layers:
        raise ValueError(f"speculative_config.method 'mtp' needs a model with its own multi-token-prediction head "
                         f"(mtp_num_hidden_layers in its config); this {s.family} config has none")
    return s.mtp_layers


def estimate(model_config, dtype="bfloat16", kv_dtype="auto", max_model_len=4096, num_seqs=8,
             images_per_request=None, image_size=(1024, 768), device_memory_gb=None, gpu_memory_utilization=0.9,
             block_size=16, min_pixels=None, max_pixels=None, *, device=None, device_memory_bytes=None,
             weights_bytes=None, max_num_batched_tokens=None, text_tokens_per_request=512, overhead_bytes=None,
             attn_implementation="sdpa", tensor_parallel_size=None, videos_per_request=0, video_seconds=10.0,
             video_fps=2.0, video_size=None, enable_chunked_prefill=False, state_checkpoints=None,
             state_dtype=STATE_DTYPE, speculative_config=None, max_soft_tokens=None, cfg=None) -> Estimate:
    """The memory plan of one deployment, per GPU (see the module doc for the num_blocks rule).

    image_size is each image's (width, height), as PIL's Image.size; the encoder peak is for one such image, and
    its tokens follow the family's own rule (vision_tokens.image_plan). images_per_request: default 1 for a VLM, 0
    for a text-only model (which refuses images). min_pixels / max_pixels: Qwen-VL only; max_soft_tokens: Gemma 4
    only, its processor's soft-token budget per image (70, 140, 280, 560 or 1120; None: the saved processor's, else
    280), which sets each image's tokens and the patches its encoder sees.
    dtype: float32 | bfloat16 | float16 | int8 | int4 (int weights compute in bfloat16); kv_dtype "auto" = the
    compute dtype, or a float type / fp8. max_num_batched_tokens (the step token budget of the prefill peak)
    defaults to max_model_len. weights_bytes replaces the predicted weights (of one GPU) with measured ones;
    overhead_bytes replaces DEFAULT_OVERHEAD_BYTES. Memory (of one GPU): exactly one of device (preset),
    device_memory_gb (GiB) or device_memory_bytes. tensor_parallel_size: GPUs the model is split over (default:
    the device preset's GPU count, else 1). videos_per_request videos of video_seconds sampled at video_fps, frames
    of video_size (default image_size), cost tokens by the engine's own video rule (budget.video_tokens), and the
    encoder peak covers one whole video (the tower encodes all its frame pairs at once). Hybrid models only:
    enable_chunked_prefill (a sliding request holds its window plus one max_num_batched_tokens chunk, else plus
    max_model_len), state_checkpoints (saved recurrent states; None: 2 per request) and state_dtype (kv_groups).
    speculative_config (EngineConfig's): with method "mtp" the model's multi-token-prediction head is loaded and keeps
    K/V, so its weights and its layers' K/V per token are counted (Qwen3.5's mtp_num_hidden_layers; a config without
    one is refused, as the engine refuses it); any other method, or None, adds nothing. cfg: model_config already
    parsed by hf_config (a caller estimating many deployments of one model parses once; model_config itself still
    names the preset or checkpoint dir whose saved processor settings size the images)."""
    cfg = cfg if cfg is not None else hf_config(model_config)  # parsed once for the whole estimate
    s = model_shape(cfg)
    images_per_request = images_for(s, images_per_request)
    dtype = dtype_name(dtype)
    act_dtype = "bfloat16" if dtype in QUANTIZED else dtype
    kv_dtype = act_dtype if kv_dtype == "auto" else dtype_name(kv_dtype)
    if kv_dtype in QUANTIZED:
        raise ValueError(f"kv_dtype {kv_dtype} is not supported; use a float type or fp8")
    check_settings(max_model_len, num_seqs, block_size, gpu_memory_utilization, images_per_request, image_size,
                   attn_implementation)
    memory = device_memory(device, device_memory_gb, device_memory_bytes)
    tp = tensor_parallel_for(device, tensor_parallel_size)
    check_tensor_parallel(s, tp)
    act, eager = DTYPE_BYTES[act_dtype], attn_implementation == "eager"

    head = drafting_head(s, speculative_config)  # 0, or the MTP head's layers when speculation drafts with it
    mtp = sum(mtp_params(s, tp).values()) if head else 0
    counts = sum(text_params(s, tp).values()) + mtp, sum(vision_params(s, tp).values())  # per GPU
    text_b, vision_b, text_formula, vision_formula = weight_bytes(s, dtype, tp, counts)
    if head:
        text_formula += f"; with the MTP head's {mtp:,} params (fc, norms, {head} layer(s); speculative method mtp)"
    predicted = text_b + vision_b
    used_weights = predicted if weights_bytes is None else int(weights_bytes)
    per_token = kv_bytes_per_token(s, kv_dtype, tp)

    width, height = image_size
    plan = image_plan(model_config, height, width, min_pixels, max_pixels, cfg=cfg, shape=s,
                      max_soft_tokens=max_soft_tokens) if s.has_vision else \
        ImagePlan(0, 0, 0, 0, (0, 0))
    image_tokens = plan.vision_tokens
    video = video_plan(model_config, video_seconds, video_fps, *(video_size or image_size)) if videos_per_request \
        else None
    needed_tokens = images_per_request * plan.tokens + text_tokens_per_request  # + markers (vision start/end)
    needed_tokens += videos_per_request * video.tokens if video else 0
    request_tokens = min(max_model_len, needed_tokens)

    if not images_per_request:
        vis_peak, vis_formula = 0, "no images" if s.has_vision else "text-only model: no vision encoder"
    elif s.vision_kind == "gemma4_patches":  # Gemma 4 12B: no encoder, one projection of merged patches
        vis_peak, vis_formula = patch_embedder_peak(s, plan.patches, act)
    elif s.vision_kind in ("siglip", "internvit", "gemma3_siglip"):
        vis_peak, vis_formula = tiled_vision_peak(s, plan.tiles, plan.patches, act, eager, tp)
    else:
        vis_peak, vis_formula = vision_peak(s, plan.patches, act, eager, tp)
    if video:  # one video's frame pairs go through the tower together
        video_peak, video_formula = vision_peak(s, video.patches, act, eager, tp)
        if video_peak > vis_peak:
            vis_peak, vis_formula = video_peak, f"one video ({video.pairs} frame pairs): {video_formula}"
    step_tokens = max_num_batched_tokens or max_model_len
    llm_peak, llm_formula = prefill_peak(s, step_tokens, min(num_seqs, step_tokens), act, eager, tp)
    peak = max(vis_peak, llm_peak)  # the encoder's activations are freed before the LLM forward runs
    overhead = DEFAULT_OVERHEAD_BYTES if overhead_bytes is None else int(overhead_bytes)

    budget = int(memory * gpu_memory_utilization)
    usable = budget - used_weights - peak - overhead
    kv_heads = kv_heads_per_gpu(s.kv_heads, tp)
    vis_split = vision_split(s, tp)
    on_gpus = f" per GPU, split over {tp} GPUs" if tp > 1 else ""
    kv_split = ("" if tp == 1 else f"; {s.kv_heads} KV heads over {tp} GPUs" +
                (f", each head on {tp // s.kv_heads} GPUs" if s.kv_heads < tp else ""))
    block_bytes = block_size * per_token
    num_blocks = max(0, usable // block_bytes)
    kv_cache = num_blocks * block_bytes
    workload = num_blocks // math.ceil(request_tokens / block_size)
    concurrency = num_blocks / math.ceil(max_model_len / block_size)
    kv_rows = [BudgetItem("KV cache pool", kv_cache, f"{num_blocks} blocks × {block_size} tokens × {per_token:,} "
                          f"B/token (2 · {s.layers} layers · {kv_heads} kv heads · {s.head_dim} head_dim · "
                          f"{DTYPE_BYTES[kv_dtype]} B {kv_dtype}{kv_split})")]
    hybrid = None
    if s.family in HYBRID:  # the engine's KV-cache groups from the same usable memory
        hybrid = hybrid_kv(layer_groups(cfg, tp, state_dtype, mtp=bool(head)), kv_dtype, usable, block_size, num_seqs, step_tokens,
                           enable_chunked_prefill, max_model_len, request_tokens, state_checkpoints, kv_split, head)
        num_blocks, kv_cache, per_token = hybrid.sizes.full_blocks, hybrid.sizes.total_bytes, hybrid.kv_bytes_per_token
        workload, concurrency = hybrid.workload_concurrency, hybrid.sizes.max_concurrency
        kv_rows = [BudgetItem(*row) for row in hybrid.rows]
    vision_note = ("" if tp == 1 or not s.has_vision else f"; split over {tp} GPUs" if vis_split == tp else
                   f"; replicated on each GPU ({s.vision_heads} heads or {s.vision_intermediate} MLP width do not "
                   f"divide by {tp})")
    breakdown = [
        BudgetItem("LLM weights", text_b, text_formula + on_gpus
                   + ("; lm_head tied to the embeddings" if s.tied else "")
                   + (f"; {s.experts} experts of {s.expert_intermediate} ({s.top_k_experts} per token) in every layer: "
                      "planned here, but minivlm builds no experts and refuses to load this model" if s.experts
                      else "")),
        BudgetItem("Vision tower weights", vision_b, vision_formula + vision_note if s.has_vision else
                   "text-only model: no vision tower"),
        BudgetItem("Activation peak", peak, f"max(vision encoder {vis_peak:,}, LLM prefill {llm_peak:,})"),
        BudgetItem("Vision encoder peak (largest image)", vis_peak, vis_formula),
        BudgetItem("LLM prefill peak (step token budget)", llm_peak, llm_formula),
        BudgetItem("Framework overhead", overhead, "CUDA context, library workspaces, allocator fragmentation"),
        *kv_rows,
        *([BudgetItem("Audio tower (not loaded)", 0, f"{sum(audio_params(s).values()):,} params the engine does not "
                      "load: minivlm serves text, images and video, and refuses audio input")] if s.audio_kind else []),
        *([BudgetItem("Measured weights beyond the prediction", used_weights - predicted,
                      f"weights_bytes {used_weights:,} passed in minus the formula's {predicted:,}")]
          if used_weights != predicted else []),
        BudgetItem("Unallocated" if usable >= 0 else "Over budget", budget - used_weights - peak - overhead - kv_cache,
                   f"{gpu_memory_utilization} × {memory:,} B minus all of the above"),
    ]
    est = Estimate(
        weights_bytes=used_weights, predicted_weights_bytes=predicted, text_weights_bytes=text_b,
        vision_weights_bytes=vision_b, num_parameters=sum(text_params(s).values()) + sum(vision_params(s).values())
        + sum(audio_params(s).values()),
        kv_bytes_per_token=per_token, block_size=block_size, num_blocks=num_blocks, kv_cache_bytes=kv_cache,
        max_concurrency=concurrency, vision_tokens_per_image=image_tokens,
        resized_image=plan.resized, tokens_per_request=request_tokens, fits_context=needed_tokens <= max_model_len,
        workload_concurrency=workload, vision_peak_bytes=vis_peak, prefill_peak_bytes=llm_peak,
        activation_peak_bytes=peak, overhead_bytes=overhead, memory_bytes=memory, usable_bytes=usable,
        fits=workload >= num_seqs and needed_tokens <= max_model_len, tensor_parallel_size=tp,
        kv_heads_per_gpu=kv_heads, vision_split=vis_split if s.has_vision else 1,
        images_per_request=images_per_request, image_marker_tokens=plan.marker_tokens, image_tiles=plan.tiles,
        text_only=not s.has_vision,
        text_tokens_per_request=text_tokens_per_request, needed_tokens_per_request=needed_tokens,
        max_model_len=max_model_len, num_seqs=num_seqs, gpu_memory_utilization=gpu_memory_utilization,
        budget_bytes=budget, kv_pool_tokens=num_blocks * block_size,
        kv_demand_tokens=num_seqs * math.ceil(needed_tokens / block_size) * block_size, breakdown=breakdown,
        videos_per_request=videos_per_request, video=video, kv_groups=hybrid.sizes if hybrid else None,
        full_attention_concurrency=hybrid.full_attention_concurrency if hybrid else workload)
    est.limits = why_it_does_not_fit(est)
    return est
