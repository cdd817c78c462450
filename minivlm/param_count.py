"""Exact parameter counts of the Qwen-VL families, read off a config (no weights, no model instantiation).

Each count mirrors one module of transformers' modeling_qwen2_vl / qwen2_5_vl / qwen3_vl; the tests check the
totals against models built on the meta device and against the tensors stored in real checkpoints.
"""
import json
import os
from dataclasses import dataclass

from transformers import AutoConfig, PreTrainedConfig

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
PRESET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "presets")


@dataclass(frozen=True)
class Linear:
    """One nn.Linear (or the matrix of a conv / embedding): weight out x in, optional bias of size out."""
    name: str
    out_features: int
    in_features: int
    bias: bool = False

    @property
    def params(self) -> int:
        return self.out_features * self.in_features + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class ModelShape:
    """What the budget needs from a config: text dims, vision dims, tying. All counts are per model."""
    family: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    attention_bias: bool
    vision_width: int
    vision_intermediate: int
    vision_depth: int
    vision_heads: int
    vision_out: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    in_channels: int
    num_position_embeddings: int
    deepstack: int


def load_model_preset(name: str) -> dict:
    """A shipped model config by name ('Qwen2.5-VL-3B-Instruct' or 'Qwen/Qwen2.5-VL-3B-Instruct', any case)."""
    folder = os.path.join(PRESET_DIR, "models")
    stems = {f[:-5].lower(): f for f in os.listdir(folder) if f.endswith(".json")}
    key = name.split("/")[-1].lower()
    if key not in stems:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(f[:-5] for f in stems.values())}")
    with open(os.path.join(folder, stems[key])) as f:
        return json.load(f)


def hf_config(model_config) -> PreTrainedConfig:
    """Normalise a preset name, a checkpoint dir, a config.json dict (flat or nested) or a config to transformers'."""
    if isinstance(model_config, PreTrainedConfig):
        return model_config
    if isinstance(model_config, str):
        path = os.path.join(model_config, "config.json")
        if os.path.isfile(path):
            with open(path) as f:
                model_config = json.load(f)
        else:
            model_config = load_model_preset(model_config)
    if not isinstance(model_config, dict):
        raise ValueError(f"model_config must be a preset name, dir, dict or PretrainedConfig, got {type(model_config)}")
    model_type = model_config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not a supported family; supported: {FAMILIES}")
    clean = {k: v for k, v in model_config.items() if not k.startswith("_") and k != "model_type"}
    return AutoConfig.for_model(model_type, **clean)


def model_shape(model_config) -> ModelShape:
    """The dimensions of any accepted config form; Qwen2-VL names its ViT width embed_dim and its output hidden_size."""
    cfg = hf_config(model_config)
    family, t, v = cfg.model_type, cfg.text_config, cfg.vision_config
    if family not in FAMILIES:
        raise ValueError(f"model_type {family!r} is not a supported family; supported: {FAMILIES}")
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    if family == "qwen2_vl":
        width, out, inter = v.embed_dim, v.hidden_size, int(v.embed_dim * v.mlp_ratio)
    else:
        width, out, inter = v.hidden_size, v.out_hidden_size, v.intermediate_size
    return ModelShape(
        family=family, vocab=t.vocab_size, hidden=t.hidden_size, intermediate=t.intermediate_size,
        layers=t.num_hidden_layers, heads=t.num_attention_heads, kv_heads=t.num_key_value_heads or
        t.num_attention_heads, head_dim=head_dim, tied=bool(cfg.tie_word_embeddings),
        attention_bias=bool(getattr(t, "attention_bias", False)), vision_width=width,
        vision_intermediate=inter, vision_depth=v.depth, vision_heads=v.num_heads, vision_out=out,
        patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size,
        in_channels=v.in_channels, num_position_embeddings=getattr(v, "num_position_embeddings", 0) or 0,
        deepstack=len(getattr(v, "deepstack_visual_indexes", None) or ()))


def decoder_linears(s: ModelShape) -> list[Linear]:
    """The Linear layers of one LLM decoder layer: GQA projections (biased q/k/v in Qwen2/2.5) and the SwiGLU MLP."""
    qkv_bias = s.family != "qwen3_vl" or s.attention_bias  # Qwen2/2.5: q/k/v always biased; Qwen3: a config flag
    o_bias = s.family == "qwen3_vl" and s.attention_bias
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return [Linear("q_proj", q, s.hidden, qkv_bias), Linear("k_proj", kv, s.hidden, qkv_bias),
            Linear("v_proj", kv, s.hidden, qkv_bias), Linear("o_proj", s.hidden, q, o_bias),
            Linear("gate_proj", s.intermediate, s.hidden), Linear("up_proj", s.intermediate, s.hidden),
            Linear("down_proj", s.hidden, s.intermediate)]


def text_params(s: ModelShape) -> dict[str, int]:
    """LLM parameters by part; lm_head is 0 when tied (it shares the embedding's storage)."""
    per_layer = sum(lin.params for lin in decoder_linears(s)) + 2 * s.hidden  # + input / post-attention RMSNorm
    if s.family == "qwen3_vl":
        per_layer += 2 * s.head_dim  # q_norm and k_norm over the head dim
    return {"embed_tokens": s.vocab * s.hidden, "decoder_layers": s.layers * per_layer, "final_norm": s.hidden,
            "lm_head": 0 if s.tied else s.vocab * s.hidden}


def vision_params(s: ModelShape) -> dict[str, int]:
    """Vision tower parameters by part: patch embed, position table, blocks, merger, deepstack mergers."""
    w, i, out, merged = s.vision_width, s.vision_intermediate, s.vision_out, s.vision_width * s.merge_size ** 2
    conv = s.in_channels * s.temporal_patch_size * s.patch_size ** 2 * w
    attn = Linear("qkv", 3 * w, w, True).params + Linear("proj", w, w, True).params
    if s.family == "qwen2_5_vl":  # RMSNorms (weight only), gated MLP with biases, RMSNorm before the merger
        norms, mlp, merger_norm = 2 * w, 2 * Linear("up", i, w, True).params + Linear("down", w, i, True).params, w
    else:  # LayerNorms (weight + bias), plain fc1 -> GELU -> fc2 with biases
        norms, mlp, merger_norm = 4 * w, Linear("fc1", i, w, True).params + Linear("fc2", w, i, True).params, 2 * w
    merger_mlp = Linear("fc1", merged, merged, True).params + Linear("fc2", out, merged, True).params
    parts = {"patch_embed": conv + (w if s.family == "qwen3_vl" else 0),  # only Qwen3's patch conv has a bias
             "pos_embed": s.num_position_embeddings * w if s.family == "qwen3_vl" else 0,
             "vision_blocks": s.vision_depth * (norms + attn + mlp),
             "merger": merger_norm + merger_mlp,
             "deepstack_mergers": s.deepstack * (2 * merged + merger_mlp)}  # LayerNorm after the 2x2 shuffle
    return parts


def parameter_count(model_config) -> int:
    """Unique parameters of the whole model (a tied lm_head counted once), as model.parameters() counts them."""
    s = model_config if isinstance(model_config, ModelShape) else model_shape(model_config)
    return sum(text_params(s).values()) + sum(vision_params(s).values())
