"""Chat messages in, prompt tokens out: images and videos pulled out of the messages, the chat template and the
family's processor run, and every image's placeholder span and the settings that shaped it recorded."""
import hashlib
from dataclasses import dataclass, field

import torch

from minivlm.inputs import image_limits
from minivlm.inputs.images import content_hash, load_images
from minivlm.inputs.image_layout import image_settings, locate_images, placeholder_types
from minivlm.inputs.video_prompt import expand_videos, prepare_videos, video_item, video_spans
from minivlm.refusals import Refused

TOOL_KEYS = ("tool_calls", "tool_call_id")  # what a chat template reads of a tool-calling turn besides content
TOO_MANY = "too many {kind}s: {n} (this engine allows {limit} per request)"
AUDIO_ITEMS = ("audio", "input_audio")  # HF's and OpenAI's audio content items: refused by name


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
    pixel_rows: int = 0               # rows of the prompt's pixel_values it owns (patches, tiles or views)
    tiles: tuple[int, int] | None = None   # tiled families, Gemma 3: (rows, cols) of crops; None when not split
    thumbnail: bool = False           # a global view / thumbnail follows its crops
    kind: str = "image"               # "image" or "video" (a video's grid has t > 1 frame pairs)
    video: object = None              # a video's VideoFacts: fps, sampled frames, timestamps (minivlm.inputs.video_patches)

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
    pixel_values: torch.Tensor | None  # Qwen: [patches, dim]; tiled: [tiles, 3, H, W]; Gemma 3: [views, 3, H, W]
    images: list[ImageInfo]
    pixel_mask: torch.Tensor | None = None  # SmolVLM: [tiles, H, W], which pixels of a padded tile are real;
                                            # Gemma 4: [images, patches, 2], each patch's (x, y), (-1, -1) padding
    generation_tokens: int = 0        # the chat template's generation prompt at its end (a follow-up turn keeps
                                      # everything before it: where recurrent state is saved, engine/kv_cache/recurrent.py)


def split_images(messages: list[dict]) -> tuple[list[dict], list]:
    """Pull image objects out of HF-format messages (the chat template only needs to know where they go)."""
    clean, images, _ = split_media(messages)
    return clean, images


def split_media(messages: list[dict]) -> tuple[list[dict], list, list]:
    """Pull images and videos (VideoItem) out of HF-format messages."""
    clean, images, videos = [], [], []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise Refused("invalid_value", "each message must be a dict with 'role' and 'content'", reason="message")
        content = m["content"]
        if isinstance(content, list):
            items = []
            for item in content:
                if not isinstance(item, dict) or "type" not in item:
                    raise Refused("invalid_value", "message content items must be dicts with a 'type'",
                                  reason="content_item")
                if item["type"] in AUDIO_ITEMS or "audio" in item or "input_audio" in item:  # Gemma 4 E2B/E4B hear
                    raise Refused("invalid_value", "audio input is not supported: minivlm serves text, images and "
                                  "video (a checkpoint's audio tower is not loaded)", reason="takes_no_audio")
                if item["type"] == "video" or "video" in item:
                    videos.append(video_item(item))
                    items.append({"type": "video"})
                elif item["type"] == "image" or "image" in item:
                    if item.get("image") is None:
                        raise Refused("invalid_image", "an image content item has no 'image'", reason="no_image_item")
                    images.append(item["image"])
                    items.append({"type": "image"})
                else:
                    items.append(item)
            content = items
        kept = {k: m[k] for k in TOOL_KEYS if m.get(k) is not None}  # a tool-calling turn, as the template reads it
        clean.append({"role": m["role"], "content": content, **kept})
    return clean, images, videos


def render(processor, clean: list[dict], tools: list[dict] | None = None, generation: bool = True) -> str:
    try:
        return processor.apply_chat_template(clean, tokenize=False, add_generation_prompt=generation,
                                             **({"tools": tools} if tools else {}))
    except Exception as e:
        raise Refused("invalid_value", "messages do not fit the chat template: {why}", reason="chat_template",
                      why=str(e)) from e


def build_prompt(family, processor, messages: list[dict], mm_kwargs: dict | None, max_images: int,
                 tools: list[dict] | None = None) -> Prompt:
    """Render messages (and tools, for a template that knows them) with the checkpoint's chat template and run the
    processor on text + images (+ videos)."""
    clean, raw_images, raw_videos = split_media(messages)
    if (raw_images or raw_videos) and family.images == "none":
        raise Refused("invalid_image", "{model} is a text-only model: it takes no images ({n} given)",
                      reason="text_only", model=family.title, n=len(raw_images)) if raw_images else \
            Refused("invalid_video", "{model} is a text-only model: it takes no video", reason="text_only_video",
                    model=family.title)
    if len(raw_images) > max_images:
        raise Refused("too_many_images", TOO_MANY, kind="image", n=len(raw_images), limit=max_images)
    if len(raw_videos) > max_images:
        raise Refused("too_many_videos", TOO_MANY, kind="video", n=len(raw_videos), limit=max_images)
    call_kwargs, settings = image_settings(family, processor, mm_kwargs)
    videos = prepare_videos(getattr(processor, "video_settings", None), raw_videos, family.title)
    loaded = load_images(raw_images, image_limits.processor_pixels(processor, mm_kwargs))
    text = render(processor, clean, tools)
    tail = generation_tokens(processor, clean, tools, text)
    if family.images == "none":
        ids = processor(text, add_special_tokens=False)["input_ids"]
        return Prompt(ids, [0] * len(ids), None, [], generation_tokens=tail)
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
        raise Refused("invalid_image", "the processor laid out {laid} images for {n} given", reason="image_layout",
                      laid=len(spans), n=len(loaded))
    images = [ImageInfo(content_hash(im), sp.grid_thw, sp.start, sp.num_tokens, settings + sp.layout, notes, sp.end,
                        sp.pixel_rows, sp.tiles, sp.thumbnail) for (im, notes), sp in zip(loaded, spans)]
    pixels = out.get("pixel_values") if loaded else None
    mask = out.get("pixel_attention_mask", out.get("image_position_ids")) if loaded else None
    if pixels is not None and family.images == "tiles" and pixels.dim() == 5:  # SmolVLM: [1, tiles, 3, H, W]
        pixels, mask = pixels[0], (mask[0] if mask is not None else None)
    if videos:
        vs = processor.video_settings.key()
        clips = [ImageInfo(v.source.content_hash, v.grid, s, n, ("video processor",) + vs + v.facts.key(), [], e,
                           v.patches.shape[0], kind="video", video=v.facts)
                 for v, (s, e, n) in zip(videos, video_spans(kinds, videos))]
        images, pixels = in_prompt_order(images, pixels, clips, [v.patches for v in videos])
    return Prompt(out["input_ids"][0].tolist(), [int(t != 0) for t in kinds], pixels, images, mask, tail)


def generation_tokens(processor, clean: list[dict], tools, text: str) -> int:
    """Tokens of the generation prompt the template appended (Qwen3.5: `<|im_start|>assistant\\n<think>\\n`): the
    conversation rendered without it is where a follow-up turn's prompt still agrees with this one. 0 when the
    template renders the conversation differently without it (nothing is known then)."""
    try:
        head = render(processor, clean, tools, generation=False)
    except Refused:  # a template that only renders with its generation prompt
        return 0
    if not text.startswith(head) or len(head) == len(text):
        return 0
    tokenizer = getattr(processor, "tokenizer", processor)
    return len(tokenizer(text[len(head):], add_special_tokens=False)["input_ids"])


def in_prompt_order(images: list, pixels, clips: list, patches: list):
    """Images and videos sorted by where they start, their pixel rows (Qwen: patches) concatenated in that order."""
    rows = list(pixels.split([im.pixel_rows for im in images])) if images else []
    items = sorted(zip(images + clips, rows + patches), key=lambda pair: pair[0].start)
    return [i for i, _ in items], torch.cat([r.to(torch.float32) for _, r in items])
