"""Parameter counts of the tiled vision towers and their projectors, per GPU.

SmolVLM / Idefics3: a SigLIP ViT (modeling_smolvlm's SmolVLMVisionTransformer) and a bias-free Linear after the
scale x scale pixel shuffle. InternVL: InternViT (modeling_internvl's InternVLVisionModel: CLS token, layer scales)
and a LayerNorm -> Linear -> GELU -> Linear projector. Gemma 3: transformers' SiglipVisionModel on one 896-px image
and its projector (modeling_gemma3's Gemma3MultiModalProjector: average pooling, an RMSNorm, one bias-free matrix). With tensor parallelism the ViT splits like the Qwen towers
(column q/k/v and fc1, row out-projection and fc2, when heads and MLP width divide); the projectors are replicated,
as vLLM builds them from ReplicatedLinear.
"""
from minivlm.budget.shapes import ModelShape
from minivlm.budget.tensor_parallel import split, vision_split


def linear(out_features: int, in_features: int, bias: bool = True) -> int:
    """Parameters of one nn.Linear (weight out x in, optional bias of size out)."""
    return out_features * in_features + (out_features if bias else 0)


def vit_block(s: ModelShape, n: int, attn_bias: bool, norm: int, extra: int = 0) -> int:
    """One ViT block on one of n GPUs: q/k/v column-split (their biases with them), the output projection and fc2
    row-split (bias whole), fc1 column-split; two norms of `norm` params each, plus `extra` (layer scales, q/k
    norms) that are replicated."""
    w, i = s.vision_width, s.vision_intermediate
    qkv = 3 * linear(split(w, n), w, attn_bias)
    proj = linear(w, split(w, n), False) + w
    mlp = linear(split(i, n), w) + linear(w, split(i, n), False) + w
    return qkv + proj + mlp + 2 * norm + extra


def patches_per_tile(s: ModelShape) -> int:
    """ViT patches of one tile: (tile side / patch side)²."""
    return (s.vision_image_size // s.patch_size) ** 2


def siglip_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """SmolVLM / Idefics3: patch conv (+bias), one learned position per patch, LayerNorm blocks, a post-LayerNorm,
    and the connector: (width · scale²) -> text hidden, no bias."""
    w, n = s.vision_width, vision_split(s, tp)
    return {"patch_embed": s.in_channels * s.patch_size ** 2 * w + w,
            "pos_embed": patches_per_tile(s) * w,
            "vision_blocks": s.vision_depth * vit_block(s, n, True, 2 * w),
            "post_layernorm": 2 * w,
            "merger": linear(s.vision_out, w * s.pixel_shuffle ** 2, False)}


def internvit_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """InternViT: CLS (and mask) token, patch conv (+bias), positions for CLS + patches, blocks with layer scales
    (lambda_1/2) and optional q/k RMSNorms over the width, a final LayerNorm unless mean pooling; the projector
    LayerNorm(width · scale²) -> Linear -> GELU -> Linear(text hidden)."""
    w, n = s.vision_width, vision_split(s, tp)
    norm = w if s.vision_rms_norm else 2 * w
    extra = 2 * w + (2 * w if s.vision_qk_norm else 0)
    shuffled = w * s.pixel_shuffle ** 2
    return {"patch_embed": s.in_channels * s.patch_size ** 2 * w + w + w * (1 + s.vision_mask_token),
            "pos_embed": (patches_per_tile(s) + 1) * w if s.vision_abs_pos else 0,
            "vision_blocks": s.vision_depth * vit_block(s, n, s.vision_attention_bias, norm, extra),
            "post_layernorm": 0 if s.vision_mean_pooling else 2 * w,
            "merger": 2 * shuffled + linear(s.vision_out, shuffled) + linear(s.vision_out, s.vision_out)}


def gemma3_siglip_params(s: ModelShape, tp: int = 1) -> dict[str, int]:
    """Gemma 3: SigLIP's patch conv (+bias), positions, LayerNorm blocks and post-LayerNorm, the attention-pooling head
    where the config keeps it (probe, nn.MultiheadAttention, LayerNorm, MLP), and the projector: RMSNorm over the
    width and a width x text-hidden matrix (the 4x4 average pooling has no parameters)."""
    w, i, n = s.vision_width, s.vision_intermediate, vision_split(s, tp)
    head = w + 4 * w * w + 4 * w + 2 * w + linear(i, w) + linear(w, i) if s.vision_use_head else 0
    return {"patch_embed": s.in_channels * s.patch_size ** 2 * w + w,
            "pos_embed": patches_per_tile(s) * w,
            "vision_blocks": s.vision_depth * vit_block(s, n, True, 2 * w),
            "post_layernorm": 2 * w + head,
            "merger": w + w * s.vision_out}


TILED_TOWERS = {"siglip": siglip_params, "internvit": internvit_params, "gemma3_siglip": gemma3_siglip_params}
