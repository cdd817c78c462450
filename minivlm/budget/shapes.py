"""A model's dimensions from any config form: preset name, checkpoint dir, config.json dict or transformers config.

The calculator's families are its own (not the engine's registry): the Qwen-VL ones, the tiled VLMs SmolVLM /
Idefics3 and InternVL, the text-only Qwen2 / Qwen3 decoders, and the hybrid ones whose layers keep different things
between steps (kv_groups.py): Qwen3.5 (Gated DeltaNet recurrent layers, every 4th full attention), Gemma 3
(sliding-window layers, every 6th full attention) and Gemma 4 (sliding and full layers of different head sizes, the
last layers reading earlier layers' K/V: shapes_gemma4.py)."""
import json
import os
from dataclasses import dataclass

from transformers import AutoConfig, PreTrainedConfig

from minivlm.budget.shapes_gemma4 import GEMMA4, gemma4_audio_dims, gemma4_text_dims, gemma4_vision_dims


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESET_DIR = os.path.join(ROOT, "assets", "presets")
QWEN_VL = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TILED = ("smolvlm", "idefics3", "internvl")  # vision towers on fixed-size tiles, then a pixel-shuffle projector
TEXT_ONLY = ("qwen2", "qwen3")
HYBRID = ("qwen3_5", "gemma3") + GEMMA4  # decoder layers of more than one kind (kv_groups.py)
SUPPORTED = QWEN_VL + TILED + TEXT_ONLY + HYBRID
QWEN_PATCHES = QWEN_VL + ("qwen3_5",)  # native-resolution patches, resized by smart_resize
QWEN3_TOWERS = ("qwen3_vl", "qwen3_5")  # Qwen3-VL's tower layout (Qwen3.5's is the same without deepstack)
TEXT_FAMILIES = ("qwen2", "qwen3", "llama", "qwen3_5", "gemma3", "gemma4")  # decoder layouts params.py knows


@dataclass(frozen=True)
class ModelShape:
    """What the budget needs from a config: text dims, vision dims, tying. All counts are per model; a text-only
    model has vision_kind "" and zero vision dims."""
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
    text_family: str = "qwen2"  # decoder layout: qwen2 (biased q/k/v), qwen3 (q/k norm), llama (bias flags)
    vision_kind: str = ""  # "" (text-only), a Qwen-VL family, "siglip" (SmolVLM, Idefics3) or "internvit" (InternVL)
    mlp_bias: bool = False
    vision_image_size: int = 0  # the tile side a tiled tower sees
    pixel_shuffle: int = 0  # tiled towers: tokens are merged scale x scale before the projector
    vision_attention_bias: bool = True
    vision_qk_norm: bool = False
    vision_rms_norm: bool = False
    vision_mean_pooling: bool = True
    vision_mask_token: bool = False
    vision_abs_pos: bool = True
    vision_use_head: bool = False  # Gemma 3's SigLIP: the attention-pooling head (the published configs drop it)
    layer_types: tuple[str, ...] = ()  # hybrid: per decoder layer full_attention | sliding_attention | linear_attention
    sliding_window: int = 0
    linear_k_heads: int = 0  # Qwen3.5's Gated DeltaNet layers
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    linear_conv_kernel: int = 0
    layer_kv: tuple[tuple[int, int], ...] = ()  # Gemma 4: (KV heads, head_dim) per layer (sliding and full differ)
    global_kv_heads: int = 0  # Gemma 4's full layers (kv_heads / head_dim: its sliding layers)
    global_head_dim: int = 0
    k_eq_v: bool = False  # Gemma 4's full layers: one projection for keys and values (no v_proj)
    kv_shared_layers: int = 0  # Gemma 4: the last n layers read an earlier layer's K/V and keep none
    ple_dim: int = 0  # Gemma 4's per-layer embeddings: width per layer, and their vocabulary
    ple_vocab: int = 0
    double_wide_mlp: bool = False  # Gemma 4 E2B: the shared layers' MLPs twice as wide
    experts: int = 0  # Gemma 4 26B-A4B: experts beside the dense MLP in every layer
    expert_intermediate: int = 0
    top_k_experts: int = 0
    vision_kv_heads: int = 0  # Gemma 4's tower (0: vision_heads)
    vision_head_dim: int = 0
    vision_proj_in: int = 0  # Gemma 4: the width its embedder projects into the text hidden size
    audio_kind: str = ""  # "" (no audio tower), "gemma4_conformer" (E2B / E4B), "gemma4_frames" (12B)
    audio_width: int = 0
    audio_depth: int = 0
    audio_heads: int = 0
    audio_conv_channels: tuple[int, ...] = ()
    audio_conv_kernel: int = 0
    audio_out: int = 0
    mtp_layers: int = 0  # Qwen3.5's multi-token-prediction head (mtp_num_hidden_layers; 0: none), a speculative drafter

    @property
    def has_vision(self) -> bool:
        return bool(self.vision_kind)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Each decoder layer's kind (all full_attention unless the config says otherwise)."""
        return self.layer_types or ("full_attention",) * self.layers

    @property
    def shared_kv(self) -> tuple[int, ...]:
        """Layers that read another layer's K/V (Gemma 4's last num_kv_shared_layers) and keep none of their own."""
        return tuple(range(self.layers - self.kv_shared_layers, self.layers)) if self.kv_shared_layers else ()

    @property
    def conv_dim(self) -> int:
        """Gated DeltaNet: channels of the fused q/k/v projection and its causal conv (2 key widths + a value width)."""
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim


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
    if model_type not in SUPPORTED:
        raise ValueError(f"model_type {model_type!r} is not a supported family; supported: {SUPPORTED}")
    clean = {k: v for k, v in model_config.items() if not k.startswith("_") and k != "model_type"}
    return AutoConfig.for_model(model_type, **clean)


def text_family(t) -> str:
    """The decoder layout of a text config: qwen2 (Qwen2, Qwen2-VL, Qwen2.5-VL), qwen3 (Qwen3, Qwen3-VL) or llama."""
    kind = t.model_type
    family = "qwen3_5" if kind.startswith("qwen3_5") else "gemma3" if kind.startswith("gemma3") else \
        "gemma4" if kind.startswith("gemma4") else "qwen3" if kind.startswith("qwen3") else \
        "qwen2" if kind.startswith("qwen2") else kind
    if family not in TEXT_FAMILIES:
        raise ValueError(f"text model_type {kind!r} is not a decoder the budget knows; known: {TEXT_FAMILIES}")
    return family


def _pair(v) -> int:
    """InternVL writes sizes as [h, w] (square here); the others as one int."""
    return int(v[0]) if isinstance(v, (list, tuple)) else int(v)


def vision_dims(cfg) -> dict:
    """The vision fields of ModelShape for a config (empty for a text-only model)."""
    family = cfg.model_type
    if family in TEXT_ONLY:
        return dict(vision_width=0, vision_intermediate=0, vision_depth=0, vision_heads=0, vision_out=0, patch_size=0,
                    temporal_patch_size=0, merge_size=0, in_channels=0, num_position_embeddings=0, deepstack=0)
    if family in GEMMA4:  # a ViT with pooling, or no encoder at all (shapes_gemma4.py)
        return gemma4_vision_dims(cfg)
    v = cfg.vision_config
    if family == "gemma3":  # a SigLIP tower on one fixed-size image, average-pooled to mm_tokens_per_image
        pool = round((_pair(v.image_size) // _pair(v.patch_size)) / cfg.mm_tokens_per_image ** 0.5)
        return dict(vision_kind="gemma3_siglip", vision_width=v.hidden_size, vision_intermediate=v.intermediate_size,
                    vision_depth=v.num_hidden_layers, vision_heads=v.num_attention_heads,
                    vision_out=cfg.text_config.hidden_size, patch_size=_pair(v.patch_size), temporal_patch_size=1,
                    merge_size=pool, in_channels=v.num_channels, vision_image_size=_pair(v.image_size),
                    num_position_embeddings=0, deepstack=0, vision_use_head=bool(v.vision_use_head))
    if family in QWEN_PATCHES:
        if family == "qwen2_vl":
            width, out, inter = v.embed_dim, v.hidden_size, int(v.embed_dim * v.mlp_ratio)
        else:
            width, out, inter = v.hidden_size, v.out_hidden_size, v.intermediate_size
        return dict(vision_kind=family, vision_width=width, vision_intermediate=inter, vision_depth=v.depth,
                    vision_heads=v.num_heads, vision_out=out, patch_size=v.patch_size,
                    temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size,
                    in_channels=v.in_channels, num_position_embeddings=getattr(v, "num_position_embeddings", 0) or 0,
                    deepstack=len(getattr(v, "deepstack_visual_indexes", None) or ()))
    internvl = family == "internvl"
    shuffle = round(1 / cfg.downsample_ratio) if internvl else cfg.scale_factor
    common = dict(vision_width=v.hidden_size, vision_intermediate=v.intermediate_size,
                  vision_depth=v.num_hidden_layers, vision_heads=v.num_attention_heads,
                  vision_out=cfg.text_config.hidden_size, patch_size=_pair(v.patch_size), temporal_patch_size=1,
                  merge_size=shuffle, pixel_shuffle=shuffle, in_channels=v.num_channels,
                  vision_image_size=_pair(v.image_size), num_position_embeddings=0, deepstack=0)
    if not internvl:
        return dict(common, vision_kind="siglip")
    return dict(common, vision_kind="internvit", vision_attention_bias=bool(v.attention_bias),
                vision_qk_norm=bool(v.use_qk_norm), vision_rms_norm=v.norm_type == "rms_norm",
                vision_mean_pooling=bool(v.use_mean_pooling), vision_mask_token=bool(v.use_mask_token),
                vision_abs_pos=bool(v.use_absolute_position_embeddings))


def model_shape(model_config) -> ModelShape:
    """The dimensions of any accepted config form (text-only configs are flat: the config is its own text config)."""
    cfg = hf_config(model_config)
    family = cfg.model_type
    if family not in SUPPORTED:
        raise ValueError(f"model_type {family!r} is not a supported family; supported: {SUPPORTED}")
    t = cfg if family in TEXT_ONLY else cfg.text_config
    if family in GEMMA4:  # K/V shapes per layer (its global head_dim is ambiguous), PLE, experts, audio
        kv = dict(gemma4_text_dims(t), **gemma4_audio_dims(cfg))
    else:
        kv = dict(kv_heads=t.num_key_value_heads or t.num_attention_heads,
                  head_dim=getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads)
    return ModelShape(
        family=family, vocab=t.vocab_size, hidden=t.hidden_size, intermediate=t.intermediate_size,
        layers=t.num_hidden_layers, heads=t.num_attention_heads, tied=bool(cfg.tie_word_embeddings),
        attention_bias=bool(getattr(t, "attention_bias", False)), text_family=text_family(t),
        mlp_bias=bool(getattr(t, "mlp_bias", False)), **kv, **vision_dims(cfg), **hybrid_dims(family, t))


def hybrid_dims(family: str, t) -> dict:
    """The layer kinds and Gated DeltaNet widths of a hybrid text config (empty for the others: all full attention)."""
    if family not in HYBRID:
        return {}
    dims = dict(layer_types=tuple(t.layer_types), sliding_window=int(getattr(t, "sliding_window", None) or 0))
    if family == "qwen3_5":
        dims.update(linear_k_heads=t.linear_num_key_heads, linear_v_heads=t.linear_num_value_heads,
                    linear_k_dim=t.linear_key_head_dim, linear_v_dim=t.linear_value_head_dim,
                    linear_conv_kernel=t.linear_conv_kernel_dim,
                    mtp_layers=int(getattr(t, "mtp_num_hidden_layers", 0) or 0))
    return dims
