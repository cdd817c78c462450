"""Peak live activation bytes on one GPU: the vision encoder on one image, and one LLM forward over a step."""
from minivlm.budget.shapes import QWEN3_TOWERS, ModelShape
from minivlm.budget.tensor_parallel import kv_heads_per_gpu, split, vision_split


def vision_peak(s: ModelShape, patches: int, act: int, eager: bool, tp: int = 1) -> tuple[int, str]:
    """Live bytes at the peak of encoding one image of `patches` ViT patches (images are encoded one by one); with a
    split tower the head- and MLP-wide tensors are split, the block-wide ones are not."""
    w, i, head_dim, n = s.vision_width, s.vision_intermediate, s.vision_width // s.vision_heads, vision_split(s, tp)
    pixels = patches * s.in_channels * s.temporal_patch_size * s.patch_size ** 2 * 4  # float32 pixel_values
    # MLP intermediates alive at once: gated SiLU (2.5) holds gate, up, product; quick_gelu (2) fc1, sigmoid, product;
    # Qwen3's fused tanh-GELU only fc1 and its output
    qwen3 = s.family in QWEN3_TOWERS
    mlp_live = 2 if qwen3 else 3
    # block input + residual + normed input, plus the attention (q, k, v, rotated q/k, output: 6 widths) or the
    # MLP intermediates; rotary cos/sin; Qwen3-VL also keeps the patch + position-table sum alive
    attn, mlp = 3 * w + 6 * split(w, n), 3 * w + mlp_live * split(i, n)
    per_patch = max(attn, mlp) + 2 * head_dim + (w if qwen3 else 0)
    deepstack = s.deepstack * (patches // s.merge_size ** 2) * s.vision_out  # kept for the LLM until the end
    scores = split(s.vision_heads, n) * patches ** 2 * (act + 4) if eager else 0  # eager: scores + fp32 softmax
    total = pixels + (patches * per_patch + deepstack) * act + scores
    return total, (f"{patches} patches × (max({attn} attention, {mlp} MLP) + 2·{head_dim}"
                   + (f" + {w}" if qwen3 else "") + f") · {act} B + float32 pixel values"
                   + (f" + {s.deepstack} deepstack features" if s.deepstack else "")
                   + (f" + {split(s.vision_heads, n)} heads × {patches}² eager scores" if eager else ""))


def patch_embedder_peak(s: ModelShape, positions: int, act: int) -> tuple[int, str]:
    """Gemma 4 12B's encoder-free embedder over one image's `positions` merged patches: the float32 pixels, then
    per position its LayerNormed pixels, the dense output, its norm, the position sum and the norm after it."""
    pixels = (s.patch_size * s.merge_size) ** 2 * s.in_channels
    return (positions * pixels * 4 + positions * (pixels + 4 * s.vision_width) * act,
            f"{positions} merged patches × ({pixels} pixels + 4 · {s.vision_width}) · {act} B + float32 pixel values"
            " (no encoder layers)")


def tiled_vision_peak(s: ModelShape, tiles: int, patches: int, act: int, eager: bool, tp: int = 1) -> tuple[int, str]:
    """Live bytes at the peak of encoding one image's `tiles` tiles as one batch (`patches` ViT positions over all of
    them): as vision_peak, without rotary tables, with q/k/v/output (4 widths) in attention and fc1 + GELU (2) in the
    MLP; eager attention materialises heads x tile positions² per tile."""
    w, i, n = s.vision_width, s.vision_intermediate, vision_split(s, tp)
    side = s.vision_image_size
    pixels = tiles * s.in_channels * side * side * 4  # float32 pixel_values
    attn, mlp = 3 * w + 4 * split(w, n), 3 * w + 2 * split(i, n)
    per_tile = patches // max(tiles, 1)
    scores = split(s.vision_heads, n) * tiles * per_tile ** 2 * (act + 4) if eager else 0
    return (pixels + patches * max(attn, mlp) * act + scores,
            f"{tiles} tiles × {per_tile} positions × max({attn} attention, {mlp} MLP) · {act} B + float32 pixel values"
            + (f" + {split(s.vision_heads, n)} heads × {tiles} × {per_tile}² eager scores" if eager else ""))


def prefill_peak(s: ModelShape, tokens: int, num_seqs: int, act: int, eager: bool, tp: int = 1) -> tuple[int, str]:
    """Live bytes at the peak of one LLM forward over `tokens` step tokens on one GPU (paged attention: no tokens²
    term); the last-position logits are gathered whole on every GPU."""
    h, heads = s.hidden, split(s.heads, tp)
    q, kv = heads * s.head_dim, kv_heads_per_gpu(s.kv_heads, tp) * s.head_dim
    if s.layer_kv:  # Gemma 4: the widest layer (its full layers' global_head_dim)
        q = heads * max(d for _, d in s.layer_kv)
        kv = max(kv_heads_per_gpu(n, tp) * d for n, d in s.layer_kv)
    qk_norm = s.text_family in ("qwen3", "qwen3_5", "gemma3", "gemma4")
    attn = 3 * h + 3 * q + 3 * kv + (q + kv if qk_norm else 0)  # + q/k norm outputs (Qwen3, Qwen3.5, Gemma 3)
    attn += q if s.text_family == "qwen3_5" else 0  # Qwen3.5's output gate, as wide as the queries
    mlp = 3 * h + 3 * split(s.intermediate, tp)
    linear = linear_attention_width(s, tp, act)
    per_token = max(attn, mlp, linear) + 2 * s.head_dim  # layer input, residual, normed + rotary
    logits = num_seqs * s.vocab * (act + 4)  # last-position logits per sequence, upcast to float32 for sampling
    scores = heads * tokens ** 2 * (act + 4) if eager else 0
    return (tokens * per_token * act + logits + scores,
            f"{tokens} tokens × (max({attn} attention, " + (f"{linear} linear attention, " if linear else "")
            + f"{mlp} MLP) + 2·{s.head_dim}) · {act} B"
            f" + {num_seqs} × {s.vocab} logits · ({act}+4) B"
            + (f" + {heads} heads × {tokens}² eager scores" if eager else ""))


def linear_attention_width(s: ModelShape, tp: int, act: int) -> int:
    """Per-token activation width of a Gated DeltaNet layer (Qwen3.5), 0 without one: layer input, residual, normed
    input, the fused q/k/v before and after the conv, the gate z and the output, and the float32 copies of q/k/v the
    delta rule computes in (an estimate from modeling_qwen3_5; not measured against HF like the other peaks)."""
    if "linear_attention" not in s.kinds:
        return 0
    conv, value = split(s.conv_dim, tp), split(s.linear_v_heads * s.linear_v_dim, tp)
    return 3 * s.hidden + 2 * conv + 2 * value + conv * 4 // act
