"""Where the tiny Qwen3-VL's vision tower keeps colour: a linear probe of the shape's colour from the mean of its
in-shape tokens, read from the final merger (what a Qwen3.5 decoder receives) and from each DeepStack merger (what
only Qwen3-VL's decoder receives), on one-shape scenes; fit on the first 2/3, scored on the rest.

    python -m tools.probe_vision_colour
"""
import random

import torch
import torch.nn.functional as F
from transformers import Qwen3VLForConditionalGeneration

from minivlm.inputs.processor import load_processor
from tools.scenes import COLORS, random_scene, render
from tools.train_signals import token_labels


@torch.no_grad()
def features(model_dir: str = "assets/tiny-qwen-vl", n: int = 240, seed: int = 123_456):
    """{tap: [n, hidden] mean in-shape token}, and the n colour indices."""
    model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir).eval()
    processor = load_processor(model_dir, "qwen3_vl")
    taps, colours = {}, []
    for i in range(n):
        scene = random_scene(random.Random(seed + i), 1)
        batch = processor.image_processor(images=[render(scene)], return_tensors="pt")
        out = model.model.visual(batch["pixel_values"], grid_thw=batch["image_grid_thw"])
        inside = token_labels(scene, batch["image_grid_thw"][0], model.config.vision_config.patch_size)[:, 0] < 3
        for name, tokens in [("final", out.pooler_output)] + [(f"deepstack{k}", d) for k, d in
                                                              enumerate(out.deepstack_features)]:
            taps.setdefault(name, []).append(tokens[inside].mean(0))
        colours.append(list(COLORS).index(scene.shapes[0].color))
    return {k: torch.stack(v) for k, v in taps.items()}, torch.tensor(colours)


def held_out_accuracy(x, y, fit: float = 2 / 3) -> float:
    """A ridge-regularised softmax regression fit on the first part, its accuracy on the rest."""
    cut = int(len(y) * fit)
    x = (x - x[:cut].mean(0)) / (x[:cut].std(0) + 1e-6)
    w = torch.zeros(x.shape[1], int(y.max()) + 1, requires_grad=True)
    opt = torch.optim.Adam([w], lr=0.05)
    for _ in range(300):
        opt.zero_grad()
        (F.cross_entropy(x[:cut] @ w, y[:cut]) + 1e-3 * w.pow(2).sum()).backward()
        opt.step()
    return ((x[cut:] @ w).argmax(-1) == y[cut:]).float().mean().item()


if __name__ == "__main__":
    torch.set_num_threads(1)
    taps, colours = features()
    for name, x in taps.items():
        print(f"{name}: colour read linearly on {held_out_accuracy(x, colours):.1%} of held-out scenes")
