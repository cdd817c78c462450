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


VIDEO_LAYOUTS = {  # where a checkpoint keeps its video processor (transformers reads them in this order)
    "nested": "processor_config.json's \"video_processor\", as transformers 5's ProcessorMixin.save_pretrained "
              "writes it",
    "file": "video_preprocessor_config.json (transformers 4.5x's layout; the test checkpoints' default)",
    "published": "none of its own: the image processor's preprocessor_config.json (no processor_config.json), as "
                 "the published Qwen2-VL / Qwen2.5-VL ship",
}


def save_processor(out_dir: str, family: str, tokenizer, patch_size=14, min_pixels=None, max_pixels=None,
                   video_layout="file"):
    """Save tokenizer + image processor + chat template the way hub checkpoints lay them out, and the video
    processor in one of VIDEO_LAYOUTS."""
    if video_layout not in VIDEO_LAYOUTS:
        raise ValueError(f"video_layout must be one of {', '.join(VIDEO_LAYOUTS)}, got {video_layout!r}")
    factor = patch_size * 2
    size = {"shortest_edge": min_pixels or factor * factor * 4, "longest_edge": max_pixels or factor * factor * 256}
    image_processor = Qwen2VLImageProcessorPil(patch_size=patch_size, merge_size=2, temporal_patch_size=2, size=size,
                                               image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    processor = PROCESSORS[family][1](image_processor, tokenizer, chat_template=tokenizer.chat_template)
    processor.save_pretrained(out_dir)
    if video_layout == "published":  # the image processor's own file instead of the v5 processor_config.json
        os.remove(os.path.join(out_dir, "processor_config.json"))
        image_processor.save_pretrained(out_dir)
    else:
        save_video_processor(out_dir, family, patch_size, video_layout)


def video_processor_config(family: str, patch_size=14) -> dict:
    """The test checkpoints' video processor settings. Tiny budgets: a few tokens per frame pair."""
    factor = patch_size * 2
    qwen3 = family == "qwen3_vl"
    return {"video_processor_type": "Qwen3VLVideoProcessor" if qwen3 else "Qwen2VLVideoProcessor",
            "patch_size": patch_size, "temporal_patch_size": 2, "merge_size": 2,
            "size": {"shortest_edge": factor * factor * 4, "longest_edge": factor * factor * (64 if qwen3 else 16)},
            "min_frames": 4, "max_frames": 64, "fps": 2.0, "do_sample_frames": True, "cap_pixels_per_frame": False,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True, "do_rescale": True,
            "do_normalize": True, "do_convert_rgb": True, "resample": 3, "rescale_factor": 1 / 255}


def transformers_video_dict(config: dict) -> dict:
    """What transformers' own video processor's to_dict() makes of `config`, the dict ProcessorMixin.to_dict nests
    under "video_processor". Qwen3VLVideoProcessor imports without torchvision; Qwen2VLVideoProcessor does not, so
    where torchvision is missing its fields go through BaseVideoProcessor (same to_dict) under its own type name."""
    import importlib
    from transformers.video_processing_utils import BaseVideoProcessor
    kind = config["video_processor_type"]
    module = {"Qwen3VLVideoProcessor": "qwen3_vl.video_processing_qwen3_vl",
              "Qwen2VLVideoProcessor": "qwen2_vl.video_processing_qwen2_vl"}[kind]
    try:
        cls = getattr(importlib.import_module(f"transformers.models.{module}"), kind)
    except ImportError:  # torchvision missing
        cls = BaseVideoProcessor
    fields = {k: v for k, v in config.items() if k != "video_processor_type"}
    return json.loads(cls(**fields).to_json_string()) | {"video_processor_type": kind}


def save_video_processor(out_dir: str, family: str, patch_size=14, layout="file", config: dict | None = None):
    """The video processor as transformers' Qwen2-VL / Qwen3-VL video processors read it: `layout` "file" writes
    video_preprocessor_config.json (as JSON: those classes need torchvision), "nested" puts transformers' to_dict()
    of it into processor_config.json as "video_processor" (v5's save_pretrained layout; no separate file)."""
    config = config or video_processor_config(family, patch_size)
    if layout == "file":
        with open(os.path.join(out_dir, "video_preprocessor_config.json"), "w") as f:
            json.dump(config, f, indent=2)
        return
    if layout != "nested":
        raise ValueError(f"save_video_processor writes layout 'file' or 'nested', not {layout!r}")
    path = os.path.join(out_dir, "processor_config.json")
    with open(path) as f:
        saved = json.load(f)
    saved["video_processor"] = transformers_video_dict(config)
    with open(path, "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)


def randomize(model):
    """HF initialises norms to 1 and biases to 0; randomise every 1-D parameter too, for a real test."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
    return model


def make_random_checkpoint(family: str, out_dir: str, seed: int = 0, tokenizer=None, patch_size=14,
                           min_pixels=None, max_pixels=None, video_layout="file", **config_kwargs) -> str:
    """Write a random-weight checkpoint of `family` to out_dir (config, safetensors, tokenizer, processor; the video
    processor in one of VIDEO_LAYOUTS)."""
    torch.manual_seed(seed)
    tokenizer = tokenizer or build_tokenizer()
    config = tiny_config(family, tokenizer, patch_size=patch_size, **config_kwargs)
    model = randomize(FAMILIES[family][1](config).eval())
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    save_processor(out_dir, family, tokenizer, patch_size, min_pixels, max_pixels, video_layout)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": config.text_config.eos_token_id,
                   "pad_token_id": config.text_config.pad_token_id}, f)
    return out_dir
