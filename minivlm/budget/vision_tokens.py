"""How many LLM tokens an image becomes: the Qwen-VL resize rule (smart_resize) and the 2x2 patch merge."""
import json
import math
import os

from minivlm.budget.shapes import hf_config
from minivlm.families import FAMILIES

# Image processor defaults of the published checkpoints, per family (from the family registry).
FAMILY_PROCESSOR = {name: {"patch_size": f.patch_size, "merge_size": f.merge_size, "min_pixels": f.min_pixels,
                           "max_pixels": f.max_pixels} for name, f in FAMILIES.items()}


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
    """Image placeholder tokens for one height x width image: (H'/factor)·(W'/factor), factor = patch · merge."""
    s = image_processor_settings(family_or_config, min_pixels, max_pixels, patch_size, merge_size)
    factor = s["patch_size"] * s["merge_size"]
    h, w = smart_resize(height, width, factor, s["min_pixels"], s["max_pixels"])
    return (h // factor) * (w // factor)

