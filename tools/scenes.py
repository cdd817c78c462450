"""Synthetic shape scenes and their questions, deterministic from a seed (training, eval, tests, app examples).

The scene spec is the contract: canvas sides in [112, 336] px, one light background colour (each channel 200-255),
1-3 non-overlapping shapes fully inside (circle, axis-aligned square, upward triangle), bounding-box side 25-45 % of
the shorter canvas side, colours from COLORS with each channel jittered by up to 20.
"""
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

COLORS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220), "yellow": (240, 210, 30),
          "purple": (140, 50, 180), "orange": (245, 140, 20)}
SHAPES = ("circle", "square", "triangle")
COUNT_WORDS = ("one", "two", "three")
QUESTION_TYPES = ("color", "shape", "count", "color_of", "is_there", "describe", "where")
ROWS, COLUMNS = ("top", "middle", "bottom"), ("left", "center", "right")
# Chinese forms (stage 3): the same questions and the same truth, in Chinese words
LANGS = ("en", "zh")
ZH_COLORS = {"red": "红色", "green": "绿色", "blue": "蓝色", "yellow": "黄色", "purple": "紫色", "orange": "橙色"}
ZH_SHAPES = {"circle": "圆形", "square": "正方形", "triangle": "三角形"}
ZH_COUNTS = {"one": "一个", "two": "两个", "three": "三个"}
ZH_YES_NO = {"yes": "有", "no": "没有"}
ZH_POSITIONS = {"top left": "左上", "top center": "上方", "top right": "右上", "middle left": "左侧",
                "center": "中间", "middle right": "右侧", "bottom left": "左下", "bottom center": "下方",
                "bottom right": "右下"}


@dataclass(frozen=True)
class Shape:
    """One shape: its kind, colour name, the jittered RGB it is drawn with, and its bounding box (x, y, side)."""
    kind: str
    color: str
    rgb: tuple
    x: int
    y: int
    side: int


@dataclass(frozen=True)
class Scene:
    """A canvas size, a background colour and the shapes on it."""
    width: int
    height: int
    background: tuple
    shapes: tuple


def _jitter(rgb, rng):
    return tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in rgb)


def _overlaps(a, b, gap=2):
    return not (a[0] + a[2] + gap <= b[0] or b[0] + b[2] + gap <= a[0] or
                a[1] + a[2] + gap <= b[1] or b[1] + b[2] + gap <= a[1])


def random_scene(rng: random.Random, num_shapes: int = None, kinds=None, colors=None, size=(0.25, 0.45)) -> Scene:
    """Draw a scene from the spec; `kinds`/`colors` optionally fix the shapes' kinds and colour names in order;
    `size` is the range of a shape's side as a fraction of the shorter canvas side (training may go bigger)."""
    n = num_shapes or rng.randint(1, 3)
    if not 1 <= n <= 3:
        raise ValueError(f"num_shapes must be 1..3, got {n}")
    while True:  # rejection-sample a canvas on which n boxes fit without overlap
        width, height = rng.randint(112, 336), rng.randint(112, 336)
        short = min(width, height)
        boxes = []
        for _ in range(200 * n):
            side = rng.randint(int(size[0] * short + 0.999), int(size[1] * short))
            box = (rng.randint(0, width - side), rng.randint(0, height - side), side)
            if not any(_overlaps(box, b) for b in boxes):
                boxes.append(box)
                if len(boxes) == n:
                    break
        if len(boxes) == n:
            break
    shapes = []
    for i, (x, y, side) in enumerate(boxes):
        kind = kinds[i] if kinds else rng.choice(SHAPES)
        color = colors[i] if colors else rng.choice(list(COLORS))
        shapes.append(Shape(kind, color, _jitter(COLORS[color], rng), x, y, side))
    background = tuple(rng.randint(200, 255) for _ in range(3))
    return Scene(width, height, background, tuple(shapes))


def render(scene: Scene, supersample: int = 1) -> Image.Image:
    """Draw the scene as an RGB image; supersample > 1 draws larger and downsizes (anti-aliased edges)."""
    s = supersample
    img = Image.new("RGB", (scene.width * s, scene.height * s), scene.background)
    draw = ImageDraw.Draw(img)
    for sh in scene.shapes:
        x0, y0, x1, y1 = sh.x * s, sh.y * s, (sh.x + sh.side) * s - 1, (sh.y + sh.side) * s - 1
        if sh.kind == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=sh.rgb)
        elif sh.kind == "square":
            draw.rectangle((x0, y0, x1, y1), fill=sh.rgb)
        else:  # pointing up: apex at the top centre, base along the bottom edge
            draw.polygon([((x0 + x1) / 2, y0), (x0, y1), (x1, y1)], fill=sh.rgb)
    return img.resize((scene.width, scene.height), Image.BILINEAR) if s > 1 else img


def article(color: str) -> str:
    """'an' before a vowel sound (orange), else 'a'."""
    return "an" if color[0] in "aeiou" else "a"


def position(shape: Shape, scene: Scene) -> str:
    """Where the bounding-box centre lies when the canvas is cut into thirds each way: "{row} {column}", or
    "center" for the middle cell."""
    def third(centre, extent):
        return min(2, int(3 * centre / extent))
    row = ROWS[third(shape.y + shape.side / 2, scene.height)]
    column = COLUMNS[third(shape.x + shape.side / 2, scene.width)]
    return "center" if (row, column) == ("middle", "center") else f"{row} {column}"


def describe(scene: Scene, lang: str = "en") -> str:
    """Every shape left to right by its centre's x (ties: top first) as "{colour} {shape} at the {position}"
    joined by " and " (zh: "{颜色}{形状}在{位置}" joined by "，")."""
    ordered = sorted(scene.shapes, key=lambda s: (2 * s.x + s.side, 2 * s.y + s.side))
    if lang == "zh":
        return "，".join(f"{ZH_COLORS[s.color]}{ZH_SHAPES[s.kind]}在{ZH_POSITIONS[position(s, scene)]}"
                        for s in ordered)
    return " and ".join(f"{s.color} {s.kind} at the {position(s, scene)}" for s in ordered)


def question(qtype: str, lang: str = "en", color: str = None, kind: str = None) -> str:
    """The exact words of a question type in a language; color_of names a kind, is_there and where a colour and
    a kind (English names: "red", "circle")."""
    if lang == "zh":
        c, k = ZH_COLORS.get(color), ZH_SHAPES.get(kind)
        return {"color": "这个形状是什么颜色？", "shape": "这是什么形状？", "count": "图中有几个形状？",
                "color_of": f"{k}是什么颜色？", "is_there": f"图中有{c}的{k}吗？", "where": f"{c}的{k}在哪里？",
                "describe": "描述这张图片。"}[qtype]
    if lang != "en":
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    return {"color": "What color is the shape?", "shape": "What shape is it?", "count": "How many shapes are there?",
            "color_of": f"What color is the {kind}?", "is_there": f"Is there {color and article(color)} {color} {kind}?",
            "where": f"Where is the {color} {kind}?", "describe": "Describe the picture."}[qtype]


def translate(answer: str, qtype: str, lang: str) -> str:
    """An English answer of a one-word or "where" type in `lang` (descriptions: `describe(scene, lang)`)."""
    if lang == "en":
        return answer
    table = {"color": ZH_COLORS, "color_of": ZH_COLORS, "shape": ZH_SHAPES, "count": ZH_COUNTS,
             "is_there": ZH_YES_NO, "where": ZH_POSITIONS}[qtype]
    return table[answer]


def unique_pairs(scene: Scene):
    """The shapes whose (colour, kind) occurs once in the scene."""
    pairs = [(s.color, s.kind) for s in scene.shapes]
    return [s for s in scene.shapes if pairs.count((s.color, s.kind)) == 1]


def possible_types(scene: Scene):
    """Question types that are well defined for this scene."""
    kinds = [s.kind for s in scene.shapes]
    types = ["count", "is_there", "describe"]
    if len(kinds) == 1:
        types += ["color", "shape"]
    if any(kinds.count(k) == 1 for k in SHAPES):
        types.append("color_of")
    if unique_pairs(scene):
        types.append("where")
    return [t for t in QUESTION_TYPES if t in types]


def ask(scene: Scene, qtype: str, rng: random.Random, hard=(0.4, 0.8), lang: str = "en"):
    """One (question, answer) of type qtype about the scene, exact phrasing, lowercase answer (one word for the
    first five types, a position for "where", a sentence for "describe"); a "no" to is_there keeps a present
    shape's colour with probability hard[0], its kind with hard[1] - hard[0]. `lang` "zh" asks the same
    question (same random draws, same truth) in Chinese words."""
    if lang != "en":
        _, answer, (color, kind) = _ask_en(scene, qtype, rng, hard)
        if qtype == "describe":
            return question(qtype, lang), describe(scene, lang)
        return question(qtype, lang, color, kind), translate(answer, qtype, lang)
    return _ask_en(scene, qtype, rng, hard)[:2]


def _ask_en(scene: Scene, qtype: str, rng: random.Random, hard):
    """(question, answer, (colour, kind) the question names) in English."""
    kinds = [s.kind for s in scene.shapes]
    if qtype not in possible_types(scene):
        raise ValueError(f"question type {qtype!r} is not defined for a scene with shapes {kinds}")
    if qtype == "color":
        return "What color is the shape?", scene.shapes[0].color, (None, None)
    if qtype == "shape":
        return "What shape is it?", scene.shapes[0].kind, (None, None)
    if qtype == "count":
        return "How many shapes are there?", COUNT_WORDS[len(kinds) - 1], (None, None)
    if qtype == "color_of":
        kind = rng.choice([k for k in SHAPES if kinds.count(k) == 1])
        return f"What color is the {kind}?", next(s.color for s in scene.shapes if s.kind == kind), (None, kind)
    if qtype == "describe":
        return "Describe the picture.", describe(scene), (None, None)
    if qtype == "where":
        shape = rng.choice(unique_pairs(scene))
        return f"Where is the {shape.color} {shape.kind}?", position(shape, scene), (shape.color, shape.kind)
    present = {(s.color, s.kind) for s in scene.shapes}
    if rng.random() < 0.5:
        color, kind = rng.choice(sorted(present))
    else:  # hard negatives: mostly a present colour or a present kind, recombined
        while True:
            sh = rng.choice(scene.shapes)
            r = rng.random()
            color = sh.color if r < hard[0] else rng.choice(list(COLORS))
            kind = sh.kind if hard[0] <= r < hard[1] else rng.choice(SHAPES)
            if (color, kind) not in present:
                break
    answer = "yes" if (color, kind) in present else "no"
    return f"Is there {article(color)} {color} {kind}?", answer, (color, kind)


def answer_to(scene: Scene, question: str) -> str:
    """The true answer to any question of the trained forms (English or Chinese) about the scene, in the
    question's language (the app's examples use it)."""
    for qtype in possible_types(scene):
        for form in _FORMS[qtype](scene):
            if form[0] == question:
                return form[1]
            if _zh(qtype, form, scene)[0] == question:
                return _zh(qtype, form, scene)[1]
    raise ValueError(f"{question!r} is not a question of the trained forms for shapes "
                     f"{[(s.color, s.kind) for s in scene.shapes]}")


_FORMS = {  # every (question, answer) a type can ask about a scene
    "color": lambda sc: [("What color is the shape?", sc.shapes[0].color)],
    "shape": lambda sc: [("What shape is it?", sc.shapes[0].kind)],
    "count": lambda sc: [("How many shapes are there?", COUNT_WORDS[len(sc.shapes) - 1])],
    "color_of": lambda sc: [(f"What color is the {s.kind}?", s.color) for s in sc.shapes
                            if [t.kind for t in sc.shapes].count(s.kind) == 1],
    "is_there": lambda sc: [(f"Is there {article(c)} {c} {k}?", "yes" if (c, k) in {
        (s.color, s.kind) for s in sc.shapes} else "no") for c in COLORS for k in SHAPES],
    "describe": lambda sc: [("Describe the picture.", describe(sc))],
    "where": lambda sc: [(f"Where is the {s.color} {s.kind}?", position(s, sc)) for s in unique_pairs(sc)],
}


def _zh(qtype: str, form, scene: Scene):
    """The Chinese (question, answer) of an English form of _FORMS."""
    if qtype == "describe":
        return question(qtype, "zh"), describe(scene, "zh")
    words = form[0].rstrip("?").split()
    color = next((w for w in words if w in COLORS), None)
    kind = next((w for w in words if w in SHAPES), None)
    return question(qtype, "zh", color, kind), translate(form[1], qtype, "zh")


def trained_questions_zh() -> list[str]:
    """The Chinese forms of trained_questions(), in the same order."""
    return [question("color", "zh"), question("shape", "zh"), question("count", "zh"),
            *[question("color_of", "zh", kind=k) for k in SHAPES],
            *[question("is_there", "zh", c, k) for c in COLORS for k in SHAPES],
            question("describe", "zh"), *[question("where", "zh", c, k) for c in COLORS for k in SHAPES]]


def trained_questions() -> list[str]:
    """Every question the generator asks, in its exact words, by type (the app tells its users which ones)."""
    return ["What color is the shape?", "What shape is it?", "How many shapes are there?",
            *[f"What color is the {k}?" for k in SHAPES],
            *[f"Is there {article(c)} {c} {k}?" for c in COLORS for k in SHAPES],
            "Describe the picture.", *[f"Where is the {c} {k}?" for c in COLORS for k in SHAPES]]


def sample(seed: int, qtype: str = None, num_shapes: int = None, lang: str = "en"):
    """A fresh (image, question, answer, qtype) from one integer seed; qtype None picks one the scene allows;
    num_shapes fixes the number of shapes (color and shape questions always have one); `lang` "zh" asks the same
    question about the same scene in Chinese."""
    rng = random.Random(seed)
    num = 1 if qtype in ("color", "shape") else num_shapes or rng.randint(1, 3)
    scene = random_scene(rng, num)
    while qtype is not None and qtype not in possible_types(scene):
        scene = random_scene(rng, num)
    qtype = qtype or rng.choice(possible_types(scene))
    text, answer = ask(scene, qtype, rng, lang=lang)
    return render(scene), text, answer, qtype


def example_scenes():
    """The app's example scenes by file name; red_circle and blue_circle differ only in colour (same size and
    geometry), so a prefix cache keyed on token ids alone (strategy A) confuses them."""
    def one(name, kind, color):  # fixed geometry and exact palette colour on a 224 x 224 canvas
        return name, Scene(224, 224, (240, 240, 235), (Shape(kind, color, COLORS[color], 62, 62, 100),))
    examples = [one("red_circle", "circle", "red"), one("blue_circle", "circle", "blue"),
                one("green_triangle", "triangle", "green"), one("yellow_square", "square", "yellow")]
    examples.append(("two_shapes", random_scene(random.Random(5), 2, ["square", "triangle"], ["purple", "orange"])))
    examples.append(("three_shapes", random_scene(random.Random(6), 3, ["circle", "triangle", "circle"],
                                                  ["blue", "red", "green"])))
    return examples


if __name__ == "__main__":
    import argparse
    import json
    import os
    parser = argparse.ArgumentParser(description="Write the app's example scene images as PNG files.")
    parser.add_argument("--out", default="assets/examples")
    parser.add_argument("--questions", default="assets/tiny-qwen-vl/questions.json",
                        help="where the app reads which questions the tiny model was trained on")
    parser.add_argument("--zh", action="store_true",
                        help="also list the Chinese forms (questions_zh): only for a model trained on them (stage 3)")
    args = parser.parse_args()
    out = args.out
    with open(args.questions, "w") as f:
        spec = {"about": "one to three coloured shapes (circles, squares, triangles)", "questions": trained_questions()}
        if args.zh:
            spec["about_zh"] = "一到三个彩色形状（圆形、正方形、三角形）"
            spec["questions_zh"] = trained_questions_zh()
        json.dump(spec, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.makedirs(out, exist_ok=True)
    for name, scene in example_scenes():
        render(scene).save(os.path.join(out, f"{name}.png"))
        print(name, [(s.kind, s.color) for s in scene.shapes], (scene.width, scene.height))
