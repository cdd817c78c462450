"""Images in, prompt tokens out: load and validate images, run the processor, hash image content."""
import hashlib
from dataclasses import dataclass, field

import torch
from PIL import Image, ImageOps

from minivlm import image_limits

MAX_INPUT_PIXELS = image_limits.MAX_IMAGE_PIXELS  # refuse to decode images larger than this (bombs)
ALLOWED_KWARGS = ("min_pixels", "max_pixels")


@dataclass
class ImageInfo:
    """One image of a prompt: where its placeholder tokens are and everything that determines their KV."""
    content_hash: str                 # sha256 of decoded RGB pixels + size + mode
    grid_thw: tuple[int, int, int]
    start: int                        # index of its first placeholder token in the prompt
    num_tokens: int
    settings: tuple                   # processor settings that shaped its tokens (min/max pixels, patch, merge)
    notes: list[str] = field(default_factory=list)

    def vision_key(self, model_id: str, dtype: str) -> str:
        """Identity of this image's vision embeddings (strategy C minus the position inside a block)."""
        raw = repr((self.content_hash, self.grid_thw, self.settings, model_id, dtype)).encode()
        return hashlib.sha256(raw).hexdigest()


@dataclass
class Prompt:
    """A request rendered by the processor."""
    token_ids: list[int]
    token_types: list[int]            # 0 text, 1 image placeholder
    pixel_values: torch.Tensor | None
    images: list[ImageInfo]


def load_image(obj, max_pixels: int | None = None) -> tuple[Image.Image, list[str]]:
    """PIL image, encoded bytes or a file path -> RGB image (EXIF-rotated, first frame), plus notes for the user;
    checked from its header first (minivlm.image_limits) and decoded no larger than `max_pixels` needs."""
    return load_images([obj], max_pixels)[0]


def load_images(raw: list, max_pixels: int | None = None) -> list[tuple[Image.Image, list[str]]]:
    """A request's images: every header checked (each image, then all together) before any pixel is decoded;
    each then decoded within the server's budget and no larger than a processor using `max_pixels` needs."""
    keep = image_limits.keep_pixels(max_pixels)
    out = []
    for i, (opened, pixels) in enumerate(image_limits.open_all(raw, keep)):
        if opened is None:
            img, notes, upright = raw[i], [], False
        else:
            img, notes, upright = image_limits.decode(opened, pixels, keep, image_limits.image_name(raw[i], i))
        if getattr(img, "n_frames", 1) > 1:
            notes.append(f"animated image: used the first of {img.n_frames} frames")
            img.seek(0)
            img = img.copy()
        if not upright:
            img = ImageOps.exif_transpose(img)
        if img.mode != "RGB":
            notes.append(f"converted {img.mode} image to RGB")
            img = to_rgb(img)
        out.append((img, notes))
    return out


check_pixels = image_limits.check_size


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB; transparency composited on white, 16-bit scaled down to 8-bit."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        img = img.point(lambda v: v / 256).convert("L")
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA"):
        background = Image.new("RGB", img.size, (255, 255, 255))
        background.paste(img.convert("RGBA"), mask=img.convert("RGBA").getchannel("A"))
        return background
    return img.convert("RGB")


def content_hash(img: Image.Image) -> str:
    """Hash of decoded pixels + size + mode: the same picture hashes the same whatever its file format."""
    h = hashlib.sha256()
    h.update(repr((img.mode, img.size)).encode())
    h.update(img.tobytes())
    return h.hexdigest()


def split_images(messages: list[dict]) -> tuple[list[dict], list]:
    """Pull image objects out of HF-format messages (the chat template only needs to know where they go)."""
    clean, images = [], []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError("each message must be a dict with 'role' and 'content'")
        content = m["content"]
        if isinstance(content, list):
            items = []
            for item in content:
                if not isinstance(item, dict) or "type" not in item:
                    raise ValueError("message content items must be dicts with a 'type'")
                if item["type"] == "image" or "image" in item:
                    if item.get("image") is None:
                        raise ValueError("an image content item has no 'image'")
                    images.append(item["image"])
                    items.append({"type": "image"})
                else:
                    items.append(item)
            content = items
        clean.append({"role": m["role"], "content": content})
    return clean, images


def image_settings(processor, mm_kwargs: dict | None) -> tuple[dict, tuple]:
    """Validate per-request overrides; return (processor call kwargs, the settings tuple that enters keys)."""
    ip = processor.image_processor
    mm_kwargs = dict(mm_kwargs or {})
    unknown = set(mm_kwargs) - set(ALLOWED_KWARGS)
    if unknown:
        raise ValueError(f"unsupported mm_processor_kwargs {sorted(unknown)}; allowed: {ALLOWED_KWARGS}")
    factor = ip.patch_size * ip.merge_size
    lo = int(mm_kwargs.get("min_pixels", ip.size.shortest_edge))
    hi = int(mm_kwargs.get("max_pixels", ip.size.longest_edge))
    if lo < factor * factor or hi < lo:
        raise ValueError(f"need {factor * factor} <= min_pixels <= max_pixels, got min={lo} max={hi}")
    call = {"size": {"shortest_edge": lo, "longest_edge": hi}} if mm_kwargs else {}
    return call, (lo, hi, ip.patch_size, ip.merge_size, ip.temporal_patch_size, tuple(ip.image_mean), tuple(ip.image_std))


def build_prompt(processor, messages: list[dict], mm_kwargs: dict | None, max_images: int) -> Prompt:
    """Render messages with the checkpoint's chat template and run the processor on text + images."""
    clean, raw_images = split_images(messages)
    if len(raw_images) > max_images:
        raise ValueError(f"too many images: {len(raw_images)} (this engine allows {max_images} per request)")
    call_kwargs, settings = image_settings(processor, mm_kwargs)
    loaded = load_images(raw_images, image_limits.processor_pixels(processor, mm_kwargs))
    try:
        text = processor.apply_chat_template(clean, tokenize=False, add_generation_prompt=True)
    except Exception as e:
        raise ValueError(f"messages do not fit the chat template: {e}") from e
    out = processor(text=[text], images=[im for im, _ in loaded] or None, return_tensors="pt", **call_kwargs)
    token_ids = out["input_ids"][0].tolist()
    token_types = out["mm_token_type_ids"][0].tolist() if "mm_token_type_ids" in out else [0] * len(token_ids)
    grids = [tuple(g) for g in out["image_grid_thw"].tolist()] if loaded else []
    starts = [i for i, t in enumerate(token_types) if t == 1 and (i == 0 or token_types[i - 1] != 1)]
    merge2 = processor.image_processor.merge_size ** 2
    images = [ImageInfo(content_hash(im), g, s, g[0] * g[1] * g[2] // merge2, settings, notes)
              for (im, notes), g, s in zip(loaded, grids, starts)]
    return Prompt(token_ids, token_types, out.get("pixel_values") if loaded else None, images)
