"""Gemma 4's parameter counts per GPU, module by module as transformers 5.23's modeling_gemma4.py and
modeling_gemma4_unified.py build them (the tests compare them with models built on the meta device).

Decoder layer i: q_proj and o_proj at the layer's head_dim (global_head_dim on full layers), q_norm; k_proj, v_proj
(none where attention_k_eq_v holds on a full layer: the keys are the values' projection too) and k_norm only where
the layer computes its own K/V (a shared layer has none: published checkpoints store them, transformers drops
them); the gated MLP, twice as wide on E2B's shared layers; four norms; the per-layer-embedding gate, projection
and norm; the 26B-A4B's router and 128 experts beside the dense MLP, with three more norms. Model-wide: the token
embedding, the per-layer embedding table over vocab_size_per_layer_input with its projection from the hidden state
and norm, the final norm. Towers: the ViT (patch projection without bias, a 2 x rows x width position table, blocks
with q/k norms and four norms), or the 12B's patch embedder (LayerNorms, one dense, a factorized position table);
then the projection into the text width. Audio (counted, not loaded by minivlm): the conformer of E2B / E4B, or
the 12B's projection of raw waveform frames.

Over N GPUs (tensor_parallel.py, vLLM's Gemma 4 layout): q / gate / up / the experts' width and the per-layer-
embedding projection split their outputs, o / down their inputs, k / v by the layer's own KV heads (a copy each
where there are fewer than GPUs), both embedding tables the vocabulary; the router and the per-layer gate and
projection are replicated. Counted as transformers and minivlm build the layers: vLLM itself also allocates a V
projection on attention_k_eq_v layers and K / V ones on the shared layers (loading the keys into both), which this
count leaves out."""
from minivlm.budget.linears import LinearShape, column, row
from minivlm.budget.shapes import ModelShape
from minivlm.budget.tensor_parallel import kv_heads_per_gpu, split, vision_split, vocab_per_gpu


def gemma4_layer_linears(s: ModelShape, i: int, tp: int = 1) -> list[LinearShape]:
    """The Linear layers (and the experts' matrices, as linears) of decoder layer i on one GPU."""
    kv_heads, head_dim = s.layer_kv[i]
    full, bias = s.kinds[i] == "full_attention", s.attention_bias
    q, kv = s.heads * head_dim, kv_heads_per_gpu(kv_heads, tp) * head_dim
    linears = [column("q_proj", q, s.hidden, bias, tp)]
    if i not in s.shared_kv:  # a shared layer reads another layer's K/V: no projections of its own
        linears.append(LinearShape("k_proj", kv, s.hidden, bias))
        if not (s.k_eq_v and full):
            linears.append(LinearShape("v_proj", kv, s.hidden, bias))
    linears.append(row("o_proj", s.hidden, q, bias, tp))
    width = s.intermediate * (2 if s.double_wide_mlp and i in s.shared_kv else 1)
    linears += [column("gate_proj", width, s.hidden, False, tp), column("up_proj", width, s.hidden, False, tp),
                row("down_proj", s.hidden, width, False, tp)]
    if s.ple_dim:  # the per-layer input: gate down to ple_dim, project back up
        linears += [LinearShape("per_layer_input_gate", s.ple_dim, s.hidden),
                    LinearShape("per_layer_projection", s.hidden, s.ple_dim)]
    if s.experts:  # the router and every expert's fused gate/up and down, split like the dense MLP
        e, m = s.experts, s.expert_intermediate
        linears += [LinearShape("router.proj", e, s.hidden), column("experts.gate_up_proj", e * 2 * m, s.hidden, False,
                                                                    tp), row("experts.down_proj", e * s.hidden, m,
                                                                             False, tp)]
    return linears


def gemma4_layer_params(s: ModelShape, i: int, tp: int = 1) -> int:
    """Parameters of decoder layer i on one GPU: its linears, q_norm (and k_norm where it projects K/V), four norms
    around attention and MLP, the per-layer input's norm, and the router's scales and the experts' three norms."""
    head_dim = s.layer_kv[i][1]
    params = sum(lin.params for lin in gemma4_layer_linears(s, i, tp)) + 4 * s.hidden
    params += head_dim * (1 if i in s.shared_kv else 2)  # q_norm; k_norm (v_norm has no scale)
    params += s.hidden if s.ple_dim else 0  # post_per_layer_input_norm
    if s.experts:  # router.scale, router.per_expert_scale; post_feedforward_layernorm_1/_2, pre_feedforward_layernorm_2
        params += s.hidden + s.experts + 3 * s.hidden
    return params


def gemma4_text_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """The language model on one GPU by part (lm_head 0: Gemma ties it to the embedding)."""
    rows = vocab_per_gpu(s.vocab, tp)
    ple = 0
    if s.ple_dim:  # the table (vocab-parallel like the embedding), its projection from the hidden state (column-
        # parallel: vLLM splits its layers x ple_dim outputs and gathers them), its norm
        ple = vocab_per_gpu(s.ple_vocab, tp) * s.layers * s.ple_dim + s.ple_dim + \
            column("per_layer_model_projection", s.layers * s.ple_dim, s.hidden, False, tp).params
    return {"embed_tokens": rows * s.hidden, "per_layer_embeddings": ple,
            "decoder_layers": sum(gemma4_layer_params(s, i, tp) for i in range(s.layers)),
            "final_norm": s.hidden, "lm_head": 0 if s.tied else rows * s.hidden}


def gemma4_vision_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """gemma4's ViT on one GPU (split like the Qwen towers when heads and MLP width divide) and its projection."""
    w, i, n = s.vision_width, s.vision_intermediate, vision_split(s, tp)
    heads, kv_heads, head_dim = s.vision_heads, s.vision_kv_heads or s.vision_heads, s.vision_head_dim
    attn = (column("q", heads * head_dim, w, False, n).params + 2 * column("kv", kv_heads * head_dim, w, False,
                                                                           n).params
            + row("o", w, heads * head_dim, False, n).params + 2 * head_dim)  # + q_norm, k_norm
    mlp = 2 * column("gate_up", i, w, False, n).params + row("down", w, i, False, n).params
    return {"patch_embed": s.in_channels * s.patch_size ** 2 * w,
            "pos_embed": 2 * s.num_position_embeddings * w,
            "vision_blocks": s.vision_depth * (attn + mlp + 4 * w),
            "merger": s.vision_proj_in * s.vision_out}  # embed_vision: RMSNorm without scale, one matrix


def gemma4_patch_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """gemma4_unified's encoder-free embedder (replicated): LayerNorm over the (patch · pool)² · 3 pixels, a dense
    layer with bias to mm_embed_dim, LayerNorm, the factorized position table (rows x 2 axes), LayerNorm, then the
    projection into the text width."""
    pixels, w = (s.patch_size * s.merge_size) ** 2 * s.in_channels, s.vision_width
    return {"patch_embed": 2 * pixels + pixels * w + w + 2 * w,
            "pos_embed": s.num_position_embeddings * 2 * w + 2 * w,
            "vision_blocks": 0,
            "merger": s.vision_proj_in * s.vision_out}


def gemma4_audio_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """The audio tower and its projection into the text width (none without one). E2B / E4B's conformer: two
    stride-2 3x3 convs with LayerNorms, an input projection, and per layer two macaron feed-forwards (w → 4w → w,
    two norms each), attention (q/k/v/post and a relative-position key projection, a per-dim scale), a light conv
    (w → 2w, depthwise, w → w, two norms) and three norms; an output projection with bias."""
    if s.audio_kind == "gemma4_frames":  # 12B: raw waveform frames, RMSNorm without scale, one matrix
        return {"audio_tower": 0, "embed_audio": s.audio_out * s.hidden}
    if not s.audio_kind:
        return {}
    w, (c0, c1), k = s.audio_width, s.audio_conv_channels, s.audio_conv_kernel
    subsample = 9 * c0 + c0 + 9 * c0 * c1 + c1 + (c0 // 4) * c1 * w
    feed_forward = 8 * w * w + 2 * w
    attention = 5 * w * w + w // s.audio_heads
    light_conv = 3 * w * w + w * k + 2 * w
    layer = 2 * feed_forward + attention + light_conv + 3 * w
    return {"audio_tower": subsample + s.audio_depth * layer + w * s.audio_out + s.audio_out,
            "embed_audio": s.audio_out * s.hidden}


GEMMA4_TOWERS = {"gemma4_vision": gemma4_vision_params, "gemma4_patches": gemma4_patch_params}
