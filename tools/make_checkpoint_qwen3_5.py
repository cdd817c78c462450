"""A random-weight Qwen3.5 checkpoint (Qwen3_5ForConditionalGeneration) at test size, in the published layout: a
hybrid decoder (three Gated DeltaNet layers, then one gated full-attention layer, per four), partial-rotary
interleaved M-RoPE, Qwen3-VL's vision tower without deepstack, and the processor the published checkpoints name
(Qwen3VLProcessor over a Qwen2-VL image processor, Qwen3-VL's video processor), saved by transformers."""
import json
import os

# torch and transformers are imported where used, as in tools/make_checkpoint_matrix.py

PATCH = 16  # the published patch size (Qwen3-VL's): one merged token per 32 x 32 pixels


def text_config(tokenizer, layers: int = 4, tie: bool = False, mtp: bool = False) -> dict:
    """A small Qwen3.5 text config: hidden 64; the published shapes' ratios (value heads = 2 x key heads, rotary on
    a quarter of head_dim, mrope sections summing to that quarter's half); with `mtp`, the published configs' field
    for the multi-token-prediction head (mtp_num_hidden_layers: 1)."""
    ids = tokenizer.convert_tokens_to_ids
    return dict(**({"mtp_num_hidden_layers": 1} if mtp else {}), vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=tie,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                 "mrope_section": [3, 3, 2], "mrope_interleaved": True},
                eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"), bos_token_id=None)


def vision_config() -> dict:
    return dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=PATCH,
                spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=256)


def build_qwen3_5(tokenizer, layers: int = 4, tie: bool = False, mtp: bool = False):
    """(model class, config, processor) of a test-size Qwen3.5, over `tokenizer` (the tiny Qwen-VL BPE)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    from minivlm.families import get_family
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen3_5Config(text_config=text_config(tokenizer, layers, tie, mtp), vision_config=vision_config(),
                           image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                           vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
                           tie_word_embeddings=tie)
    factor = PATCH * 2
    image_processor = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=2, temporal_patch_size=2,
                                               size={"shortest_edge": factor * factor * 4,
                                                     "longest_edge": factor * factor * 64},
                                               image_mean=[0.5] * 3, image_std=[0.5] * 3)
    processor = get_family("qwen3_5").processor_class(image_processor, tokenizer,
                                                      chat_template=tokenizer.chat_template)
    return Qwen3_5ForConditionalGeneration, config, processor


def make_qwen3_5_checkpoint(out_dir: str, seed: int = 0, layers: int = 4, tie: bool = False,
                            mtp: bool = False) -> str:
    """Write the random-weight checkpoint to out_dir: config, safetensors, tokenizer, chat template, the processor
    (processor_config.json naming Qwen3VLProcessor, as published) and Qwen3-VL's video processor settings; with
    `mtp`, random mtp.* weights beside the model's (transformers has no module for them: added to its file)."""
    import torch

    from tools.make_checkpoint import randomize, save_video_processor
    from tools.make_checkpoint_matrix import published_processor_class
    from tools.tiny_tokenizer import family_tokenizer
    torch.manual_seed(seed)
    tokenizer = family_tokenizer("qwen3_vl")
    model_cls, config, processor = build_qwen3_5(tokenizer, layers, tie, mtp)
    model = randomize(model_cls(config).eval())
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    if mtp:
        add_mtp_weights(out_dir, config.text_config)
    tokenizer.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    published_processor_class(out_dir, "Qwen3VLProcessor")
    save_video_processor(out_dir, "qwen3_vl", PATCH)  # Qwen3.5 ships Qwen3-VL's video processor
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}, f)
    return out_dir


def mtp_weights(text_cfg) -> dict:
    """Random mtp.* tensors in the published names: fc (2H -> H), the two pre-fc norms, one gated full-attention
    decoder layer (transformers' own Qwen3.5 layer, randomised as the model is), the final norm."""
    import copy

    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    from tools.make_checkpoint import randomize
    cfg = copy.deepcopy(text_cfg)
    cfg.layer_types = ["full_attention"]
    layer = randomize(Qwen3_5DecoderLayer(cfg, 0))
    hidden = cfg.hidden_size
    out = {f"mtp.layers.0.{k}": v.detach().clone() for k, v in layer.state_dict().items()}
    out["mtp.fc.weight"] = 0.05 * torch.randn(hidden, 2 * hidden)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{name}.weight"] = 0.1 * torch.randn(hidden)
    return out


def add_mtp_weights(out_dir: str, text_cfg):
    """mtp_weights added to the saved model.safetensors (one file at this size)."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(out_dir, "model.safetensors")
    state = load_file(path)
    state.update(mtp_weights(text_cfg))
    save_file({k: v.contiguous() for k, v in state.items()}, path, metadata={"format": "pt"})
