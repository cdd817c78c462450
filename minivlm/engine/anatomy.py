"""Prompt anatomy: how one request becomes tokens, M-RoPE positions, KV blocks and prefix-cache keys.
Everything comes from the engine's own code path (make_sequence: processor, positions, length checks; then
prefix_keys.block_key per strategy), so what is shown is what the engine computes, not a re-derivation."""
from dataclasses import dataclass, field

from minivlm.engine.kv_cache.snapshot import block_kind
from minivlm.engine.kv_cache.snapshot import holds_video, video_spans
from minivlm.inputs.images import load_image
from minivlm.inputs.prompt import split_images
from minivlm.engine.kv_cache.prefix_keys import block_key
from minivlm.engine.request import Request, SamplingParams

KEY_STRATEGIES = ("A", "B", "C")


@dataclass(frozen=True)
class TokenInfo:
    """One prompt token. grid_row/grid_col: its merged-patch cell for image tokens (in its tile, for tiled families;
    tile: which crop, the global view last); position: M-RoPE (t, h, w), or (i, i, i) under 1-D RoPE."""
    index: int
    token_id: int
    text: str
    type: str                          # "text" | "image"
    image_index: int | None
    grid_row: int | None
    grid_col: int | None
    position: tuple[int, int, int]
    tile: int | None = None
    frame: int | None = None           # video tokens: which frame pair (temporal patch) of the video


@dataclass(frozen=True)
class ImageAnatomy:
    """One image of the prompt: sizes before and after smart_resize, its patch grid and what it costs in tokens.
    resized_size = grid (w, h) × patch_size; num_tokens = num_patches / merge_size²."""
    original_size: tuple[int, int]    # (w, h) as decoded (EXIF-rotated)
    resized_size: tuple[int, int]     # (w, h) the vision tower sees
    grid_thw: tuple[int, int, int]    # in patches
    num_patches: int
    num_tokens: int
    content_hash: str
    start: int = 0                    # index of its first placeholder token
    patch_size: int = 0
    merge_size: int = 0
    settings: tuple = ()              # processor settings that shaped its tokens (they enter key C)
    tiles: tuple[int, int] | None = None  # tiled families, Gemma 3: (rows, cols) of crops; None when not split
    thumbnail: bool = False           # a global view / thumbnail follows the crops
    tile_size: int = 0                # tiled families: a crop's side in px, as the vision tower sees it
    tokens_per_tile: int = 0
    end: int = 0                      # one past its last placeholder token (markers between tiles included)
    kind: str = "image"               # "image" or "video"
    video: object = None              # a video's VideoFacts (minivlm.inputs.video_patches): sampled frames, fps, timestamps


@dataclass(frozen=True)
class BlockAnatomy:
    """Tokens [start, end) of the prompt as one KV block. keys: its prefix-cache key under A, B and C (None while
    the block is partial: the engine keys a block only once it is full); key_inputs: the extra material that went
    into each key besides the parent key and the block's token ids."""
    index: int
    start: int
    end: int
    full: bool
    keys: dict
    key_inputs: dict
    kind: str = "text"                # text | image | mixed | video


@dataclass
class Anatomy:
    """The whole picture of one request (see Engine.anatomy)."""
    tokens: list[TokenInfo]
    images: list[ImageAnatomy]
    blocks: list[BlockAnatomy]
    block_size: int
    strategy: str                     # the engine's own strategy (the key its cache uses)
    rope_delta: int                   # decode position = sequence length + rope_delta
    notes: list[str] = field(default_factory=list)
    images_as: str = "patches"        # how the family turns an image into tokens: patches | tiles | fixed | none
    encoder: bool = True              # a vision encoder runs (Gemma 4 12B: none, one linear over raw patches)
    mrope: bool = True                # 3-axis M-RoPE positions (else 1-D)


def token_texts(tokenizer, token_ids: list[int]) -> list[str]:
    """Each token's own text (special tokens kept), decoding every distinct id once."""
    cache = {t: tokenizer.decode([t], skip_special_tokens=False) for t in set(token_ids)}
    return [cache[t] for t in token_ids]


def original_sizes(request: Request, seq) -> list[tuple[int, int]]:
    """(w, h) of each image and video of the request (images decoded by the engine's own loader), in prompt order."""
    images = iter([load_image(im)[0].size for im in split_images(request.to_messages())[1]])
    return [im.video.source_size if im.kind == "video" else next(images) for im in seq.images]


def qwen_images(engine, seq, sizes) -> tuple[list[ImageAnatomy], dict]:
    """Qwen-VL: each image's patch grid, and each image token's (image, row, col) on the merged grid."""
    patch, merge = engine.processor.image_processor.patch_size, engine.model.merge
    images, owner = [], {}
    for k, (im, size) in enumerate(zip(seq.images, sizes)):
        t, h, w = im.grid_thw  # in patches: the resized image is exactly the grid times the patch size
        images.append(ImageAnatomy(size, (w * patch, h * patch), (t, h, w), t * h * w, im.num_tokens, im.content_hash,
                                   im.start, patch, merge, im.settings, end=im.end, kind=im.kind, video=im.video))
        cols, per_frame = w // merge, h // merge * (w // merge)
        placeholders = [i for i in range(im.start, im.end) if seq.token_types[i]]  # Qwen3-VL: timestamps between
        for j, i in enumerate(placeholders):
            owner[i] = (k, j % per_frame // cols, j % cols, None, j // per_frame if im.kind == "video" else None)
    return images, owner


def tile_geometry(engine) -> tuple[int, int, int]:
    """(tile px, patch px, pixel-shuffle factor) of a tiled family, from its processor and vision config."""
    ip, cfg = engine.processor.image_processor, engine.hf_config
    patch = cfg.vision_config.patch_size
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    if engine.family.tiling == "crops":
        return ip.size.height, patch, round(1 / cfg.downsample_ratio)
    return ip.max_image_size["longest_edge"], patch, cfg.scale_factor


def tiled_images(engine, seq, sizes) -> tuple[list[ImageAnatomy], dict]:
    """SmolVLM / InternVL: each image's crops (row-major, then the global view), and each image token's
    (image, row, col, tile) on its tile's token grid."""
    tile, patch, shuffle = tile_geometry(engine)
    per_tile = engine.processor.image_seq_len if hasattr(engine.processor, "image_seq_len") \
        else engine.processor.image_seq_length
    side = int(round(per_tile ** 0.5))
    images, owner = [], {}
    for k, (im, size) in enumerate(zip(seq.images, sizes)):
        rows, cols = im.tiles or (1, 1)
        images.append(ImageAnatomy(size, (cols * tile, rows * tile), None, im.pixel_rows * (tile // patch) ** 2,
                                im.num_tokens, im.content_hash, im.start, patch, shuffle, im.settings, im.tiles,
                                im.thumbnail, tile, per_tile, im.end))
        placeholders = [i for i in range(im.start, im.end) if seq.token_types[i]]
        for j, i in enumerate(placeholders):
            owner[i] = (k, j % per_tile // side, j % side, j // per_tile)
    return images, owner


def fixed_images(engine, seq, sizes) -> tuple[list[ImageAnatomy], dict]:
    """Gemma 3: each image one view at the tower's size, then (pan-and-scan) its crops, each a view of its own of
    mm_tokens_per_image tokens (the patch grid average-pooled); each image token's (image, row, col, view) on its
    view's token grid, view 0 the whole image."""
    cfg = engine.hf_config
    size, patch, per_view = engine.processor.image_processor.size.height, cfg.vision_config.patch_size, \
        cfg.mm_tokens_per_image
    side = int(round(per_view ** 0.5))
    pool = size // patch // side  # patches per token, along each side
    images, owner = [], {}
    for k, (im, original) in enumerate(zip(seq.images, sizes)):
        images.append(ImageAnatomy(original, (size, size), None, im.pixel_rows * (size // patch) ** 2, im.num_tokens,
                                   im.content_hash, im.start, patch, pool, im.settings, im.tiles, False, size,
                                   per_view, im.end))
        placeholders = [i for i in range(im.start, im.end) if seq.token_types[i]]  # text between the views
        for j, i in enumerate(placeholders):
            owner[i] = (k, j % per_view // side, j % side, j // per_view)
    return images, owner


def budget_images(engine, seq, sizes) -> tuple[list[ImageAnatomy], dict]:
    """Gemma 4: each image resized (aspect kept) to the most patches its soft-token budget allows, sides multiples of
    patch x pool, its patch grid average-pooled pool x pool into soft tokens (drawn as Qwen's merged grid is, the
    pool as the merge); each token's (image, row, col)."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size
    ip = engine.processor.image_processor
    patch, pool = ip.patch_size, ip.pooling_kernel_size
    images, owner = [], {}
    for k, (im, (w, h)) in enumerate(zip(seq.images, sizes)):
        budget = dict(s for s in im.settings if isinstance(s, tuple) and s and s[0] == "max_soft_tokens")
        rh, rw = get_aspect_ratio_preserving_size(h, w, patch, budget["max_soft_tokens"] * pool ** 2, pool)
        cols = rw // patch // pool
        grid = (1, rh // patch, rw // patch)
        images.append(ImageAnatomy((w, h), (rw, rh), grid, grid[1] * grid[2], im.num_tokens, im.content_hash, im.start,
                                   patch, pool, im.settings, None, False, 0, im.num_tokens, im.end))  # one view
        for j in range(im.num_tokens):
            owner[im.start + j] = (k, j // cols, j % cols, None)
    return images, owner


NO_ENCODER = ("no vision encoder: each soft token is one merged patch's raw pixels through LayerNorms and one linear "
              "(Gemma 4 12B's patch embedder), so key C holds its patch grid and soft-token budget")
IMAGE_LAYOUTS = {"patches": qwen_images, "tiles": tiled_images, "fixed": fixed_images, "budget": budget_images}


def build_anatomy(engine, request: Request) -> Anatomy:
    """Render `request` through the engine (no model run) and lay out its tokens, images, blocks and keys."""
    seq = engine.make_sequence(request, SamplingParams(max_tokens=1))
    model, bs, family = engine.model, engine.config.block_size, engine.model.family
    sizes = original_sizes(request, seq) if seq.images else []
    images, owner = IMAGE_LAYOUTS[family.images](engine, seq, sizes) if seq.images else ([], {})
    positions = seq.prompt_positions.T.tolist()
    texts = token_texts(engine.tokenizer, seq.token_ids)
    tokens = [TokenInfo(i, t, text, "image" if kind else "text", *owner.get(i, (None, None, None, None))[:3],
                        tuple(pos), owner.get(i, (None,) * 4)[3], (owner.get(i, ()) + (None,) * 5)[4])
              for i, (t, text, kind, pos) in enumerate(zip(seq.token_ids, texts, seq.token_types, positions))]
    blocks, parents = [], dict.fromkeys(KEY_STRATEGIES)
    for i in range(-(-len(seq) // bs)):  # every block the prompt touches, the last maybe partial
        start, end = i * bs, min((i + 1) * bs, len(seq))
        full = end - start == bs
        keys, inputs = {}, {}
        for s in KEY_STRATEGIES:
            key, extra = block_key(seq, i, parents[s], bs, s, model.model_id, model.dtype_name)
            keys[s], inputs[s] = (key if full else None), extra
            parents[s] = key
        blocks.append(BlockAnatomy(i, start, end, full, keys, inputs,
                                   block_kind(seq.token_types[start:end], holds_video(video_spans(seq), start, end))))
    encoder = getattr(model.vision, "has_encoder", True)
    notes = [n for im in seq.images for n in im.notes] + ([] if encoder or not seq.images else [NO_ENCODER])
    return Anatomy(tokens, images, blocks, bs, engine.config.cache_strategy, seq.rope_delta, notes,
                   images_as=family.images, mrope=family.mrope, encoder=encoder)
