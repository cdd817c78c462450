"""Images in, prompt tokens out: load and validate images, run the processor, hash image content."""
import hashlib
from dataclasses import dataclass, field

import torch
from PIL import Image, ImageOps

from minivlm import image_limits
from minivlm.image_layout import image_settings, locate_images, placeholder_types
from minivlm.video_prompt import expand_videos, prepare_videos, video_item, video_spans

MAX_INPUT_PIXELS = image_limits.MAX_IMAGE_PIXELS  # refuse to decode images larger than this (bombs)


@dataclass
class ImageInfo:
    """One image of a prompt: where its placeholder tokens are and everything that determines their KV."""
    content_hash: str                 # sha256 of decoded RGB pixels + size + mode
    grid_thw: tuple[int, int, int] | None  # Qwen: the patch grid; None for tiled families (see tiles)
    start: int                        # index of its first placeholder token in the prompt
    num_tokens: int                   # its placeholder tokens (rows of its vision embeddings)
    settings: tuple                   # processor settings that shaped its tokens (pixels, tiling, patch, merge)
    notes: list[str] = field(default_factory=list)
    end: int = 0                      # one past its last placeholder (tile markers in between belong to it)
    pixel_rows: int = 0               # rows of the prompt's pixel_values it owns (patches or tiles)
    tiles: tuple[int, int] | None = None   # tiled families: (rows, cols) of crops; None when not split
    thumbnail: bool = False           # a global view / thumbnail follows its crops
    kind: str = "image"               # "image" or "video" (a video's grid has t > 1 frame pairs)
    video: object = None              # a video's VideoFacts: fps, sampled frames, timestamps (minivlm.video_patches)

    def __post_init__(self):
        self.end = self.end or self.start + self.num_tokens

    def vision_key(self, model_id: str, dtype: str) -> str:
        """Identity of this image's vision embeddings (strategy C minus the position inside a block)."""
        raw = repr((self.content_hash, self.grid_thw, self.tiles, self.settings, model_id, dtype)).encode()
        return hashlib.sha256(raw).hexdigest()


@dataclass
class Prompt:
    """A request rendered by the processor."""
    token_ids: list[int]
    token_types: list[int]            # 0 text, 1 image or video placeholder
    pixel_values: torch.Tensor | None  # Qwen: [patches, dim]; tiled families: [tiles, 3, H, W]
    images: list[ImageInfo]
    pixel_mask: torch.Tensor | None = None  # SmolVLM: [tiles, H, W], which pixels of a padded tile are real


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
    clean, images, _ = split_media(messages)
    return clean, images


def split_media(messages: list[dict]) -> tuple[list[dict], list, list]:
    """Pull images and videos (VideoItem) out of HF-format messages."""
    clean, images, videos = [], [], []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError("each message must be a dict with 'role' and 'content'")
        content = m["content"]
        if isinstance(content, list):
            items = []
            for item in content:
                if not isinstance(item, dict) or "type" not in item:
                    raise ValueError("message content items must be dicts with a 'type'")
                if item["type"] == "video" or "video" in item:
                    videos.append(video_item(item))
                    items.append({"type": "video"})
                elif item["type"] == "image" or "image" in item:
                    if item.get("image") is None:
                        raise ValueError("an image content item has no 'image'")
                    images.append(item["image"])
                    items.append({"type": "image"})
                else:
                    items.append(item)
            content = items
        clean.append({"role": m["role"], "content": content})
    return clean, images, videos


def render(processor, clean: list[dict]) -> str:
    try:
        return processor.apply_chat_template(clean, tokenize=False, add_generation_prompt=True)
    except Exception as e:
        raise ValueError(f"messages do not fit the chat template: {e}") from e


def build_prompt(family, processor, messages: list[dict], mm_kwargs: dict | None, max_images: int) -> Prompt:
    """Render messages with the checkpoint's chat template and run the processor on text + images (+ videos)."""
    clean, raw_images, raw_videos = split_media(messages)
    if (raw_images or raw_videos) and family.images == "none":
        raise ValueError(f"{family.title} is a text-only model: it takes no images ({len(raw_images)} given)"
                         if raw_images else f"{family.title} is a text-only model: it takes no video")
    if len(raw_images) > max_images:
        raise ValueError(f"too many images: {len(raw_images)} (this engine allows {max_images} per request)")
    if len(raw_videos) > max_images:
        raise ValueError(f"too many videos: {len(raw_videos)} (this engine allows {max_images} per request)")
    call_kwargs, settings = image_settings(family, processor, mm_kwargs)
    videos = prepare_videos(getattr(processor, "video_settings", None), raw_videos, family.title)
    loaded = load_images(raw_images, image_limits.processor_pixels(processor, mm_kwargs))
    text = render(processor, clean)
    if family.images == "none":
        ids = processor(text, add_special_tokens=False)["input_ids"]
        return Prompt(ids, [0] * len(ids), None, [])
    if videos:
        text = expand_videos(processor, text, videos)
    bos = processor.tokenizer.bos_token
    if bos is not None and text.startswith(bos):  # as HF's apply_chat_template: the template wrote the BOS already
        call_kwargs = {**call_kwargs, "add_special_tokens": False}
    out = processor(text=[text], images=[im for im, _ in loaded] or None, return_tensors="pt", **call_kwargs)
    kinds = placeholder_types(family, processor, out)
    types = [int(t == 1) for t in kinds]
    spans = locate_images(family, processor, out, types, [im.size for im, _ in loaded], call_kwargs) if loaded else []
    if len(spans) != len(loaded):
        raise ValueError(f"the processor laid out {len(spans)} images for {len(loaded)} given")
    images = [ImageInfo(content_hash(im), sp.grid_thw, sp.start, sp.num_tokens, settings, notes, sp.end,
                        sp.pixel_rows, sp.tiles, sp.thumbnail) for (im, notes), sp in zip(loaded, spans)]
    pixels = out.get("pixel_values") if loaded else None
    mask = out.get("pixel_attention_mask") if loaded else None
    if pixels is not None and family.images == "tiles" and pixels.dim() == 5:  # SmolVLM: [1, tiles, 3, H, W]
        pixels, mask = pixels[0], (mask[0] if mask is not None else None)
    if videos:
        vs = processor.video_settings.key()
        clips = [ImageInfo(v.source.content_hash, v.grid, s, n, ("video processor",) + vs + v.facts.key(), [], e,
                           v.patches.shape[0], kind="video", video=v.facts)
                 for v, (s, e, n) in zip(videos, video_spans(kinds, videos))]
        images, pixels = in_prompt_order(images, pixels, clips, [v.patches for v in videos])
    return Prompt(out["input_ids"][0].tolist(), [int(t != 0) for t in kinds], pixels, images, mask)


def in_prompt_order(images: list, pixels, clips: list, patches: list):
    """Images and videos sorted by where they start, their pixel rows (Qwen: patches) concatenated in that order."""
    rows = list(pixels.split([im.pixel_rows for im in images])) if images else []
    items = sorted(zip(images + clips, rows + patches), key=lambda pair: pair[0].start)
    return [i for i, _ in items], torch.cat([r.to(torch.float32) for _, r in items])
