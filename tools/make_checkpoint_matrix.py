"""Random-weight checkpoints of the families beyond Qwen-VL, in their published layout: SmolVLM2 / Idefics3 (SigLIP
+ pixel shuffle + Llama, tiles + a global view), InternVL3.5 (InternViT + pixel-shuffle MLP + Qwen3 or Qwen2,
448-px crops + a thumbnail, scaled down) and text-only Qwen2 / Qwen3, each saved by transformers with its processor."""
import json
import os

import torch
from transformers import (Idefics3Config, Idefics3ForConditionalGeneration, InternVLConfig,
                          InternVLForConditionalGeneration, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, SmolVLMConfig, SmolVLMForConditionalGeneration)
from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil
from transformers.models.idefics3 import Idefics3ImageProcessorPil
from transformers.models.smolvlm import SmolVLMImageProcessorPil

from tools.make_checkpoint import randomize
from tools.tiny_tokenizer import family_tokenizer

TILE, PATCH = 64, 8           # a tile of 64 px in 8-px patches: 64 patches, 16 tokens after a 2x pixel shuffle
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // 4


def text_config(tokenizer, decoder: str, tie: bool, **overrides) -> dict:
    """A small decoder of the family's text architecture (llama, qwen2 or qwen3)."""
    cfg = dict(model_type=decoder, vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=tie,
               rope_parameters={"rope_type": "default", "rope_theta": 100000.0 if decoder == "llama" else 1e6},
               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    cfg.update(overrides)
    return cfg


def build(family: str, tokenizer, decoder: str | None, tie: bool):
    """(model class, config, processor) for one family, at test size."""
    from minivlm.families import get_family
    processor_class = get_family(family).processor_class
    if family in ("smolvlm", "idefics3"):
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      image_size=TILE, patch_size=PATCH)
        cfg_cls, model_cls, ip_cls = ((SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil)
                                      if family == "smolvlm" else
                                      (Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil))
        config = cfg_cls(text_config=text_config(tokenizer, "llama", tie), vision_config=vision, scale_factor=2,
                         image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=tie)
        image_processor = ip_cls(size={"longest_edge": 2 * TILE}, max_image_size={"longest_edge": TILE},
                                 do_image_splitting=True, image_mean=[0.5] * 3, image_std=[0.5] * 3)
        processor = processor_class(image_processor, tokenizer, image_seq_len=TOKENS_PER_TILE,
                                    chat_template=tokenizer.chat_template)
        return model_cls, config, processor
    if family == "internvl":
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      image_size=TILE, patch_size=PATCH, use_mean_pooling=True)
        extra = {"qwen3": {}, "qwen2": {"head_dim": 16}}[decoder]
        config = InternVLConfig(text_config=text_config(tokenizer, decoder, tie, **extra), vision_config=vision,
                                image_token_id=tokenizer.context_image_token_id, image_seq_length=TOKENS_PER_TILE,
                                downsample_ratio=0.5, tie_word_embeddings=tie)
        image_processor = GotOcr2ImageProcessorPil(size={"height": TILE, "width": TILE}, crop_to_patches=True,
                                                   min_patches=1, max_patches=6, image_mean=[0.5] * 3,
                                                   image_std=[0.5] * 3)
        processor = processor_class(image_processor, tokenizer, image_seq_length=TOKENS_PER_TILE,
                                    chat_template=tokenizer.chat_template)
        return InternVLForConditionalGeneration, config, processor
    if family in ("qwen2", "qwen3"):
        cfg = text_config(tokenizer, family, tie)
        cfg.pop("model_type")
        return ((Qwen2ForCausalLM, Qwen2Config(**cfg), None) if family == "qwen2"
                else (Qwen3ForCausalLM, Qwen3Config(**cfg), None))
    raise ValueError(f"no checkpoint recipe for {family!r}")


def published_processor_class(out_dir: str, name: str):
    """processor_config.json names transformers' class (SmolVLMProcessor, ...) as the hub checkpoints do, not ours."""
    path = os.path.join(out_dir, "processor_config.json")
    with open(path) as f:
        saved = json.load(f)
    saved["processor_class"] = name
    with open(path, "w") as f:
        json.dump(saved, f, indent=2)


def make_matrix_checkpoint(family: str, out_dir: str, seed: int = 0, decoder: str | None = None,
                           tie: bool = False) -> str:
    """Write a random-weight checkpoint of `family` (decoder: InternVL's text model, qwen3 or qwen2) to out_dir."""
    torch.manual_seed(seed)
    tokenizer = family_tokenizer(family)
    model_cls, config, processor = build(family, tokenizer, decoder or "qwen3", tie)
    model = randomize(model_cls(config).eval())
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if processor is not None:
        processor.save_pretrained(out_dir)
        published_processor_class(out_dir, type(processor).__mro__[1].__name__)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}, f)
    return out_dir
