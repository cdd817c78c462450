"""A second, independent scene renderer for evaluation: the same scene spec and the same truth (tools/scenes.py:
`Scene`, `position`, `describe`, `ask`), but its own placement sampler and its own rasteriser, so an accuracy
measured on it is not a property of the training generator's drawing code.

What differs from tools/scenes.py: the random source (numpy's PCG64, not Python's `random`); placement (each
shape's side is drawn first, then its centre uniformly where the box fits, all shapes of a scene at once and the
scene redrawn on overlap, instead of growing a list box by box); and drawing (a numpy rasteriser that computes
each pixel's coverage from 4 x 4 sub-pixel samples, or from the pixel's centre alone for hard edges, and blends
colour by coverage, instead of PIL's `ImageDraw` with optional 2x supersampling and bilinear downsizing).
"""
import random

import numpy as np
from PIL import Image

from tools.scenes import COLORS, SHAPES, Scene, Shape, ask, possible_types

GAP = 2  # boxes at least this far apart on either axis (the spec's "non-overlapping")


def _apart(a, b) -> bool:
    return (a[0] + a[2] + GAP <= b[0] or b[0] + b[2] + GAP <= a[0] or
            a[1] + a[2] + GAP <= b[1] or b[1] + b[2] + GAP <= a[1])


def alt_scene(gen: np.random.Generator, num_shapes: int) -> Scene:
    """A scene of the spec: canvas sides in [112, 336], background channels in [200, 255], num_shapes boxes with
    side in [25 %, 45 %] of the shorter side, fully inside, apart; kinds and colours uniform, channels jittered
    by up to 20."""
    while True:
        width, height = (int(v) for v in gen.integers(112, 337, size=2))
        short = min(width, height)
        sides = gen.integers(int(np.ceil(0.25 * short)), int(0.45 * short) + 1, size=num_shapes)
        boxes = []
        for side in sides:  # the centre uniform over where the whole box fits
            cx, cy = gen.uniform(side / 2, width - side / 2), gen.uniform(side / 2, height - side / 2)
            x, y = int(round(cx - side / 2)), int(round(cy - side / 2))
            boxes.append((min(max(x, 0), width - side), min(max(y, 0), height - side), int(side)))
        if all(_apart(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]):
            break
    shapes = []
    for x, y, side in boxes:
        kind, color = SHAPES[gen.integers(3)], list(COLORS)[gen.integers(len(COLORS))]
        rgb = tuple(int(np.clip(c + gen.integers(-20, 21), 0, 255)) for c in COLORS[color])
        shapes.append(Shape(kind, color, rgb, int(x), int(y), int(side)))
    background = tuple(int(v) for v in gen.integers(200, 256, size=3))
    return Scene(width, height, background, tuple(shapes))


def _inside(kind: str, x0: float, y0: float, side: float, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """Whether points (px, py) lie in the shape whose bounding box is (x0, y0, side)."""
    if kind == "square":
        return (px >= x0) & (px < x0 + side) & (py >= y0) & (py < y0 + side)
    if kind == "circle":
        r = side / 2
        return (px - x0 - r) ** 2 + (py - y0 - r) ** 2 <= r * r
    # upward triangle: apex at the box's top centre, base on its bottom edge; half-width grows linearly with depth
    depth = (py - y0) / side
    return (depth >= 0) & (depth <= 1) & (np.abs(px - x0 - side / 2) <= depth * side / 2)


def rasterise(scene: Scene, samples: int = 4) -> Image.Image:
    """The scene as an RGB image: each pixel blends shape colour over background by the share of its samples x
    samples sub-pixel points inside the shape (samples 1: the pixel centre only, hard edges)."""
    h, w = scene.height, scene.width
    offsets = (np.arange(samples) + 0.5) / samples
    ys = (np.arange(h)[:, None] + offsets[None, :]).reshape(-1)  # sub-pixel rows
    xs = (np.arange(w)[:, None] + offsets[None, :]).reshape(-1)
    py, px = np.meshgrid(ys, xs, indexing="ij")
    image = np.broadcast_to(np.array(scene.background, float), (h, w, 3)).copy()
    for sh in scene.shapes:
        cover = _inside(sh.kind, sh.x, sh.y, sh.side, px, py).reshape(h, samples, w, samples).mean((1, 3))
        image = image * (1 - cover[..., None]) + np.array(sh.rgb, float) * cover[..., None]
    return Image.fromarray(np.round(image).astype(np.uint8))


def alt_sample(seed: int, qtype: str, num_shapes: int = None, lang: str = "en"):
    """A fresh (image, question, answer, qtype, scene) from one seed, like scenes.sample but placed and drawn here;
    the question and its truth come from scenes.ask (same draws for either language)."""
    gen = np.random.default_rng(seed)
    num = 1 if qtype in ("color", "shape") else num_shapes or int(gen.integers(1, 4))
    scene = alt_scene(gen, num)
    while qtype not in possible_types(scene):
        scene = alt_scene(gen, num)
    question, answer = ask(scene, qtype, random.Random(seed), lang=lang)
    return rasterise(scene, samples=int(gen.choice([1, 4]))), question, answer, qtype, scene
