"""The benchmark's model and inputs: a random-weight Qwen2.5-VL-architecture checkpoint built locally,
synthetic scene images and prompts, and the same checkpoint loaded in HF transformers as the baseline."""
import glob
import os
import random

import torch
from PIL import Image, ImageDraw

from minivlm import Engine, EngineConfig, Request
from minivlm.model import backends

# ~70M parameters: a 8-layer 768-wide GQA decoder and a 4-block ViT (tiny vocabulary, so almost all weights
# are in the layers, like the real models).
BENCH_MODEL = dict(hidden=768, layers=8, heads=12, kv_heads=2, head_dim=64, intermediate=2560,
                   vision_depth=4, vision_hidden=384, vision_heads=6, tie=True)
# The llama.cpp peer's quantized rows (issue #44): ~340M parameters, the shape of a real small model (28-layer
# 1024-wide GQA decoder, 3072 MLP; a small ViT), big enough that its Q8_0 GGUF (~360 MB) is far past the CPU cache.
PEER_MODEL = dict(hidden=1024, layers=28, heads=16, kv_heads=4, head_dim=64, intermediate=3072,
                  vision_depth=4, vision_hidden=384, vision_heads=6, tie=True)
# The test-suite smoke run: the same code path on a model that loads in a second.
SMOKE_MODEL = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                   vision_depth=2, vision_hidden=32, vision_heads=2, tie=True)
FAMILY = "qwen2_5_vl"
MAX_PIXELS = 448 * 448  # the prefix-cache image (448x448) is the largest this processor keeps unshrunk

PROMPTS = ["What color is the shape?", "Describe the image in one sentence.", "How many shapes are there?",
           "Is the shape on the left or on the right?", "What is the largest object in the picture?",
           "Name every color you can see.", "Where is the circle?", "Count the squares, please."]
# Mixed sizes, like real traffic: a few large images among small ones (vision tokens: 16 to 256).
IMAGE_SIZES = [(224, 224), (112, 112), (448, 448), (168, 224), (280, 196), (112, 224), (336, 252), (224, 168)]


def build_checkpoint(out_dir: str, model: dict) -> str:
    """Write the random checkpoint once; later runs reuse the directory (or any checkpoint already there, e.g.
    tools/gpu_check.py's random one with Qwen2.5-VL-3B's dimensions)."""
    from tools.make_checkpoint import make_random_checkpoint
    if not glob.glob(os.path.join(out_dir, "*.safetensors")):
        make_random_checkpoint(FAMILY, out_dir, seed=0, max_pixels=MAX_PIXELS, **model)
    return out_dir


def scene(width: int, height: int, seed: int) -> Image.Image:
    """A synthetic picture: a few coloured shapes on a light background, distinct per seed."""
    rng = random.Random(seed)
    img = Image.new("RGB", (width, height), tuple(rng.randrange(200, 256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(3):
        x, y = rng.randrange(width // 2), rng.randrange(height // 2)
        box = (x, y, x + rng.randrange(8, width // 2), y + rng.randrange(8, height // 2))
        fill = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    return img


def mixed_requests(n: int, seed: int = 0) -> list[Request]:
    """n image+prompt requests, each with its own picture (no two share an image: nothing to cache)."""
    sizes = [IMAGE_SIZES[i % len(IMAGE_SIZES)] for i in range(n)]
    return [Request(prompt=PROMPTS[i % len(PROMPTS)], images=[scene(*sizes[i], seed * 1000 + i)]) for i in range(n)]


def uniform_requests(n: int, seed: int = 0) -> list[Request]:
    """n requests with equal 224x224 images (each its own picture) and one prompt: every prompt has the same
    length, so a padded batch pads nothing (HF's best case)."""
    return [Request(prompt=PROMPTS[1], images=[scene(224, 224, seed * 1000 + 500 + i)]) for i in range(n)]


def make_engine(model_dir: str, device: str = "cpu", dtype: str = "float32", **overrides) -> Engine:
    """The engine with the same device and dtype as the HF baseline."""
    cfg = dict(model=model_dir, device=device, dtype=dtype, max_model_len=1024, max_num_seqs=16, num_blocks=1200)
    cfg.update(overrides)
    return Engine(EngineConfig(**cfg))


def load_hf(model_dir: str, onednn: bool = False, device: str = "cpu", dtype: str = "float32"):
    """HF transformers' own model and processor for the same checkpoint (left padding for batched generate).
    onednn=True gives HF's linear layers the engine's CPU GEMM too, to separate the kernel from the design."""
    from transformers import AutoModelForImageTextToText
    from minivlm.inputs.processor import load_processor
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    if onednn:  # every nn.Linear, HF's vision tower's included (its Conv3d patch embedding stays)
        backends.prepare_linears(model, "cpu", torch.float32)
    processor = load_processor(model_dir, FAMILY)
    processor.tokenizer.padding_side = "left"
    return model, processor


def hf_inputs(processor, requests: list[Request], device="cpu") -> dict:
    """Processor output for a (left-padded) batch, rendered with the same chat template as the engine."""
    texts = [processor.apply_chat_template(r.to_messages(), tokenize=False, add_generation_prompt=True)
             for r in requests]
    images = [im for r in requests for im in r.images] or None
    return processor(text=texts, images=images, return_tensors="pt", padding=True).to(device)


def hf_generate(model, processor, requests: list[Request], max_new_tokens: int) -> list[list[int]]:
    """HF generate for one batch, greedy, ignoring EOS: the new token ids of each request."""
    inputs = hf_inputs(processor, requests, model.device)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=processor.tokenizer.pad_token_id)
    return out[:, inputs["input_ids"].shape[1]:].tolist()


def param_count(model_dir: str) -> int:
    """Parameters stored in the checkpoint (tied embeddings once)."""
    from safetensors import safe_open
    total = 0
    for path in glob.glob(os.path.join(model_dir, "*.safetensors")):
        with safe_open(path, "pt") as f:
            total += sum(torch.Size(f.get_slice(k).get_shape()).numel() for k in f.keys())
    return total
