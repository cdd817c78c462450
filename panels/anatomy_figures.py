"""Pictures of a prompt's anatomy (pure functions of minivlm's Anatomy and the decoded images): the image with its
patch and merge grid, the token strip in KV blocks, M-RoPE heatmaps. Pixels are composed into ONE raster per
figure (a 1000-token image is one go.Image, not 1000 traces); labels and hover are one scatter trace each."""
import base64
import io
import re

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sequential
from plotly.subplots import make_subplots
from PIL import Image

from panels.i18n import EN, t as say  # t: a token in this file


TEXT_BG, SPECIAL_BG, EMPTY_BG = (226, 234, 246), (205, 196, 238), (246, 246, 246)
BLOCK_EDGE, PATCH_LINE, MERGE_LINE = (35, 35, 35), (255, 255, 255), (255, 190, 0)
GRID_DISPLAY = 360    # the longest side of each image on the grid picture, in px
ROW_GAP, BLOCK_GAP, IMAGE_GAP, STRIP_TOP = 16, 6, 28, 16
AXES = ("t (time)", "h (row)", "w (column)")
ROPE_GAP, ROPE_TITLE_FONT = 0.04, 12  # between the M-RoPE heatmaps (a share of the width); their titles' size
CELL_TEXT = "#111111"  # the numbers on the heatmaps' cells, in both themes
# Viridis mixed half with white: the same order of hues, each light enough for CELL_TEXT at >= 5:1 (plotly's own
# pick of black or white text on Viridis' middle greens gave 3.9:1)
PALE_VIRIDIS = [[i / (len(sequential.Viridis) - 1),
                 "#" + "".join(f"{round(v + (255 - v) / 2):02x}" for v in bytes.fromhex(color[1:]))]
                for i, color in enumerate(sequential.Viridis)]
TOP_MARGIN = 100      # what gradio's plot gives a titled figure whatever the layout asks
TITLE = dict(font=dict(size=13), y=1, yref="container", yanchor="top", pad=dict(t=44))  # below gradio's label
MARGIN_X = 20         # a figure's left and right margins together
LABEL_FONT = 11       # the strip's token labels (monospace: 0.6 em a letter)


def text_px(text: str, size: float) -> float:
    """About how wide `text` is drawn at `size` px in the figures' sans-serif (0.58 em a letter, a CJK character a
    whole em): what a figure reserves so that no line of it is cut or runs into another."""
    wide = sum(ord(ch) >= 0x2E80 for ch in text)
    return (len(text) - wide) * 0.58 * size + wide * size


def title_px(title: str, size: float = 13) -> float:
    """The widest line of a plotly title (lines split at <br>, <sup> drawn at 70 %, other tags not drawn)."""
    widest = 0.0
    for line in re.split(r"<br\s*/?>", title):
        sup = re.sub(r"<[^>]+>", "", "".join(re.findall(r"<sup>(.*?)</sup>", line)))
        plain = re.sub(r"<[^>]+>", "", re.sub(r"<sup>.*?</sup>", "", line))
        widest = max(widest, text_px(plain, size) + text_px(sup, 0.7 * size))
    return widest


def needs_width(fig: go.Figure, px: float) -> go.Figure:
    """Say the width (px) below which `fig`'s words would collide or be cut: the page keeps it that wide and
    scrolls it sideways on a narrower screen (panels/page.py); never less than its title's widest line."""
    title = fig.layout.title.text or ""
    size = fig.layout.title.font.size or 1.4 * (fig.layout.font.size or 12)  # plotly's default: 1.4 x the font
    px = max(px, title_px(title, size) + MARGIN_X if title else 0)
    fig.update_layout(meta={**(fig.layout.meta or {}), "min_width": int(px + 0.5)})
    return fig


def data_uri(pixels: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)  # 10x faster than PNG on photos, and smaller
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def raster_figure(pixels: np.ndarray, traces: list, title: str, width_hint: int = 1150,
                  max_scale: float = 4.0) -> go.Figure:
    """One go.Image of `pixels` in pixel coordinates (y down), with overlay traces; the height fits the raster
    shown `width_hint` px wide (about a tab's width), enlarged at most `max_scale` times."""
    h, w = pixels.shape[:2]
    fig = go.Figure([go.Image(source=data_uri(pixels), x0=0, y0=0, dx=1, dy=1, hoverinfo="skip"), *traces])
    fig.update_layout(title=dict(TITLE, text=title), showlegend=False,
                      height=int(h * min(max_scale, width_hint / w)) + TOP_MARGIN + 10,
                      margin=dict(l=10, r=10, t=TOP_MARGIN, b=10),
                      xaxis=dict(visible=False, range=[0, w]),
                      yaxis=dict(visible=False, range=[h, 0], scaleanchor="x"))
    return needs_width(fig, 0)


def short_label(text: str, width: int) -> str:
    """A token's text for a cell: special tokens without <| |>, whitespace made visible, cut to the cell."""
    if text.startswith("<|") and text.endswith("|>"):
        text = text[2:-2]
    text = text.replace("\n", "⏎").replace(" ", "·") or "∅"
    return text if len(text) <= width else text[:width - 1] + "…"


def cell_tiles(image: Image.Image, info, cell: int) -> np.ndarray:
    """The resized image cut into its merged patches, each scaled to cell×cell: [rows, cols, cell, cell, 3]."""
    rows, cols = info.grid_thw[1] // info.merge_size, info.grid_thw[2] // info.merge_size
    px = np.asarray(image.resize((cols * cell, rows * cell), Image.BILINEAR))
    return px.reshape(rows, cell, cols, cell, 3).transpose(0, 2, 1, 3, 4)


def grid_figure(images: list[Image.Image], infos: list, lang: str = EN) -> go.Figure:
    """Each image as the vision tower sees it (resized), thin lines between patches, thick ones around each
    merge×merge group: one group = one token. Hover a group for its token's index and M-RoPE position."""
    scaled, hover = [], []
    for im, info in zip(images, infos):
        s = GRID_DISPLAY / max(info.resized_size)
        w, h = round(info.resized_size[0] * s), round(info.resized_size[1] * s)
        px = np.array(im.resize(info.resized_size, Image.BICUBIC).resize((w, h), Image.NEAREST))
        step = info.patch_size * s
        for k, y in enumerate(np.arange(0, h + 1, step).round().astype(int)):  # grid lines in the raster itself
            merge = k % info.merge_size == 0
            px[max(0, min(h - 1, y) - merge):min(h, y + 1 + merge)] = MERGE_LINE if merge else PATCH_LINE
        for k, x in enumerate(np.arange(0, w + 1, step).round().astype(int)):
            merge = k % info.merge_size == 0
            px[:, max(0, min(w - 1, x) - merge):min(w, x + 1 + merge)] = MERGE_LINE if merge else PATCH_LINE
        scaled.append(px)
    height = max(p.shape[0] for p in scaled)
    canvas = np.full((height + 4, sum(p.shape[1] for p in scaled) + IMAGE_GAP * (len(scaled) - 1), 3), 255, np.uint8)
    x0, notes = 0, []
    for px, info, k in zip(scaled, infos, range(len(infos))):
        canvas[:px.shape[0], x0:x0 + px.shape[1]] = px
        g = info.patch_size * info.merge_size * px.shape[1] / info.resized_size[0]
        rows, cols = info.grid_thw[1] // info.merge_size, info.grid_thw[2] // info.merge_size
        xs, ys = np.meshgrid(x0 + g * (np.arange(cols) + 0.5), g * (np.arange(rows) + 0.5))
        hover.append(go.Scatter(x=xs.ravel(), y=ys.ravel(), mode="markers", hoverinfo="text",
                                marker=dict(size=max(4, g * 0.8), opacity=0, symbol="square"),
                                hovertext=[say(lang, "anat.grid_hover", k=k + 1, i=info.start + j, row=j // cols,
                                             col=j % cols) for j in range(rows * cols)]))
        notes.append(say(lang, "anat.grid_note", k=k + 1, ow=info.original_size[0], oh=info.original_size[1],
                       rw=info.resized_size[0], rh=info.resized_size[1], gw=info.grid_thw[2], gh=info.grid_thw[1],
                       patch=info.patch_size, m=info.merge_size, cols=cols, rows=rows, n=info.num_tokens))
        x0 += px.shape[1] + IMAGE_GAP
    title = "<br>".join(notes) + say(lang, "anat.grid_legend")
    return raster_figure(canvas, hover, title, max_scale=1.25)


def strip_layout(n: int, block_size: int) -> tuple[int, int]:
    """(cell px, tokens per row): whole blocks per row, about 32 tokens a row, smaller cells for long prompts."""
    per_row = max(1, (32 if n <= 400 else 64) // block_size) * block_size
    return (44 if n <= 400 else 20), per_row


def token_strip_figure(anatomy, images: list[Image.Image], tiled_cells=None, lang: str = EN) -> go.Figure:
    """The prompt token by token, wrapped in whole KV blocks: text tokens labelled, image tokens as thumbnails of
    their merged patch (tiled_cells(image, info, cell): a tiled family's per-view cells), each block outlined (the
    empty slots of a partial last block shown as such)."""
    bs, n = anatomy.block_size, len(anatomy.tokens)
    cell, per_row = strip_layout(n, bs)
    nblocks_row = per_row // bs
    num_rows = -(-max(n, 1) // per_row)
    width = per_row * cell + (nblocks_row - 1) * BLOCK_GAP + 4
    canvas = np.full((STRIP_TOP + num_rows * (cell + ROW_GAP), width, 3), 255, np.uint8)
    cut = tiled_cells if anatomy.images_as in ("tiles", "fixed") else cell_tiles
    tiles = [cut(im, info, cell) for im, info in zip(images, anatomy.images)]

    def origin(i):  # top-left pixel of token slot i
        row, col = divmod(i, per_row)
        return 2 + col * cell + col // bs * BLOCK_GAP, STRIP_TOP + row * (cell + ROW_GAP)

    labels_x, labels_y, labels, hover = [], [], [], []
    width_chars = max(2, cell // 8)
    for t in anatomy.tokens:
        x, y = origin(t.index)
        if t.type == "image":
            view = tiles[t.image_index] if t.tile is None else tiles[t.image_index][t.tile]
            canvas[y:y + cell - 1, x:x + cell - 1] = view[t.grid_row, t.grid_col][:-1, :-1]
        else:
            special = t.text.startswith("<") and t.text.endswith(">") and len(t.text) > 2  # <|im_start|>, <row_1_col_2>
            canvas[y:y + cell - 1, x:x + cell - 1] = SPECIAL_BG if special else TEXT_BG
            if cell >= 30:
                labels_x.append(x + cell / 2)
                labels_y.append(y + cell / 2)
                labels.append(short_label(t.text, width_chars))
        view = "" if t.tile is None else f"view {t.tile + 1}, "
        where = f"image {t.image_index + 1} ({view}row {t.grid_row}, col {t.grid_col})" if t.type == "image" else "text"
        rope = f"M-RoPE (t, h, w) = {t.position}" if anatomy.mrope else f"position {t.position[0]} (1-D RoPE)"
        hover.append(f"token {t.index} · id {t.token_id} · {t.text!r}<br>{where}<br>"
                     f"{rope}<br>block {t.index // bs}, slot {t.index % bs}")
    block_x, block_y, block_text = [], [], []
    for b in anatomy.blocks:
        x, y = origin(b.start)
        for i in range(b.end, b.start + bs):  # unused slots of a partial block: internal fragmentation
            ex, ey = origin(i)
            canvas[ey:ey + cell - 1, ex:ex + cell - 1] = EMPTY_BG
        x1 = x + bs * cell
        canvas[y - 2:y, x - 2:x1] = canvas[y + cell - 1:y + cell + 1, x - 2:x1] = BLOCK_EDGE
        canvas[y - 2:y + cell + 1, x - 2:x] = canvas[y - 2:y + cell + 1, x1 - 1:x1 + 1] = BLOCK_EDGE
        block_x.append(x + 2)
        block_y.append(y - 3)
        block_text.append(say(lang, "anat.block_label", i=b.index)
                          + ("" if b.full else say(lang, "anat.partial", n=b.end - b.start, bs=bs)))
    xs, ys = (np.array([origin(i) for i in range(n)]) + cell / 2).reshape(-1, 2).T
    traces = [go.Scatter(x=xs, y=ys, mode="markers", hoverinfo="text", hovertext=hover,
                         marker=dict(size=cell * 0.6, opacity=0, symbol="square")),
              go.Scatter(x=labels_x, y=labels_y, text=labels, mode="text", hoverinfo="skip",
                         textfont=dict(size=LABEL_FONT, family="monospace", color="#222")),
              go.Scatter(x=block_x, y=block_y, text=block_text, mode="text", hoverinfo="skip", textposition="top right",
                         textfont=dict(size=11, color="#444"))]
    n_image = sum(t.type == "image" for t in anatomy.tokens)
    title = say(lang, "anat.strip_title", n=n, text=n - n_image, image=n_image, blocks=len(anatomy.blocks), bs=bs)
    fig = raster_figure(canvas, traces, title)
    if labels:  # a cell shown at least as wide as its label (monospace letters, and 4 px apart)
        needs_width(fig, width * (width_chars * 0.6 * LABEL_FONT + 4) / cell + MARGIN_X)
    return fig


def offset(delta: int) -> str:
    """Token index i shifted by the rope delta, as a person writes it: "i − 56", "i + 3", "i"."""
    return "i" if delta == 0 else f"i {'−' if delta < 0 else '+'} {abs(delta)}"


def resumes(anatomy, info, lang: str = EN) -> str:
    """Where the text right after this image resumes ("" when another image or nothing follows it)."""
    end = info.end or info.start + info.num_tokens
    upto = min([im.start for im in anatomy.images if im.start >= end] + [len(anatomy.tokens)])
    after = next((tok for tok in anatomy.tokens[end:upto] if tok.type == "text"), None)
    return say(lang, "anat.rope_tail", n=after.position[0]) if after is not None else ""


def rope_figure(anatomy, lang: str = EN) -> go.Figure:
    """For each image, its tokens' M-RoPE t, h and w ids as heatmaps over its merged grid (the actual ids: the
    image starts where the text before it ended; the text after each image resumes at its start + max(rows,
    cols))."""
    if not anatomy.images:
        fig = go.Figure()
        fig.update_layout(title=dict(TITLE, text=say(lang, "anat.rope_none")),
                          height=TOP_MARGIN + 20,
                          xaxis=dict(visible=False), yaxis=dict(visible=False))
        return fig
    titles = [say(lang, "anat.rope_axis", k=k + 1, axis=axis) for k in range(len(anatomy.images)) for axis in AXES]
    fig = make_subplots(rows=len(anatomy.images), cols=3, subplot_titles=titles, horizontal_spacing=ROPE_GAP,
                        vertical_spacing=0.12 / len(anatomy.images))
    fig.update_annotations(font_size=ROPE_TITLE_FONT)  # the subplot titles
    numbered = [info.grid_thw[2] // info.merge_size for info in anatomy.images
                if (info.grid_thw[1] // info.merge_size) * (info.grid_thw[2] // info.merge_size) <= 256]
    digits = len(str(max((max(t.position) for t in anatomy.tokens), default=0)))
    # each heatmap as wide as its numbers (9-px digits, 4 px apart) and its title: three of them side by side
    heatmap = max([cols * (digits * 0.6 * 9 + 4) for cols in numbered]
                  + [text_px(title, ROPE_TITLE_FONT) + 8 for title in titles])
    for k, info in enumerate(anatomy.images):
        rows, cols = info.grid_thw[1] // info.merge_size, info.grid_thw[2] // info.merge_size
        pos = np.array([t.position for t in anatomy.tokens[info.start:info.start + rows * cols]])
        for axis in range(3):
            z = pos[:, axis].reshape(rows, cols)
            fig.add_trace(go.Heatmap(z=z, colorscale=PALE_VIRIDIS, showscale=False, xgap=1, ygap=1,
                                     texttemplate="%{z}" if rows * cols <= 256 else None,
                                     textfont=dict(size=9, color=CELL_TEXT),
                                     hovertemplate=f"{AXES[axis]} = %{{z}}<br>row %{{y}}, col %{{x}}<extra></extra>"),
                          row=k + 1, col=axis + 1)
            fig.update_yaxes(autorange="reversed", scaleanchor=f"x{3 * k + axis + 1}", showticklabels=False,
                             row=k + 1, col=axis + 1)
            fig.update_xaxes(showticklabels=False, row=k + 1, col=axis + 1)
    starts = [say(lang, "anat.rope_image", k=k + 1, start=anatomy.tokens[info.start].position[0],
                  tail=resumes(anatomy, info, lang)) for k, info in enumerate(anatomy.images)]
    fig.update_layout(height=TOP_MARGIN + 260 * len(anatomy.images), margin=dict(l=10, r=10, t=TOP_MARGIN, b=10),
                      title=dict(TITLE, text=say(lang, "anat.rope_title", images=" · ".join(starts),
                                               offset=offset(anatomy.rope_delta))))
    return needs_width(fig, 3 * heatmap / (1 - 2 * ROPE_GAP) + MARGIN_X)
