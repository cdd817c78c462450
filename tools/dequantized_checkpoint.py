"""A plain checkpoint holding the weights a quantized engine multiplies by: a copy of the checkpoint (fp32) whose
linear weights are the engine's dequantized ones (Int8Linear / Int4Linear.dequantized(), padding dropped), and an
lm_head of its own (the quantized engine's is an int8 copy beside full-precision embeddings). The unquantized engine
loaded from it computes the model the quantized weights define, by the ordinary path: tools/quantization_matrix.py's
truth for the quantized serving path, whatever the quantization's own error (issue #52).

Each engine layer's weight may be several checkpoint tensors fused (q/k/v, gate/up, Qwen3.5's in_proj): the family's
own load_weights finds where each element goes, by loading a probe checkpoint whose every element holds its index."""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import AutoConfig

from minivlm.families import get_family
from minivlm.loader import decoder_class, load_state_dict, read_model_type, split_state_dict
from minivlm.model.backends.quantized import Int4Linear, Int8Linear


def quantized_weights(decoder) -> dict[str, torch.Tensor]:
    """Engine parameter name -> the weight each quantized layer multiplies by, [out, in], fp32, unpadded."""
    return {f"{name}.weight": m.dequantized().float() for name, m in decoder.named_modules()
            if isinstance(m, (Int8Linear, Int4Linear))}


def write_dequantized(model_dir: str, decoder, out_dir: str) -> str:
    """Copy model_dir to out_dir with `decoder`'s dequantized weights in place of the checkpoint's; returns out_dir."""
    shutil.copytree(model_dir, out_dir, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    state = {k: v.float() for k, v in load_state_dict(model_dir).items()}  # fp32: a dequantized weight is exact there
    text_key = {next(iter(split_state_dict({k: v})[0]), None): k for k, v in state.items()}  # engine name -> file's
    text_key.pop(None, None)
    weights = quantized_weights(decoder)
    if "lm_head.weight" in weights and tied(model_dir):  # the int8 lm_head becomes a tensor of its own
        untie(out_dir)
        if "lm_head.weight" not in text_key:
            state["lm_head.weight"] = weights["lm_head.weight"].clone()
            text_key["lm_head.weight"] = "lm_head.weight"
    flat = torch.cat([state[k].reshape(-1) for k in text_key.values()]).double()
    where = element_indices(model_dir, {t: state[k] for t, k in text_key.items()})
    for name, w in weights.items():
        index = where[name].reshape(-1)
        if not (index.numel() == w.numel() == index.unique().numel() and (index == index.round()).all()):
            raise ValueError(f"{name}: the load path does not place each checkpoint element once (arithmetic on it)")
        flat[index.long()] = w.reshape(-1).double()
    start = 0
    for k in text_key.values():
        state[k] = flat[start:start + state[k].numel()].float().reshape(state[k].shape).contiguous()
        start += state[k].numel()
    save_file(state, os.path.join(out_dir, "model.safetensors"))
    return out_dir


def element_indices(model_dir: str, text: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Engine parameter name -> for each of its elements, its position in the text tensors laid end to end (in
    `text`'s order), found by the family's load_weights on a probe whose elements are those positions (fp64: exact)."""
    probe, start = {}, 0
    for name, t in text.items():
        probe[name] = torch.arange(start, start + t.numel(), dtype=torch.float64).reshape(t.shape)
        start += t.numel()
    model_type, config = read_model_type(model_dir), AutoConfig.from_pretrained(model_dir)
    text_cfg = getattr(config, "text_config", None) or config
    tied = "lm_head.weight" not in text
    with torch.device("meta"):
        decoder = decoder_class(get_family(model_type))(model_type, text_cfg, tied)
    decoder.load_weights(probe, tied, "cpu", torch.float64)
    return {k: v.detach() for k, v in decoder.state_dict().items()}


def tied(model_dir: str) -> bool:
    """Whether the engine ties this checkpoint's lm_head to its embeddings (as minivlm/loader.py reads it)."""
    config = AutoConfig.from_pretrained(model_dir)
    text_cfg = getattr(config, "text_config", None) or config
    return bool(getattr(config, "tie_word_embeddings", False) or getattr(text_cfg, "tie_word_embeddings", False))


def untie(model_dir: str):
    """The copy's config says its lm_head is its own (at the top and in text_config, where either may say tied)."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["tie_word_embeddings"] = False
    if isinstance(config.get("text_config"), dict):
        config["text_config"]["tie_word_embeddings"] = False
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
