"""Anatomy of a video (pure functions of minivlm's Anatomy and the sampled frames): the frame strip in temporal pairs
(one pair = one temporal patch = one group of tokens) with what stands for each pair, and the M-RoPE t / h / w ids
of every pair, where t now moves: Qwen2-VL one step per pair, Qwen2.5-VL seconds x tokens_per_second, Qwen3-VL
one image-like run per pair after its "<t seconds>" timestamp text."""
import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from PIL import Image

from minivlm.inputs.video import decode_frames, open_video
from panels.anatomy_figures import AXES, TITLE, TOP_MARGIN, raster_figure

FRAME_PX, PAIR_GAP, LABEL_H = 96, 14, 0
PAIR_EDGE = (255, 190, 0)


def video_items(messages: list[dict]) -> list[dict]:
    """The video content items of HF-format messages, in order."""
    return [c for m in messages if isinstance(m.get("content"), list) for c in m["content"]
            if isinstance(c, dict) and (c.get("type") == "video" or "video" in c)]


def sampled_frames(item: dict, facts) -> list[Image.Image]:
    """The frames the engine sampled from one video item (its facts name them), decoded by the engine's loader."""
    raw = item["video"]
    source = open_video(raw, facts.source_fps if isinstance(raw, (list, tuple)) else None, "video")
    return [Image.fromarray(f) for f in decode_frames(source, facts.indices)]


def with_video_frames(messages: list[dict], anatomy, images: list) -> tuple[list, dict]:
    """One picture per anatomy image (the images as given; a video's first sampled frame), and each video's
    sampled frames by its index in anatomy.images."""
    items, pictures, frames = iter(video_items(messages)), [], {}
    stills = iter(images)
    for k, info in enumerate(anatomy.images):
        if info.kind == "video":
            frames[k] = sampled_frames(next(items), info.video)
            pictures.append(frames[k][0])
        else:
            pictures.append(next(stills))
    return pictures, frames


def pair_label(info, pair: int, t_start: int) -> str:
    v = info.video
    if v.timestamps:
        return f"<{v.timestamps[pair]:.1f} seconds>"
    return f"t = {t_start}"


def frame_strip_figure(anatomy, frames: dict) -> go.Figure:
    """Each video's sampled frames left to right, boxed in temporal pairs; over each pair what the decoder sees
    for it: its timestamp text (Qwen3-VL) or its M-RoPE t, and its tokens."""
    rows, labels_x, labels_y, labels, notes = [], [], [], [], []
    y0 = 0
    for k, pictures in frames.items():
        info = anatomy.images[k]
        t, h, w = info.grid_thw
        per_pair = h * w // info.merge_size ** 2
        temporal = max(1, -(-len(pictures) // t))
        pairs = [pictures[i * temporal:(i + 1) * temporal] for i in range(t)]
        fw = round(FRAME_PX * info.resized_size[0] / max(info.resized_size[1], 1))
        width = t * (temporal * fw + PAIR_GAP)
        canvas = np.full((FRAME_PX + 8, width, 3), 255, np.uint8)
        video_tokens = [tok for tok in anatomy.tokens[info.start:info.end] if tok.type == "image"]
        for p, pair in enumerate(pairs):
            x = p * (temporal * fw + PAIR_GAP)
            for j, frame in enumerate(pair or pairs[-1][-1:]):
                canvas[4:4 + FRAME_PX, x + j * fw:x + (j + 1) * fw] = np.asarray(frame.resize((fw, FRAME_PX)))
            right = x + temporal * fw
            canvas[:4, x:right] = canvas[-4:, x:right] = PAIR_EDGE
            canvas[:, x:x + 3] = canvas[:, right - 3:right] = PAIR_EDGE
            first = video_tokens[p * per_pair] if p * per_pair < len(video_tokens) else None
            labels_x.append(x + temporal * fw / 2)
            labels_y.append(y0 - 6)
            labels.append(f"pair {p + 1} · {pair_label(info, p, first.position[0] if first else 0)} · "
                          f"{per_pair} tokens")
        rows.append(canvas)
        y0 += canvas.shape[0] + 30
        v = info.video
        notes.append(f"video {k + 1}: {len(v.indices)} of {v.total_frames} frames ({v.source_fps:g} fps) → {t} "
                     f"pairs × {per_pair} tokens = {info.num_tokens} tokens · {v.second_per_grid:g} s per pair")
    width = max(r.shape[1] for r in rows)
    canvas = np.full((sum(r.shape[0] + 30 for r in rows), width, 3), 255, np.uint8)
    y = 0
    for r in rows:
        canvas[y + 24:y + 24 + r.shape[0], :r.shape[1]] = r
        y += r.shape[0] + 30
    labels_y = [ly + 24 for ly in labels_y]
    trace = go.Scatter(x=labels_x, y=labels_y, text=labels, mode="text", hoverinfo="skip",
                       textfont=dict(size=10, color="#333"))
    title = "<br>".join(notes) + "<br><sup>yellow: temporal pairs (one pair = one group of tokens)</sup>"
    return raster_figure(canvas, [trace], title, max_scale=1.5)


def video_rope_figure(anatomy) -> go.Figure:
    """For each video, every token's M-RoPE t, h and w id: one row per frame pair, one column per token of the pair
    (row-major over its merged grid); the t panel is where time shows."""
    videos = [(k, im) for k, im in enumerate(anatomy.images) if im.kind == "video"]
    titles = [f"video {k + 1}: {axis}" for k, _ in videos for axis in AXES]
    fig = make_subplots(rows=len(videos), cols=3, subplot_titles=titles, horizontal_spacing=0.04,
                        vertical_spacing=0.15 / len(videos))
    for r, (k, info) in enumerate(videos):
        t = info.grid_thw[0]
        pos = np.array([tok.position for tok in anatomy.tokens[info.start:info.end] if tok.type == "image"])
        for axis in range(3):
            z = pos[:, axis].reshape(t, -1)
            fig.add_trace(go.Heatmap(z=z.tolist(), colorscale="Viridis", showscale=False, xgap=1, ygap=1,
                                     texttemplate="%{z}" if z.size <= 256 else None, textfont=dict(size=9),
                                     hovertemplate=f"{AXES[axis]} = %{{z}}<br>pair %{{y}}, token %{{x}}"
                                                   "<extra></extra>"),
                          row=r + 1, col=axis + 1)
            fig.update_yaxes(autorange="reversed", title_text="frame pair" if axis == 0 else None, row=r + 1,
                             col=axis + 1)
            fig.update_xaxes(showticklabels=False, row=r + 1, col=axis + 1)
    k, info = videos[0]
    v = info.video
    rule = (f"t = start + ⌊pair × {v.t_scale:g}⌋ (tokens_per_second × {v.second_per_grid:g} s per pair)"
            if v.t_scale != 1 else
            "each pair is its own run after its timestamp text; t restarts at that run's start" if v.timestamps else
            "t moves one per pair")
    fig.update_layout(height=TOP_MARGIN + 220 * len(videos), margin=dict(l=10, r=10, t=TOP_MARGIN, b=10),
                      title=dict(TITLE, text=f"video {k + 1}: {rule}<br><sup>generated token i gets i "
                                             f"{anatomy.rope_delta:+d} on all three axes</sup>"))
    return fig
