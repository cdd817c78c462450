"""A model's dimensions from any config form: preset name, checkpoint dir, config.json dict or transformers config."""
import json
import os
from dataclasses import dataclass

from transformers import AutoConfig, PreTrainedConfig

from minivlm.families import FAMILIES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESET_DIR = os.path.join(ROOT, "assets", "presets")


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


def model_preset_names() -> list[str]:
    """Names of the shipped model configs (assets/presets/models/*.json), sorted."""
    return sorted(f[:-5] for f in os.listdir(os.path.join(PRESET_DIR, "models")) if f.endswith(".json"))


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
        raise ValueError(f"model_type {model_type!r} is not a supported family; supported: {tuple(FAMILIES)}")
    clean = {k: v for k, v in model_config.items() if not k.startswith("_") and k != "model_type"}
    return AutoConfig.for_model(model_type, **clean)


def model_shape(model_config) -> ModelShape:
    """The dimensions of any accepted config form; Qwen2-VL names its ViT width embed_dim and its output hidden_size."""
    cfg = hf_config(model_config)
    family, t, v = cfg.model_type, cfg.text_config, cfg.vision_config
    if family not in FAMILIES:
        raise ValueError(f"model_type {family!r} is not a supported family; supported: {tuple(FAMILIES)}")
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
