"""The multimodal prefix-cache experiment on the real engine: a first request warms the cache, a second one
is served under strategies A / B / C, and we report hits (true / false), the answers, and how far the second
request's logprobs moved from a cold run.  Run: python -m minivlm.experiments.mm_cache [--model DIR]"""
import argparse

from PIL import Image, ImageDraw

from minivlm.views.cache_study import compare_strategies
from minivlm.engine.request import Request


def shape_image(color: tuple, size=(224, 224), kind="circle") -> Image.Image:
    """One shape in the middle of a light canvas (the tiny model's scene spec)."""
    w, h = size
    img = Image.new("RGB", size, (235, 235, 230))
    side = int(0.4 * min(w, h))
    box = ((w - side) // 2, (h - side) // 2, (w + side) // 2, (h + side) // 2)
    draw = ImageDraw.Draw(img)
    if kind == "circle":
        draw.ellipse(box, fill=color)
    elif kind == "square":
        draw.rectangle(box, fill=color)
    else:
        draw.polygon([(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) // 2, box[1])], fill=color)
    return img


RED, BLUE, GREEN = (220, 30, 30), (40, 70, 220), (30, 170, 60)
Q = "What color is the shape?"


def cases() -> dict[str, tuple[Request, Request]]:
    """The seeds' six cases: (first request that warms the cache, second request that may hit it)."""
    red, blue, green = shape_image(RED), shape_image(BLUE), shape_image(GREEN, kind="square")
    text_then_image = Request(messages=[{"role": "user", "content": [
        {"type": "text", "text": "Look at this. "}, {"type": "image", "image": red}, {"type": "text", "text": Q}]}])
    return {
        "1 same text, different image": (Request(prompt=Q, images=[red]), Request(prompt=Q, images=[blue])),
        "2 identical request": (Request(prompt=Q, images=[red]), Request(prompt=Q, images=[red])),
        "3 same image, different text": (Request(prompt=Q, images=[red]), Request(prompt="What shape is it?", images=[red])),
        "4 same image, different resize": (Request(prompt=Q, images=[red]),
                                           Request(prompt=Q, images=[red], mm_processor_kwargs={"max_pixels": 112 * 112})),
        "5 two images swapped": (Request(prompt="How many shapes are there?", images=[red, green]),
                                 Request(prompt="How many shapes are there?", images=[green, red])),
        "6 same image, other position": (Request(prompt=Q, images=[red]), text_then_image),
    }


def main():
    from minivlm import Engine, EngineConfig
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=EngineConfig.model)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    engine = Engine(EngineConfig(model=args.model, device=args.device, num_blocks=16))
    for name, (first, second) in cases().items():
        print(f"\n## case {name}")
        print(f"{'strategy':8} {'hits':>4} {'true':>4} {'false':>5}  {'first':12} {'second':12} {'cold':12} max|Δlogprob|")
        for r in compare_strategies(engine, first, second):
            answers = [repr(o.text.strip())[:12] for o in (r.first, r.second, r.cold)]
            print(f"{r.strategy:8} {r.hits:4d} {r.true_hits:4d} {r.false_hits:5d}  {answers[0]:12} {answers[1]:12} "
                  f"{answers[2]:12} {r.max_logprob_diff:.4f}")


if __name__ == "__main__":
    main()
