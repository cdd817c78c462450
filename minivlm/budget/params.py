"""Exact parameter counts per GPU, read off a config (no weights, no model instantiation).

The decoders (Qwen2, Qwen3, Llama layouts; the hybrid Qwen3.5 and Gemma 3, whose layers differ by kind) and the
Qwen-VL towers are here, the tiled towers (SmolVLM, InternVL, Gemma 3's SigLIP) in params_tiled.py. Each count
mirrors one module of transformers' modeling code, split over tp GPUs as tensor_parallel.py says; the tests check
the totals against models built on the meta device (whole and sharded) and against the tensors stored in real
checkpoints.
"""
from minivlm.budget.linears import LinearShape, column, row  # noqa: F401 (LinearShape: imported from here too)
from minivlm.budget.params_gemma4 import GEMMA4_TOWERS, gemma4_audio_params, gemma4_layer_linears, gemma4_text_params
from minivlm.budget.params_tiled import TILED_TOWERS
from minivlm.budget.shapes import QWEN3_TOWERS, ModelShape, model_shape
from minivlm.budget.tensor_parallel import kv_heads_per_gpu, split, vision_split, vocab_per_gpu


def decoder_linears(s: ModelShape, tp: int = 1, kind: str = "full_attention") -> list[LinearShape]:
    """The Linear layers of one LLM decoder layer of `kind` on one GPU: GQA projections (biased q/k/v in Qwen2/2.5;
    Qwen3.5's q_proj twice as wide: queries and their output gate) or Qwen3.5's Gated DeltaNet projections, and the
    gated MLP (biased only where a Llama config sets mlp_bias). Gemma 4: the first layer of that kind's."""
    if s.text_family == "gemma4":
        return gemma4_layer_linears(s, s.kinds.index(kind), tp)
    mlp = [column("gate_proj", s.intermediate, s.hidden, s.mlp_bias, tp),
           column("up_proj", s.intermediate, s.hidden, s.mlp_bias, tp),
           row("down_proj", s.hidden, s.intermediate, s.mlp_bias, tp)]
    if kind == "linear_attention":  # q/k/v fused before the conv, the output gate z, per-head beta (b) and decay (a)
        value = s.linear_v_heads * s.linear_v_dim
        return [column("in_proj_qkv", s.conv_dim, s.hidden, False, tp), column("in_proj_z", value, s.hidden, False, tp),
                column("in_proj_b", s.linear_v_heads, s.hidden, False, tp),
                column("in_proj_a", s.linear_v_heads, s.hidden, False, tp),
                row("out_proj", s.hidden, value, False, tp)] + mlp
    qkv_bias = s.text_family == "qwen2" or s.attention_bias  # Qwen2/2.5: q/k/v always biased; the others: a flag
    o_bias = s.text_family != "qwen2" and s.attention_bias
    q, kv = s.heads * s.head_dim, kv_heads_per_gpu(s.kv_heads, tp) * s.head_dim
    gate = 2 if s.text_family == "qwen3_5" else 1
    return [column("q_proj", gate * q, s.hidden, qkv_bias, tp), LinearShape("k_proj", kv, s.hidden, qkv_bias),
            LinearShape("v_proj", kv, s.hidden, qkv_bias), row("o_proj", s.hidden, q, o_bias, tp)] + mlp


def layer_params(s: ModelShape, kind: str, tp: int = 1) -> int:
    """Parameters of one decoder layer of `kind` on one GPU: its Linear layers, its norms (Gemma 3: four around
    attention and MLP; the others two) and, in a Gated DeltaNet layer, the conv and the per-head decay and norm."""
    params = sum(lin.params for lin in decoder_linears(s, tp, kind))
    params += (4 if s.text_family == "gemma3" else 2) * s.hidden
    if kind == "linear_attention":  # depthwise conv (no bias), dt_bias and A_log per value head, gated RMSNorm
        return params + split(s.conv_dim, tp) * s.linear_conv_kernel + 2 * split(s.linear_v_heads, tp) + s.linear_v_dim
    if s.text_family in ("qwen3", "qwen3_5", "gemma3"):
        params += 2 * s.head_dim  # q_norm and k_norm over the head dim
    return params


def layer_linears(s: ModelShape, tp: int = 1) -> list[list[LinearShape]]:
    """Every decoder layer's Linear layers on one GPU, in order (Gemma 4's differ layer by layer: params_gemma4)."""
    if s.text_family == "gemma4":
        return [gemma4_layer_linears(s, i, tp) for i in range(s.layers)]
    return [decoder_linears(s, tp, kind) for kind in s.kinds]


def text_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """LLM parameters on one GPU by part; lm_head is 0 when tied (it shares the embedding's storage)."""
    if s.text_family == "gemma4":  # per-layer K/V shapes, shared layers, per-layer embeddings, experts
        return gemma4_text_params(s, tp)
    per_kind = {kind: layer_params(s, kind, tp) for kind in set(s.kinds)}
    rows = vocab_per_gpu(s.vocab, tp)
    return {"embed_tokens": rows * s.hidden, "decoder_layers": sum(per_kind[kind] for kind in s.kinds),
            "final_norm": s.hidden, "lm_head": 0 if s.tied else rows * s.hidden}


def mtp_linears(s: ModelShape, tp: int = 1) -> list[LinearShape]:
    """The Linear layers of Qwen3.5's multi-token-prediction head on one GPU: fc over [normed embedding; normed hidden
    state] (2·hidden -> hidden), then its full-attention decoder layers' (the head shares embed_tokens and lm_head)."""
    return [column("fc", s.hidden, 2 * s.hidden, False, tp)] + \
        [lin for _ in range(s.mtp_layers) for lin in decoder_linears(s, tp, "full_attention")]


def mtp_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """The MTP head's parameters on one GPU by part (model/qwen3_5_mtp.py): fc, its norms (pre_fc_norm_embedding,
    pre_fc_norm_hidden and the final norm) and its full-attention layers; {} for a model without a head. Loaded only
    when speculation drafts with it (speculative_config method "mtp"), so not part of parameter_count."""
    if not s.mtp_layers:
        return {}
    return {"mtp_fc": column("fc", s.hidden, 2 * s.hidden, False, tp).params, "mtp_norms": 3 * s.hidden,
            "mtp_layers": s.mtp_layers * layer_params(s, "full_attention", tp)}


def vision_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """Vision tower parameters on one GPU by part: patch embed, position table, blocks, merger, deepstack mergers (a
    tiled tower's parts: params_tiled.py; none for a text-only model)."""
    if s.vision_kind in TILED_TOWERS:
        return TILED_TOWERS[s.vision_kind](s, tp)
    if s.vision_kind in GEMMA4_TOWERS:
        return GEMMA4_TOWERS[s.vision_kind](s, tp)
    if not s.has_vision:
        return {}
    w, i, out, merged = s.vision_width, s.vision_intermediate, s.vision_out, s.vision_width * s.merge_size ** 2
    n = vision_split(s, tp)
    conv = s.in_channels * s.temporal_patch_size * s.patch_size ** 2 * w
    attn = column("qkv", 3 * w, w, True, n).params + row("proj", w, w, True, n).params
    if s.family == "qwen2_5_vl":  # RMSNorms (weight only), gated MLP with biases, RMSNorm before the merger
        mlp = 2 * column("up", i, w, True, n).params + row("down", w, i, True, n).params
        norms, merger_norm = 2 * w, w
    else:  # LayerNorms (weight + bias), plain fc1 -> GELU -> fc2 with biases
        mlp = column("fc1", i, w, True, n).params + row("fc2", w, i, True, n).params
        norms, merger_norm = 4 * w, 2 * w
    merger_mlp = column("fc1", merged, merged, True, n).params + row("fc2", out, merged, True, n).params
    qwen3 = s.family in QWEN3_TOWERS
    return {"patch_embed": conv + (w if qwen3 else 0),  # only Qwen3's patch conv has a bias
            "pos_embed": s.num_position_embeddings * w if qwen3 else 0,
            "vision_blocks": s.vision_depth * (norms + attn + mlp),
            "merger": merger_norm + merger_mlp,
            "deepstack_mergers": s.deepstack * (2 * merged + merger_mlp)}  # LayerNorm after the 2x2 shuffle


def audio_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """Audio tower parameters by part (Gemma 4 E2B / E4B / 12B; none for the others): counted in the model's size,
    not in the weights minivlm loads (it serves text, images and video)."""
    return gemma4_audio_params(s, tp)


def parameter_count(model_config, tp: int = 1) -> int:
    """Unique parameters of the whole model on one of tp GPUs (a tied lm_head counted once), as model.parameters()
    counts them (tp = 1: the whole model), an audio tower included."""
    s = model_config if isinstance(model_config, ModelShape) else model_shape(model_config)
    return sum(text_params(s, tp).values()) + sum(vision_params(s, tp).values()) + sum(audio_params(s, tp).values())
