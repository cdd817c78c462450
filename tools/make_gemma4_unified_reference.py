"""Store what transformers' OWN Gemma 4 12B image processor (Gemma4UnifiedImageProcessor, torchvision backend only)
makes of test images, once, for tests that run without torchvision (tests/test_gemma4_unified.py checks minivlm's
plain-torch processor, minivlm/inputs/patches_gemma4_unified.py, against this file).

Run in a separate venv that has torchvision (same transformers and torch):
    python3 -m venv /tmp/tvvenv --system-site-packages && /tmp/tvvenv/bin/pip install --no-deps torchvision==0.28.0
    /tmp/tvvenv/bin/python -m tools.make_gemma4_unified_reference tests/fixtures/gemma4_unified_reference.npz
The CUDA build of torchvision (the only one the local registry has) loads without its compiled ops on a CPU torch;
its image transforms are torch's own and need none, so two of the ops' names are declared before import (its fake
kernels register against them). Stored per image size and soft-token budget: the token count, the patch positions,
the first merged patch's top pixel row, the real pixel rows' sha256 (the pixels themselves are up to 1120 x 6912
floats an image) and the padding rows' largest value."""
import hashlib
import sys

import numpy as np
from PIL import Image

BUDGETS = (70, 280, 1120)
SIZES = ((200, 130), (48, 160), (90, 60), (640, 480), (1000, 37), (37, 1000), (333, 777), (1920, 1080), (48, 48),
         (47, 49), (3000, 2000))  # (w, h): wide, tall, tiny, sides under one patch, one that is not resized


def image(w: int, h: int) -> Image.Image:
    """A deterministic image with detail at every scale (a gradient, stripes, a tiled 61 x 67 noise), so that
    resizing shows; cheap to make at any size."""
    noise = np.random.default_rng(w * 10_000 + h).integers(0, 40, (61, 67, 3), dtype=np.uint8)
    x, y = np.arange(w, dtype=np.int32)[None, :], np.arange(h, dtype=np.int32)[:, None]
    pixels = np.empty((h, w, 3), np.int32)
    pixels[..., 0], pixels[..., 1] = x * 215 // max(w - 1, 1), y * 215 // max(h - 1, 1)
    pixels[..., 2] = (x // 3 + y // 5) % 2 * 200
    pixels += np.tile(noise, (h // 61 + 1, w // 67 + 1, 1))[:h, :w]
    return Image.fromarray(pixels.astype(np.uint8))


def digest(pixels) -> str:
    """sha256 of the pixel rows' float32 bytes."""
    return hashlib.sha256(np.ascontiguousarray(np.asarray(pixels, dtype=np.float32)).tobytes()).hexdigest()


def outputs(processor) -> dict:
    """name -> array of what `processor` makes of every (size, budget)."""
    out = {}
    for w, h in SIZES:
        picture = image(w, h)
        for budget in BUDGETS:
            got = processor(picture, max_soft_tokens=budget, return_tensors="pt")
            key, n = f"{w}x{h}/{budget}", int(got["num_soft_tokens_per_image"][0])
            pixels = got["pixel_values"][0].numpy()
            out[f"{key}/num_soft_tokens"] = np.array(n)
            out[f"{key}/image_position_ids"] = got["image_position_ids"][0].numpy().astype(np.int16)  # small
            out[f"{key}/first_patch"] = pixels[0, :48 * 3]  # its top pixel row, to read when a hash differs
            out[f"{key}/sha256"] = np.array(digest(pixels[:n]))  # the real rows; the padding rows must be zeros:
            out[f"{key}/padding_max"] = np.array(float(np.abs(pixels[n:]).max(initial=0.0)))
    return out


def main(dest: str):
    import torch
    for op in ("nms", "qnms"):  # torchvision's compiled ops did not load: declare their names for its fake kernels
        torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision
    import transformers
    from transformers.models.gemma4_unified.image_processing_gemma4_unified import Gemma4UnifiedImageProcessor
    data = outputs(Gemma4UnifiedImageProcessor())
    data["versions"] = np.array(f"transformers {transformers.__version__}, torchvision {torchvision.__version__}, "
                                f"torch {torch.__version__}")
    np.savez_compressed(dest, **data)


if __name__ == "__main__":
    main(sys.argv[1])
