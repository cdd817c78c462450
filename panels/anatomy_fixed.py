"""Anatomy pictures for Gemma 3's 'fixed' image kind: every view of an image becomes the same mm_tokens_per_image soft
tokens between <start_of_image> and <end_of_image>, whatever the image's size: the view is squashed to the tower's
square, cut into patches, and the patch grid is average-pooled into a small token grid. View 0 is the whole image;
with do_pan_and_scan a long image also gets crops along its long side (transformers' own pan_and_scan cuts them
here), each a view of its own with its own run of soft tokens after the text between them."""
import numpy as np
import plotly.graph_objects as go
from PIL import Image

from panels.anatomy_figures import GRID_DISPLAY, MERGE_LINE, PATCH_LINE, raster_figure
from panels.anatomy_tiles import CROP_LINE, _lines, side_by_side
from panels.i18n import EN, t


def pan_and_scan(info) -> tuple:
    """(on, min crop px, most crops, min aspect ratio) the processor used (the settings that entered key C)."""
    named = next(s for s in info.settings if isinstance(s, tuple) and s and s[0] == "pan_and_scan")
    return named[1:]


def crops(image_processor, image: Image.Image, info) -> list[np.ndarray]:
    """The pan-and-scan crops of `image` (HWC), cut by transformers' Gemma3 image processor itself; [] when off or
    when the image is not long enough."""
    on, least, most, ratio = pan_and_scan(info)
    if not on or not info.tiles:
        return []
    chw = np.asarray(image.convert("RGB")).transpose(2, 0, 1)
    return [c.transpose(1, 2, 0) for c in image_processor.pan_and_scan(chw, least, most, ratio)]


def views(image_processor, image: Image.Image, info) -> list[np.ndarray]:
    """What the vision tower gets, in token order, each squashed to its tile_size square: the whole image, then its
    crops."""
    side = (info.tile_size, info.tile_size)
    whole = np.asarray(image.convert("RGB").resize(side, Image.BICUBIC))
    return [whole] + [np.asarray(Image.fromarray(c).resize(side, Image.BICUBIC))
                      for c in crops(image_processor, image, info)]


def fixed_cells(image_processor, image: Image.Image, info, cell: int) -> list[np.ndarray]:
    """Per view, its token cells scaled to cell×cell: [side, side, cell, cell, 3] (one pooled token = one cell)."""
    side = int(round(info.tokens_per_tile ** 0.5))
    out = []
    for v in views(image_processor, image, info):
        px = np.asarray(Image.fromarray(v).resize((side * cell, side * cell), Image.BILINEAR))
        out.append(px.reshape(side, cell, side, cell, 3).transpose(0, 2, 1, 3, 4))
    return out


def fixed_grid_figure(image_processor, images: list[Image.Image], infos: list, lang: str = EN) -> go.Figure:
    """Each image's views side by side, each squashed to the tower's square: thin lines between patches, thick ones
    around each pooled group (one group = one soft token); the crops framed red."""
    panels, notes = [], []
    for k, (im, info) in enumerate(zip(images, infos)):
        side = int(round(info.tokens_per_tile ** 0.5))
        per_side = info.tile_size // info.patch_size
        shown = views(image_processor, im, info)
        size = max(96, GRID_DISPLAY // len(shown))  # the views side by side as wide as one Qwen image
        for v, view in enumerate(shown):
            px = np.array(Image.fromarray(view).resize((size, size), Image.NEAREST))
            _lines(px, size / per_side, PATCH_LINE)
            _lines(px, size / side, MERGE_LINE, thick=1)
            if v:
                _lines(px, size, CROP_LINE, thick=1)
            panels.append(px)
        on, least, _, ratio = pan_and_scan(info)
        cut = (t(lang, "anat.fixed_crops", n=len(shown) - 1, rows=info.tiles[0], cols=info.tiles[1]) if len(shown) > 1
               else t(lang, "anat.fixed_not_cut", least=least, ratio=ratio) if on else t(lang, "anat.fixed_off"))
        notes.append(t(lang, "anat.fixed_note", k=k + 1, ow=info.original_size[0], oh=info.original_size[1],
                       size=info.tile_size, cut=cut, patches=per_side, patch=info.patch_size, pool=info.merge_size,
                       side=side, per=info.tokens_per_tile, views=len(shown), s="s" if len(shown) > 1 else "",
                       n=info.num_tokens))
    return raster_figure(side_by_side(panels), [], "<br>".join(notes) + t(lang, "anat.fixed_legend"), max_scale=1.25)
