"""Tensor parallel on Gemma 4 (minivlm/budget/tensor_parallel.py, params_gemma4.py, kv_groups.py) against independent
truths: transformers' Gemma 4 language models built on the meta device with every parameter sharded by vLLM's Gemma 4
layout, read off each module's name and shape (q by heads, k / v by the layer's own KV heads, one per GPU when there
are fewer than GPUs; o and down by input; gate / up, the experts' width and the per-layer-embedding projection by
output; both embedding tables by vocabulary; router, per-layer gate and projection, norms and scalars replicated); KV
bytes per token per GPU from each config's layer types and KV head counts by hand (the shared-KV layers free at every
size); and the splits vLLM's Gemma 4 asserts against, refused by name."""
import functools
import math

import pytest
import torch
from transformers import AutoModelForImageTextToText

from minivlm.budget import (estimate, hf_config, kv_bytes_per_token, load_model_preset, model_shape,
                            text_params)

PRESETS = ["gemma-4-E2B-it", "gemma-4-E4B-it", "gemma-4-12B-it", "gemma-4-26B-A4B-it", "gemma-4-31B-it"]
COLUMN = {"q_proj", "gate_proj", "up_proj", "per_layer_model_projection"}
ROW = {"o_proj", "down_proj"}
VOCAB = {"embed_tokens", "embed_tokens_per_layer"}


@functools.cache
def language_model(preset) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every parameter of transformers' Gemma 4 language model, built on the meta device."""
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(hf_config(preset))
    return tuple((name, tuple(p.shape)) for name, p in model.model.language_model.named_parameters())


def sharded(params, tp: int, heads: int) -> int:
    """Elements of the language model on one of tp GPUs under vLLM's Gemma 4 layout."""
    head_dim = {name.split(".")[1]: shape[0] // heads for name, shape in params if name.endswith("q_proj.weight")}
    total = 0
    for name, shape in params:
        parts, numel = name.split("."), math.prod(shape)
        module = parts[-1] if parts[-2] == "experts" else parts[-2]  # the experts' tensors are parameters themselves
        if module in VOCAB:
            total += -(-shape[0] // tp) * shape[1]
        elif module in ("k_proj", "v_proj"):
            d = head_dim[parts[1]]
            total += max(1, shape[0] // d // tp) * d * shape[1]
        elif module in COLUMN | ROW or parts[-2] == "experts":  # experts: [E, 2m, h] and [E, h, m], split along m
            assert numel % tp == 0, (name, shape, tp)
            total += numel // tp
        else:
            total += numel
    return total


@pytest.mark.parametrize("preset", PRESETS)
def test_per_gpu_language_model_equals_a_sharded_meta_model(preset):
    params, heads = language_model(preset), hf_config(preset).text_config.num_attention_heads
    s = model_shape(preset)
    for tp in (1, 2, 4, 8):
        assert sum(text_params(s, tp).values()) == sharded(params, tp, heads), (preset, tp)


def kv_by_hand(preset, tp: int) -> dict[str, int]:
    """bf16 K and V bytes per token on one GPU by layer type: every layer before the shared ones, at its type's KV
    heads (full layers of an attention_k_eq_v model: num_global_key_value_heads) and head size, at least one head per
    GPU."""
    t = load_model_preset(preset)["text_config"]  # the published config.json's fields, as they are
    own = t["layer_types"][:t["num_hidden_layers"] - (t.get("num_kv_shared_layers") or 0)]
    full_kv = t["num_global_key_value_heads"] if t.get("attention_k_eq_v") else t["num_key_value_heads"]
    out = {}
    for kind in own:
        full = kind == "full_attention"
        heads, dim = (full_kv, t["global_head_dim"]) if full else (t["num_key_value_heads"], t["head_dim"])
        out[kind] = out.get(kind, 0) + 2 * 2 * max(1, heads // tp) * dim
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_kv_bytes_per_token_per_gpu_count_the_shared_layers_as_free(preset):
    """Per GPU and layer type (the full group's figure is the estimate's kv_bytes_per_token; the sliding group keeps
    its window of them); the shared-KV group names every shared layer at 0 bytes."""
    shared_layers = load_model_preset(preset)["text_config"].get("num_kv_shared_layers") or 0
    for tp in (1, 2, 4, 8):
        est = estimate(preset, dtype="bfloat16", device="H100 80GB", tensor_parallel_size=tp)
        hand = kv_by_hand(preset, tp)
        groups = {g.shape.kind: g for g in est.kv_groups.groups}
        assert est.kv_bytes_per_token == hand["full_attention"], (preset, tp)
        assert groups["sliding_window"].shape.bytes_per_token("bfloat16") == hand["sliding_attention"], (preset, tp)
        assert kv_bytes_per_token(model_shape(preset), "bfloat16", tp) == sum(hand.values())
        shared = groups.get("kv_shared")
        assert (len(shared.shape.layers) if shared else 0) == shared_layers and (not shared or shared.bytes == 0)
    # E2B: one KV head on every layer: each GPU keeps a copy, so a split gains no KV room per GPU
    assert kv_by_hand("gemma-4-E2B-it", 8) == kv_by_hand("gemma-4-E2B-it", 1)


def tiny(**text) -> dict:
    """A small Gemma 4 text config (sliding, full, sliding, full; the last layer shared) with `text` changed."""
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=24,
                num_key_value_heads=4, head_dim=8, global_head_dim=16, num_kv_shared_layers=1, sliding_window=8,
                layer_types=["sliding_attention", "full_attention"] * 2)
    return {"model_type": "gemma4", "text_config": dict(base, **text), "vision_config": None, "audio_config": None}


@pytest.mark.parametrize("text, tp, words", [
    (dict(num_key_value_heads=3), 2, "3 KV heads"),                       # 3 >= 2 and 2 does not divide it
    (dict(num_key_value_heads=6), 4, "6 KV heads"),                       # 6 >= 4, 4 does not divide it
    (dict(num_key_value_heads=3), 8, "3 KV heads"),                       # fewer than 8, but 8 is no multiple of 3
    (dict(attention_k_eq_v=True, num_global_key_value_heads=3), 4, "3 KV heads"),  # the full layers' own count
    (dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=6), 4,
     "6 expert MLP intermediate size"),
])
def test_splits_vllms_gemma4_refuses_are_refused(text, tp, words):
    with pytest.raises(ValueError, match=f"tensor_parallel_size {tp} does not divide the model's {words}"):
        estimate(tiny(**text), device="H100 80GB", tensor_parallel_size=tp, images_per_request=0)


def test_splits_vllms_gemma4_takes_are_taken():
    """Fewer KV heads than GPUs where the GPUs are a multiple of them (4 heads on 8 GPUs: 2 copies of each)."""
    est = estimate(tiny(), device="H100 80GB", tensor_parallel_size=8, images_per_request=0)
    assert est.kv_heads_per_gpu == 1 and est.tensor_parallel_size == 8
