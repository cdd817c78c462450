"""Anatomy pictures for the tiled families (SmolVLM2, Idefics3, InternVL): the image cut into crops plus its global
view, each crop's token grid (patches pixel-shuffled into fewer tokens), and the 1-D positions of the image tokens."""
import numpy as np
import plotly.graph_objects as go
from PIL import Image

from panels.anatomy_figures import (GRID_DISPLAY, IMAGE_GAP, MERGE_LINE, PATCH_LINE, TITLE, TOP_MARGIN, needs_width,
                                    raster_figure)

CROP_LINE = (220, 38, 38)


def tile_views(image: Image.Image, info) -> list[np.ndarray]:
    """The views the vision tower gets, in token order: each crop of the resized image (row-major), then the global
    view (the whole image at one tile's size). An image that was not split is its global view alone."""
    t = info.tile_size
    views = []
    if info.tiles:
        rows, cols = info.tiles
        big = np.asarray(image.resize((cols * t, rows * t), Image.BICUBIC))
        views = [big[r * t:(r + 1) * t, c * t:(c + 1) * t] for r in range(rows) for c in range(cols)]
    if info.thumbnail or not info.tiles:
        views.append(np.asarray(image.resize((t, t), Image.BICUBIC)))
    return views


def cell_tiles(image: Image.Image, info, cell: int) -> list[np.ndarray]:
    """Per view, its token cells scaled to cell×cell: [side, side, cell, cell, 3] (one token = one cell)."""
    side = int(round(info.tokens_per_tile ** 0.5))
    out = []
    for v in tile_views(image, info):
        px = np.asarray(Image.fromarray(v).resize((side * cell, side * cell), Image.BILINEAR))
        out.append(px.reshape(side, cell, side, cell, 3).transpose(0, 2, 1, 3, 4))
    return out


def _lines(px: np.ndarray, step: float, color, thick: int = 0):
    h, w = px.shape[:2]
    for y in np.arange(0, h + 1, step).round().astype(int):
        px[max(0, min(h - 1, y) - thick):min(h, y + 1 + thick)] = color
    for x in np.arange(0, w + 1, step).round().astype(int):
        px[:, max(0, min(w - 1, x) - thick):min(w, x + 1 + thick)] = color


def tiled_grid_figure(images: list[Image.Image], infos: list) -> go.Figure:
    """Each image resized to whole crops, red lines between crops and thin ones between its tokens, and the global
    view beside it; every view becomes tokens_per_tile tokens."""
    panels, notes = [], []
    for k, (im, info) in enumerate(zip(images, infos)):
        side = int(round(info.tokens_per_tile ** 0.5))
        rows, cols = info.tiles or (1, 1)
        s = GRID_DISPLAY / max(rows, cols) / info.tile_size
        t = max(8, round(info.tile_size * s))
        if info.tiles:
            px = np.array(im.resize((cols * t, rows * t), Image.BICUBIC))
            _lines(px, t / side, PATCH_LINE)
            _lines(px, t, CROP_LINE, thick=1)
            panels.append(px)
        if info.thumbnail or not info.tiles:
            g = np.array(im.resize((GRID_DISPLAY // 2, GRID_DISPLAY // 2), Image.BICUBIC))
            _lines(g, g.shape[0] / side, PATCH_LINE)
            _lines(g, g.shape[0], MERGE_LINE, thick=1)
            panels.append(g)
        crops = f"{rows}×{cols} crops of {info.tile_size} px + a global view" if info.tiles else \
            f"not split: one {info.tile_size}-px view"
        views = rows * cols + 1 if info.tiles else 1
        notes.append(f"image {k + 1}: {info.original_size[0]}×{info.original_size[1]} → {info.resized_size[0]}×"
                     f"{info.resized_size[1]} · {crops}<br>each view {info.tile_size // info.patch_size}² patches of "
                     f"{info.patch_size} px, pixel-shuffled {info.merge_size}×{info.merge_size} → {side}×{side} = "
                     f"{info.tokens_per_tile} tokens · {views} × {info.tokens_per_tile} = {info.num_tokens} tokens")
    canvas = side_by_side(panels)
    title = "<br>".join(notes) + ("<br><sup>red: crop edges · white: token cells (one cell = one token) · "
                                  "yellow frame: the global view, its tokens come last</sup>")
    return raster_figure(canvas, [], title, max_scale=1.25)


def positions_figure(anatomy) -> go.Figure:
    """1-D RoPE: per image, each view's tokens' position ids as a heatmap (rows: views, columns: tokens)."""
    if not anatomy.images:
        fig = go.Figure()
        fig.update_layout(title=dict(TITLE, text="No image: token i sits at position i (1-D RoPE)"),
                          height=TOP_MARGIN + 20, xaxis=dict(visible=False), yaxis=dict(visible=False))
        return fig
    fig = go.Figure()
    y0, labels, spans = 0, [], []
    for k, info in enumerate(anatomy.images):
        toks = [t for t in anatomy.tokens[info.start:info.end] if t.type == "image"]
        views = len(toks) // info.tokens_per_tile
        z = np.array([t.position[0] for t in toks]).reshape(views, info.tokens_per_tile)
        fig.add_trace(go.Heatmap(z=z, y=list(range(y0, y0 + views)), colorscale="Viridis", showscale=False, xgap=1,
                                 ygap=1, hovertemplate="position %{z}<br>token %{x} of the view<extra></extra>"))
        if anatomy.images_as == "fixed":  # Gemma 3: the whole image first, then its pan-and-scan crops
            names = [f"img {k + 1}"] + [f"img {k + 1} crop {v}" for v in range(1, views)]
        else:
            names = [f"img {k + 1} crop {v + 1}" for v in range(views - 1)] + [f"img {k + 1} global"] \
                if info.tiles else [f"img {k + 1}"]
        labels += names
        y0 += views
        spans.append(f"image {k + 1}: positions {toks[0].position[0]}–{toks[-1].position[0]}")
    fig.update_yaxes(autorange="reversed", tickvals=list(range(y0)), ticktext=labels)
    fig.update_xaxes(title="token within the view")
    fig.update_layout(height=TOP_MARGIN + 60 + 26 * y0, margin=dict(l=10, r=10, t=TOP_MARGIN, b=40),
                      title=dict(TITLE, text=(
                          f"1-D RoPE: every token, image or marker, takes the next position ({'; '.join(spans)})"
                          f"<br><sup>the markers between crops count too; generated token i sits at i</sup>")))
    return needs_width(fig, 0)  # its title whole on a phone (the figure scrolls sideways)


def side_by_side(panels: list) -> np.ndarray:
    """Image panels (H x W x 3 uint8) on one white canvas, left to right, IMAGE_GAP apart."""
    height = max(p.shape[0] for p in panels)
    canvas = np.full((height + 4, sum(p.shape[1] for p in panels) + IMAGE_GAP * (len(panels) - 1), 3), 255, np.uint8)
    x0 = 0
    for px in panels:
        canvas[:px.shape[0], x0:x0 + px.shape[1]] = px
        x0 += px.shape[1] + IMAGE_GAP
    return canvas
