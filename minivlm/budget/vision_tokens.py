"""How many LLM tokens an image becomes: the Qwen-VL resize rule (smart_resize) and the 2x2 patch merge; the tiled
families' rules are in tiling.py; Gemma 3's is a fixed count per image, Gemma 4's a soft-token budget
(soft_tokens.py); image_plan() answers for any family."""
import json
import math
import os
from dataclasses import dataclass

from minivlm.budget.shapes import QWEN_PATCHES, TEXT_ONLY, hf_config, load_model_preset, model_shape
from minivlm.budget.shapes_gemma4 import GEMMA4
from minivlm.inputs.soft_tokens import DEFAULT_SOFT_TOKENS, GEMMA4_MARKERS, soft_token_size
from minivlm.budget.tiling import internvl_tiles, smolvlm_tiles

# Image processor defaults of the published Qwen-VL checkpoints' preprocessor_config.json, per family (kept here,
# not read from the engine's registry, so the calculator's rules do not move when the engine's families do).
FAMILY_PROCESSOR = {
    "qwen2_vl": {"patch_size": 14, "merge_size": 2, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 16384},
    "qwen2_5_vl": {"patch_size": 14, "merge_size": 2, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 16384},
    "qwen3_vl": {"patch_size": 16, "merge_size": 2, "min_pixels": 256 * 256, "max_pixels": 4096 * 4096},
    # transformers serves Qwen3.5 with Qwen3-VL's processor; its checkpoints' own limits are not known offline
    "qwen3_5": {"patch_size": 16, "merge_size": 2, "min_pixels": 256 * 256, "max_pixels": 4096 * 4096},
}
GEMMA3_MARKERS = 4  # "\n\n", <start_of_image>, <end_of_image>, "\n\n" around each image (Gemma3Processor)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The processor's target size: both sides multiples of factor, area in [min_pixels, max_pixels], aspect kept."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max(height, width) > 200 * min(height, width):
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.0f} exceeds the processor's 200")
    # Python's round() rounds halves to even, exactly like the processor (it uses round() too).
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:  # too many pixels: shrink both sides by the same ratio, then floor to the grid
        scale = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:  # too few: grow by the same ratio, then ceil to the grid
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / factor) * factor
        w = math.ceil(width * scale / factor) * factor
    return h, w


def checkpoint_image_processor(path: str) -> dict | None:
    """The image processor settings a checkpoint dir saved: preprocessor_config.json (hub layout) or the
    image_processor entry of processor_config.json (transformers 5 save_pretrained layout); None if neither."""
    for name, key in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
        file = os.path.join(path, name)
        if os.path.isfile(file):
            with open(file) as f:
                saved = json.load(f)
            saved = saved.get(key) if key else saved
            if saved:
                return saved
    return None


def image_processor_settings(family_or_config, min_pixels=None, max_pixels=None, patch_size=None,
                             merge_size=None) -> dict:
    """patch/merge/min/max pixels: explicit arguments, else a checkpoint dir's saved processor, else the family
    defaults (patch and merge size taken from the model config when one is given)."""
    saved = checkpoint_image_processor(family_or_config) if isinstance(family_or_config, str) else None
    if isinstance(family_or_config, str) and family_or_config in FAMILY_PROCESSOR:
        settings = dict(FAMILY_PROCESSOR[family_or_config])
    elif saved is not None:
        size = saved.get("size") or {}
        settings = {"patch_size": saved.get("patch_size", 14), "merge_size": saved.get("merge_size", 2),
                    "min_pixels": saved.get("min_pixels") or size.get("shortest_edge"),
                    "max_pixels": saved.get("max_pixels") or size.get("longest_edge")}
    else:
        cfg = hf_config(family_or_config)
        settings = dict(FAMILY_PROCESSOR[cfg.model_type], patch_size=cfg.vision_config.patch_size,
                        merge_size=cfg.vision_config.spatial_merge_size)
    for key, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels), ("patch_size", patch_size),
                       ("merge_size", merge_size)):
        if value is not None:
            settings[key] = int(value)
    if not settings["min_pixels"] or not settings["max_pixels"] or settings["min_pixels"] > settings["max_pixels"]:
        raise ValueError(f"need 0 < min_pixels <= max_pixels, got {settings['min_pixels']}, {settings['max_pixels']}")
    return settings


def vision_tokens(height: int, width: int, family_or_config, min_pixels=None, max_pixels=None, patch_size=None,
                  merge_size=None) -> int:
    """Image placeholder tokens for one height x width image: Qwen-VL (H'/factor)·(W'/factor), factor = patch ·
    merge; a tiled family's config or preset: its tiles × tokens per tile (image_plan)."""
    if family_or_config not in FAMILY_PROCESSOR and patch_size is None and merge_size is None and \
            hf_config(family_or_config).model_type not in QWEN_PATCHES:
        return image_plan(family_or_config, height, width, min_pixels, max_pixels).vision_tokens
    s = image_processor_settings(family_or_config, min_pixels, max_pixels, patch_size, merge_size)
    factor = s["patch_size"] * s["merge_size"]
    h, w = smart_resize(height, width, factor, s["min_pixels"], s["max_pixels"])
    return (h // factor) * (w // factor)



@dataclass(frozen=True)
class ImagePlan:
    """One image in the prompt: placeholder tokens, marker tokens around them, tiles the tower encodes, ViT patches
    over all tiles (what the encoder peak is sized by) and the size the processor resized it to (height, width)."""
    vision_tokens: int
    marker_tokens: int
    tiles: int
    patches: int
    resized: tuple[int, int]

    @property
    def tokens(self) -> int:
        return self.vision_tokens + self.marker_tokens


def _saved_processor(model_config) -> dict | None:
    """The processor settings a preset (its _processor entry) or a checkpoint dir (its saved files) carries."""
    if not isinstance(model_config, str):
        return None
    if os.path.isdir(model_config):
        saved = dict(checkpoint_image_processor(model_config) or {})
        extra = os.path.join(model_config, "processor_config.json")
        if os.path.isfile(extra):
            with open(extra) as f:
                saved.update({k: v for k, v in json.load(f).items() if k.startswith("image_seq")})
        return saved or None
    return load_model_preset(model_config).get("_processor")


def tiled_processor_settings(model_config, *, cfg=None, shape=None) -> dict:
    """The tiling settings of a SmolVLM / Idefics3 / InternVL model: the preset's or checkpoint's saved processor,
    else what the config implies (the published checkpoints' rule: tile = the tower's image size, SmolVLM's longest
    edge 4 tiles, tokens per tile = (tile / patch)² / scale²; InternVL 1..12 tiles)."""
    cfg = cfg if cfg is not None else hf_config(model_config)
    s, saved = shape if shape is not None else model_shape(cfg), _saved_processor(model_config) or {}
    per_tile = (s.vision_image_size // s.patch_size) ** 2 // s.pixel_shuffle ** 2
    if cfg.model_type == "internvl":
        size = saved.get("crop_size") or saved.get("size") or {}
        return {"tile": size.get("height", s.vision_image_size), "min_patches": saved.get("min_patches", 1),
                "max_patches": saved.get("max_patches", 12), "crop_to_patches": saved.get("crop_to_patches", True),
                "image_seq_length": saved.get("image_seq_length", getattr(cfg, "image_seq_length", per_tile))}
    v = cfg.vision_config
    tile = (saved.get("max_image_size") or getattr(v, "max_image_size", None) or {}).get("longest_edge",
                                                                                         s.vision_image_size)
    longest = (saved.get("size") or getattr(v, "size", None) or {}).get("longest_edge", 4 * tile)
    return {"tile": tile, "longest_edge": longest, "splitting": saved.get("do_image_splitting", True),
            "image_seq_len": saved.get("image_seq_len", per_tile)}


def image_plan(model_config, height: int, width: int, min_pixels=None, max_pixels=None, *, cfg=None,
               shape=None, max_soft_tokens=None) -> ImagePlan:
    """What one height x width image costs in the prompt and in the encoder, by the model family's own rule
    (min_pixels / max_pixels: Qwen-VL only; max_soft_tokens: Gemma 4 only, the processor's knob of that name, one of
    SOFT_TOKEN_BUDGETS; None: the saved processor's, else 280). cfg / shape: model_config already parsed (estimate
    parses it once)."""
    cfg = cfg if cfg is not None else hf_config(model_config)
    family = cfg.model_type
    if family in TEXT_ONLY:
        raise ValueError(f"{family} is a text-only model: it takes no images")
    if max_soft_tokens is not None and family not in GEMMA4:
        raise ValueError(f"max_soft_tokens is Gemma 4's soft-token budget per image; {family} has no such setting")
    if family in QWEN_PATCHES:
        proc = image_processor_settings(model_config, min_pixels, max_pixels)
        factor = proc["patch_size"] * proc["merge_size"]
        resized = smart_resize(height, width, factor, proc["min_pixels"], proc["max_pixels"])
        tokens = (resized[0] // factor) * (resized[1] // factor)
        return ImagePlan(tokens, 2, 1, tokens * proc["merge_size"] ** 2, resized)  # + vision start/end
    if min_pixels is not None or max_pixels is not None:
        raise ValueError(f"min_pixels / max_pixels apply to the Qwen-VL resize rule, not to {family}'s tiling")
    s = shape if shape is not None else model_shape(cfg)
    if family == "gemma3":  # every image resized to the tower's square, pooled to a fixed count (no pan-and-scan)
        tokens = (_saved_processor(model_config) or {}).get("image_seq_length", cfg.mm_tokens_per_image)
        side = s.vision_image_size
        return ImagePlan(tokens, GEMMA3_MARKERS, 1, (side // s.patch_size) ** 2, (side, side))
    if family in GEMMA4:  # resized into the soft-token budget; the encoder sees the whole budget's patches (padded)
        budget = max_soft_tokens or (_saved_processor(model_config) or {}).get("max_soft_tokens", DEFAULT_SOFT_TOKENS)
        resized = soft_token_size(height, width, s.patch_size, s.merge_size, budget)
        tokens = (resized[0] // s.patch_size) * (resized[1] // s.patch_size) // s.merge_size ** 2
        positions = budget * s.merge_size ** 2 if family == "gemma4" else budget  # ViT patches | merged patches
        return ImagePlan(tokens, GEMMA4_MARKERS, 1, positions, resized)
    p = tiled_processor_settings(model_config, cfg=cfg, shape=s)
    per_tile = (s.vision_image_size // s.patch_size) ** 2
    if family == "internvl":
        t = internvl_tiles(height, width, p["tile"], p["image_seq_length"], p["min_patches"], p["max_patches"],
                           p["crop_to_patches"])
        per_tile += 1  # the CLS token
    else:
        t = smolvlm_tiles(height, width, p["longest_edge"], p["tile"], p["image_seq_len"], p["splitting"])
    return ImagePlan(t.vision_tokens, t.marker_tokens, t.tiles, t.tiles * per_tile, t.resized)
