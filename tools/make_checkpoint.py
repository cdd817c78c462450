"""Build random-weight Qwen-VL checkpoints in HF format (tests, benchmarks, and the tiny model's starting point)."""
import json
import os

import torch
from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                          Qwen2VLForConditionalGeneration, Qwen3VLConfig, Qwen3VLForConditionalGeneration)
from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

from minivlm.inputs.processor import PROCESSORS
from tools.tiny_tokenizer import build_tokenizer

FAMILIES = {
    "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
    "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
    "qwen3_vl": (Qwen3VLConfig, Qwen3VLForConditionalGeneration),
}


def tiny_config(family: str, tokenizer, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                vision_depth=2, vision_hidden=32, vision_heads=2, patch_size=14, tie=True, **text_overrides):
    """A small config of one family; mrope sections sum to head_dim/2 as the rotary code requires."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in
           ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_end|>", "<|endoftext|>")}
    half = head_dim // 2
    sections = [half - 2 * (half // 3), half // 3, half // 3]
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                head_dim=head_dim, max_position_embeddings=4096, rms_norm_eps=1e-6,
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=tie)
    if family == "qwen3_vl":
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e6, "mrope_section": sections,
                                   "mrope_interleaved": True}
        vision = dict(depth=vision_depth, hidden_size=vision_hidden, intermediate_size=vision_hidden * 2,
                      num_heads=vision_heads, out_hidden_size=hidden, patch_size=patch_size,
                      spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=256,
                      deepstack_visual_indexes=list(range(min(2, vision_depth))))
    else:
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": sections}
        text["bos_token_id"] = None
        vision = dict(depth=vision_depth, num_heads=vision_heads, patch_size=patch_size, spatial_merge_size=2,
                      temporal_patch_size=2)
        if family == "qwen2_vl":  # Qwen2-VL: embed_dim is the ViT width, hidden_size its output
            vision.update(embed_dim=vision_hidden, hidden_size=hidden, mlp_ratio=2)
        else:
            vision.update(hidden_size=vision_hidden, out_hidden_size=hidden, intermediate_size=vision_hidden * 2,
                          fullatt_block_indexes=[vision_depth - 1], window_size=patch_size * 4)
    text.update(text_overrides)
    cfg_cls = FAMILIES[family][0]
    kwargs = dict(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                  video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                  vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=tie)
    if family != "qwen3_vl":
        kwargs["vision_end_token_id"] = ids["<|vision_end|>"]
    return cfg_cls(**kwargs)


def save_processor(out_dir: str, family: str, tokenizer, patch_size=14, min_pixels=None, max_pixels=None):
    """Save tokenizer + image processor + chat template the way hub checkpoints lay them out."""
    factor = patch_size * 2
    size = {"shortest_edge": min_pixels or factor * factor * 4, "longest_edge": max_pixels or factor * factor * 256}
    image_processor = Qwen2VLImageProcessorPil(patch_size=patch_size, merge_size=2, temporal_patch_size=2, size=size,
                                               image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    processor = PROCESSORS[family][1](image_processor, tokenizer, chat_template=tokenizer.chat_template)
    processor.save_pretrained(out_dir)
    save_video_processor(out_dir, family, patch_size)


def save_video_processor(out_dir: str, family: str, patch_size=14):
    """video_preprocessor_config.json as transformers' Qwen2-VL / Qwen3-VL video processors read it (written as
    JSON: those classes need torchvision). Tiny budgets: a few tokens per frame pair."""
    factor = patch_size * 2
    qwen3 = family == "qwen3_vl"
    config = {"video_processor_type": "Qwen3VLVideoProcessor" if qwen3 else "Qwen2VLVideoProcessor",
              "patch_size": patch_size, "temporal_patch_size": 2, "merge_size": 2,
              "size": {"shortest_edge": factor * factor * 4, "longest_edge": factor * factor * (64 if qwen3 else 16)},
              "min_frames": 4, "max_frames": 64, "fps": 2.0, "do_sample_frames": True, "cap_pixels_per_frame": False,
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True, "do_rescale": True,
              "do_normalize": True, "do_convert_rgb": True, "resample": 3, "rescale_factor": 1 / 255}
    with open(os.path.join(out_dir, "video_preprocessor_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def randomize(model):
    """HF initialises norms to 1 and biases to 0; randomise every 1-D parameter too, for a real test."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
    return model


def make_random_checkpoint(family: str, out_dir: str, seed: int = 0, tokenizer=None, patch_size=14,
                           min_pixels=None, max_pixels=None, **config_kwargs) -> str:
    """Write a random-weight checkpoint of `family` to out_dir (config, safetensors, tokenizer, processor)."""
    torch.manual_seed(seed)
    tokenizer = tokenizer or build_tokenizer()
    config = tiny_config(family, tokenizer, patch_size=patch_size, **config_kwargs)
    model = randomize(FAMILIES[family][1](config).eval())
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    save_processor(out_dir, family, tokenizer, patch_size, min_pixels, max_pixels)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": config.text_config.eos_token_id,
                   "pad_token_id": config.text_config.pad_token_id}, f)
    return out_dir
