"""How each family turns an image into tokens, read back from the processor's output: where each image's
placeholder tokens are, how many rows of pixel_values it owns (Qwen: patches; SmolVLM / InternVL: tiles; Gemma 3:
the image and its pan-and-scan crops), its grid or tiling, and the processor settings that shaped it (they enter
key C). Also the per-request knobs, validated."""
import re
from dataclasses import dataclass

import numpy as np
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas

from minivlm.refusals import Refused


def bad_kwarg(template: str, **fields) -> Refused:
    """A per-request processor setting out of its range (param mm_processor_kwargs)."""
    return Refused("invalid_value", template, reason="processor_kwarg", param="mm_processor_kwargs", **fields)


@dataclass(frozen=True)
class ImageSpan:
    """One image in the prompt as the processor laid it out."""
    start: int                        # its first placeholder token
    end: int                          # one past its last placeholder token (markers in between included)
    num_tokens: int                   # placeholder tokens (rows of its vision embeddings)
    pixel_rows: int                   # rows of pixel_values it owns
    grid_thw: tuple | None            # Qwen: (t, h, w) in patches
    tiles: tuple | None               # tiled families: (rows, cols) of crops; None when the image was not split
    thumbnail: bool                   # a global view / thumbnail follows the crops
    layout: tuple = ()                # what else of its layout shapes its KV, for key C (Gemma 4: its patch grid)


def _longest_edge(value, name: str) -> int:
    edge = value.get("longest_edge") if isinstance(value, dict) else getattr(value, "longest_edge", value)
    if isinstance(edge, bool) or not isinstance(edge, int) or edge < 1:
        raise bad_kwarg("mm_processor_kwargs {name} must be a positive int or {{'longest_edge': int}}, got {value}",
                        name=repr(name), value=repr(value))
    return edge


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_kwarg("mm_processor_kwargs {name} must be a positive int, got {value}", name=repr(name),
                        value=repr(value))
    return value


def _flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise bad_kwarg("mm_processor_kwargs {name} must be true or false, got {value}", name=repr(name),
                        value=repr(value))
    return value


def qwen_settings(ip, kw: dict) -> tuple[dict, tuple]:
    factor = ip.patch_size * ip.merge_size
    lo = int(kw.get("min_pixels", ip.size.shortest_edge))
    hi = int(kw.get("max_pixels", ip.size.longest_edge))
    if lo < factor * factor or hi < lo:
        raise bad_kwarg("need {least} <= min_pixels <= max_pixels, got min={lo} max={hi}", least=factor * factor,
                        lo=lo, hi=hi)
    call = {"size": {"shortest_edge": lo, "longest_edge": hi}} if kw else {}
    return call, (lo, hi, ip.patch_size, ip.merge_size, ip.temporal_patch_size, tuple(ip.image_mean), tuple(ip.image_std))


def smolvlm_settings(processor, kw: dict) -> tuple[dict, tuple]:
    ip = processor.image_processor
    split = _flag(kw.get("do_image_splitting", ip.do_image_splitting), "do_image_splitting")
    tile = _longest_edge(kw.get("max_image_size", ip.max_image_size), "max_image_size")
    native = _longest_edge(ip.max_image_size, "max_image_size")
    if tile != native:  # the vision encoder makes image_seq_len tokens only from a tile of its own size
        raise bad_kwarg("max_image_size must be {native} for this checkpoint (its vision encoder's tile; each tile "
                        "is {tokens} tokens), got {tile}", native=native, tokens=processor.image_seq_len, tile=tile)
    longest = _longest_edge(kw.get("size", ip.size), "size")
    call = {"do_image_splitting": split, "size": {"longest_edge": longest}} if kw else {}
    return call, (("split", split), ("longest_edge", longest), ("tile", tile), ("image_seq_len", processor.image_seq_len),
                  ip.resample, ip.do_resize, ip.rescale_factor, tuple(ip.image_mean), tuple(ip.image_std))


def internvl_settings(processor, kw: dict) -> tuple[dict, tuple]:
    ip = processor.image_processor
    crop = _flag(kw.get("crop_to_patches", processor.images_kwargs.get("crop_to_patches", ip.crop_to_patches)),
                 "crop_to_patches")
    lo = _positive_int(kw.get("min_patches", ip.min_patches), "min_patches")
    hi = _positive_int(kw.get("max_patches", ip.max_patches), "max_patches")
    if lo > hi:
        raise bad_kwarg("need min_patches <= max_patches, got min={lo} max={hi}", lo=lo, hi=hi)
    call = {"crop_to_patches": crop, "min_patches": lo, "max_patches": hi} if kw else {}
    size = (ip.size.height, ip.size.width)
    return call, (("crop", crop), ("patches", lo, hi), ("crop_size", size),
                  ("image_seq_length", processor.image_seq_length), ip.resample, tuple(ip.image_mean), tuple(ip.image_std))


def gemma3_images_kwargs(processor, call: dict) -> dict:
    """The image settings Gemma3Processor will use for this call: its own defaults (pan-and-scan off, 256-px crops at
    least, 4 at most, past an aspect ratio of 1.2) under the call's, merged as its __call__ merges them (the image
    processor's saved values come below the processor's defaults there)."""
    return processor._merge_kwargs(tokenizer_init_kwargs=processor.tokenizer.init_kwargs, **call)["images_kwargs"]


def gemma3_settings(processor, kw: dict) -> tuple[dict, tuple]:
    call = {"do_pan_and_scan": _flag(kw["do_pan_and_scan"], "do_pan_and_scan")} if "do_pan_and_scan" in kw else {}
    ip, merged = processor.image_processor, gemma3_images_kwargs(processor, call)
    pan = tuple(merged.get(k) for k in ("do_pan_and_scan", "pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops",
                                        "pan_and_scan_min_ratio_to_activate"))
    return call, (("pan_and_scan",) + pan, ("size", ip.size.height, ip.size.width),
                  ("image_seq_length", processor.image_seq_length), ip.resample, ip.rescale_factor,
                  tuple(ip.image_mean), tuple(ip.image_std))


def gemma3_views(processor, sizes: list[tuple[int, int]], call: dict) -> list[int]:
    """Views of each (w, h) image: itself, plus the crops transformers' pan-and-scan cuts from it (its own code, on
    an image-sized shape: the crop count depends on the size alone)."""
    kw = gemma3_images_kwargs(processor, call)
    if not kw.get("do_pan_and_scan"):
        return [1] * len(sizes)
    cut = processor.image_processor.pan_and_scan
    return [1 + len(cut(np.broadcast_to(np.zeros((), np.uint8), (3, h, w)), kw["pan_and_scan_min_crop_size"],
                        kw["pan_and_scan_max_num_crops"], kw["pan_and_scan_min_ratio_to_activate"]))
            for w, h in sizes]


def gemma4_settings(processor, kw: dict) -> tuple[dict, tuple]:
    """Gemma 4: the soft-token budget (one of its image processor's five) sets the resize and the token count."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import _SUPPORTED_SOFT_TOKENS
    ip = processor.image_processor
    budget = kw.get("max_soft_tokens", ip.max_soft_tokens)
    if isinstance(budget, bool) or budget not in _SUPPORTED_SOFT_TOKENS:
        raise bad_kwarg("mm_processor_kwargs 'max_soft_tokens' must be one of {allowed}, got {value}",
                        allowed=", ".join(map(str, _SUPPORTED_SOFT_TOKENS)), value=repr(budget))
    call = {"max_soft_tokens": budget} if "max_soft_tokens" in kw else {}
    return call, (("max_soft_tokens", budget), ("patch", ip.patch_size), ("pool", ip.pooling_kernel_size), ip.resample,
                  ip.rescale_factor, ip.do_normalize, tuple(ip.image_mean), tuple(ip.image_std))


def image_settings(family, processor, mm_kwargs: dict | None) -> tuple[dict, tuple]:
    """Validate per-request overrides against the family's knobs; return (processor call kwargs, key-C settings)."""
    kw = dict(mm_kwargs or {})
    unknown = set(kw) - set(family.knobs)
    if unknown:
        raise Refused("unknown_processor_kwarg", "unsupported mm_processor_kwargs {names} for {model}; allowed: "
                      "{allowed}", param="mm_processor_kwargs", names=str(sorted(unknown)), model=family.title,
                      allowed=", ".join(family.knobs) or "none (a text model takes no images)")
    if family.images == "patches":
        return qwen_settings(processor.image_processor, kw)
    if family.tiling == "crops":
        return internvl_settings(processor, kw)
    if family.images == "tiles":
        return smolvlm_settings(processor, kw)
    if family.images == "fixed":
        return gemma3_settings(processor, kw)
    if family.images == "budget":
        return gemma4_settings(processor, kw)
    return {}, ()


def placeholder_types(family, processor, out) -> list[int]:
    """1 for each image placeholder token, 0 for text (Qwen's and Gemma 3's processors say so; the others by the
    token id). Gemma 3's are HF's token_type_ids: its soft tokens only, not <start_of_image> / <end_of_image>."""
    ids = out["input_ids"][0].tolist()
    if "mm_token_type_ids" in out:
        return out["mm_token_type_ids"][0].tolist()
    if family.images == "fixed":
        return out["token_type_ids"][0].tolist()
    image_id = getattr(processor, "image_token_id", None) if family.images != "none" else None
    return [int(t == image_id) for t in ids]


def runs(types: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of placeholder tokens."""
    out, i = [], 0
    while i < len(types):
        if types[i]:
            j = i
            while j < len(types) and types[j]:
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def gemma3_spans(processor, found: list[tuple[int, int]], sizes: list[tuple[int, int]], call: dict) -> list[ImageSpan]:
    """Gemma 3: one run of image_seq_length soft tokens per view (the image first, then its crops, text between);
    an image spans its views' runs."""
    views = gemma3_views(processor, sizes, call)
    if sum(views) != len(found):
        raise Refused("invalid_image", "the processor laid out {laid} images for {n} given", reason="image_layout",
                      laid=len(found), n=sum(views))
    spans, k = [], 0
    for (w, h), n in zip(sizes, views):
        own = found[k:k + n]
        k += n
        crops = n - 1
        tiles = ((1, crops) if w >= h else (crops, 1)) if crops else None  # pan-and-scan cuts along the long side
        spans.append(ImageSpan(own[0][0], own[-1][1], sum(b - a for a, b in own), n, None, tiles, False))
    return spans


def patch_grid(xy) -> tuple:
    """("patch_grid", rows, cols, patches) of one image's patch positions [budget, 2] ((x, y); padding (-1, -1)):
    where its patches sit, which the position table (Gemma 4 12B) or the tower's 2-D RoPE reads."""
    real = xy[(xy >= 0).all(-1)]
    return (("patch_grid", int(real[:, 1].max()) + 1, int(real[:, 0].max()) + 1, len(real)),)


ROW_COL = re.compile(r"<row_(\d+)_col_(\d+)>")


def locate_images(family, processor, out, types: list[int], sizes: list[tuple[int, int]], call: dict) -> list[ImageSpan]:
    """Each image's span, pixel rows and tiling, from the processor output (sizes: each image's (w, h))."""
    found = runs(types)
    if family.images == "patches":
        grids = [tuple(g) for g in out["image_grid_thw"].tolist()]
        return [ImageSpan(s, e, e - s, g[0] * g[1] * g[2], g, None, False) for (s, e), g in zip(found, grids)]
    if family.images == "fixed":
        return gemma3_spans(processor, found, sizes, call)
    if family.images == "budget":  # Gemma 4: one run of soft tokens per image, one row of pixel_values each
        return [ImageSpan(s, e, e - s, 1, None, None, False, patch_grid(xy))
                for (s, e), xy in zip(found, out["image_position_ids"])]
    if family.tiling == "crops":
        ip, per = processor.image_processor, processor.image_seq_length
        lo, hi = call.get("min_patches", ip.min_patches), call.get("max_patches", ip.max_patches)
        spans = []
        for (s, e), (w, h) in zip(found, sizes):
            crops = (e - s) // per
            tiles = None
            if crops > 1:  # the processor's own choice of grid (GotOcr2's closest aspect ratio), then a thumbnail
                cols, rows = get_optimal_tiled_canvas((h, w), (ip.size.height, ip.size.width), lo, hi)
                tiles = (rows, cols)
            spans.append(ImageSpan(s, e, e - s, crops, None, tiles, crops > 1))
        return spans
    # SmolVLM / Idefics3: one run per tile, each after a <row_i_col_j> marker; the run after <global-img> ends the image
    tokens = processor.tokenizer.convert_ids_to_tokens(out["input_ids"][0].tolist())
    spans, group = [], []
    for s, e in found:
        group.append((s, e))
        marker = tokens[s - 1] if s else ""
        if marker == (getattr(processor, "global_image_token", None) or processor.global_image_tag):
            last = ROW_COL.fullmatch(tokens[group[-2][0] - 1]) if len(group) > 1 else None
            tiles = (int(last.group(1)), int(last.group(2))) if last else None
            spans.append(ImageSpan(group[0][0], e, sum(b - a for a, b in group), len(group), None, tiles,
                                   tiles is not None))
            group = []
    return spans
