"""Tensor parallel VRAM figures against independent truths: transformers' models built on the meta device with every
parameter sharded by vLLM's rule (by module name, not by our formulas), KV bytes counted by hand, and the fewest
GPUs a 72B workload needs checked against the budget arithmetic, and the bytes transformers allocates for one GPU's
shard of a decoder."""
import functools

import pytest
import torch

from minivlm.budget import estimate, gpus_needed, hf_config, model_shape, prefill_peak
from tests.test_budget import LiveBytes, shrunk
from tools.make_checkpoint import FAMILIES

# Column-parallel modules split their outputs (dim 0, and the bias); row-parallel ones their inputs (dim 1, the bias
# stays whole). vLLM's Qwen-VL layout; names as transformers spells them.
COLUMN = {"q_proj", "gate_proj", "up_proj", "qkv", "fc1", "linear_fc1", "0"}  # "0": merger.mlp.0 (Qwen2/2.5)
KV = {"k_proj", "v_proj"}
ROW = {"o_proj", "down_proj", "proj", "fc2", "linear_fc2", "2"}  # "2": merger.mlp.2
VOCAB = {"embed_tokens", "lm_head"}
TP_CASES = [("Qwen2.5-VL-3B-Instruct", 2), ("Qwen2.5-VL-3B-Instruct", 4), ("Qwen2.5-VL-3B-Instruct", 8),
            ("Qwen2.5-VL-7B-Instruct", 2), ("Qwen2.5-VL-7B-Instruct", 4),
            ("Qwen2.5-VL-32B-Instruct", 2), ("Qwen2.5-VL-32B-Instruct", 4), ("Qwen2.5-VL-32B-Instruct", 8),
            ("Qwen2.5-VL-72B-Instruct", 2), ("Qwen2.5-VL-72B-Instruct", 4), ("Qwen2.5-VL-72B-Instruct", 8),
            ("Qwen3-VL-8B-Instruct", 2), ("Qwen3-VL-8B-Instruct", 8)]


@functools.cache
def meta_parameters(preset) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every unique parameter of the transformers model, built on the meta device (no memory)."""
    config = hf_config(preset)
    with torch.device("meta"):
        model = FAMILIES[config.model_type][1](config)
    return tuple((name, tuple(p.shape)) for name, p in model.named_parameters())


def sharded_numel(name: str, shape: tuple[int, ...], tp: int, config) -> int:
    """Elements of one parameter on one of tp GPUs under vLLM's tensor parallel layout."""
    t, v = config.text_config, config.vision_config
    parts = name.split(".")
    module, kind = parts[-2], parts[-1]
    if "visual" in parts:  # the tower splits only when its heads and MLP width divide by tp; else it is replicated
        if v.num_heads % tp or getattr(v, "intermediate_size", v.hidden_size) % tp:
            tp = 1
    elif module in KV:  # fewer KV heads than GPUs: one head per GPU
        head_dim = shape[0] // t.num_key_value_heads
        return max(1, t.num_key_value_heads // tp) * head_dim * (shape[1] if kind == "weight" else 1)
    numel = torch.Size(shape).numel()
    if "patch_embed" in parts:  # its conv is called proj too, but it is replicated
        return numel
    if module in COLUMN or module in VOCAB:
        return -(-shape[0] // tp) * numel // shape[0]
    if module in ROW and kind == "weight":
        return numel // tp
    return numel  # norms, row-parallel biases, patch embedding, position table: replicated


@pytest.mark.parametrize("preset, tp", TP_CASES)
def test_per_gpu_weights_equal_a_sharded_meta_model(preset, tp):
    config = hf_config(preset)
    params = meta_parameters(preset)
    sharded = sum(sharded_numel(name, shape, tp, config) for name, shape in params)
    est = estimate(preset, dtype="bfloat16", device="H100 80GB", tensor_parallel_size=tp)
    assert abs(est.predicted_weights_bytes - 2 * sharded) <= 0.01 * 2 * sharded  # the bound
    assert est.predicted_weights_bytes == 2 * sharded  # in fact exact: the Qwen vocabularies split evenly
    whole = sum(torch.Size(shape).numel() for _, shape in params)
    assert est.num_parameters == whole  # the model's size, not the shard's
    visual = sum(sharded_numel(n, s, tp, config) for n, s in params if ".visual." in n)
    assert est.vision_weights_bytes == 2 * visual


# KV bytes per token on one GPU, counted by hand: 2 (K, V) × layers × KV heads on the GPU × head_dim × 2 B (bf16).
KV_PER_GPU = {
    ("Qwen2.5-VL-7B-Instruct", 1): 2 * 28 * 4 * 128 * 2,
    ("Qwen2.5-VL-7B-Instruct", 2): 2 * 28 * 2 * 128 * 2,
    ("Qwen2.5-VL-7B-Instruct", 4): 2 * 28 * 1 * 128 * 2,   # 4 KV heads on 4 GPUs: one each
    ("Qwen2.5-VL-3B-Instruct", 4): 2 * 36 * 1 * 128 * 2,   # 2 KV heads on 4 GPUs: each head held by 2 GPUs
    ("Qwen2.5-VL-3B-Instruct", 8): 2 * 36 * 1 * 128 * 2,   # ... by 4 GPUs
    ("Qwen2.5-VL-72B-Instruct", 8): 2 * 80 * 1 * 128 * 2,  # 8 KV heads on 8 GPUs
    ("Qwen2.5-VL-72B-Instruct", 4): 2 * 80 * 2 * 128 * 2,
    ("Qwen2.5-VL-32B-Instruct", 8): 2 * 64 * 1 * 128 * 2,
    ("Qwen3-VL-8B-Instruct", 8): 2 * 36 * 1 * 128 * 2,
}


@pytest.mark.parametrize("preset, tp", sorted(KV_PER_GPU))
def test_kv_bytes_per_token_per_gpu(preset, tp):
    est = estimate(preset, dtype="bfloat16", device="H100 80GB", tensor_parallel_size=tp)
    assert est.kv_bytes_per_token == KV_PER_GPU[preset, tp]
    assert est.kv_heads_per_gpu == KV_PER_GPU[preset, tp] // (2 * hf_config(preset).text_config.num_hidden_layers
                                                              * 128 * 2)


def test_splits_vllm_refuses_are_refused():
    with pytest.raises(ValueError, match="does not divide the model's 28 attention heads"):
        estimate("Qwen2.5-VL-7B-Instruct", device="H100 80GB", tensor_parallel_size=8)  # 28 query heads
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive int"):
        estimate("Qwen2.5-VL-7B-Instruct", device="H100 80GB", tensor_parallel_size=0)


def test_vision_tower_split_or_replicated():
    one = estimate("Qwen2.5-VL-3B-Instruct", device="H100 80GB")
    four = estimate("Qwen2.5-VL-3B-Instruct", device="H100 80GB", tensor_parallel_size=4)
    eight = estimate("Qwen2.5-VL-3B-Instruct", device="H100 80GB", tensor_parallel_size=8)
    assert four.vision_split == 4 and four.vision_weights_bytes < one.vision_weights_bytes / 3
    assert eight.vision_split == 1 and eight.vision_weights_bytes == one.vision_weights_bytes  # 3420 MLP width
    assert "replicated on each GPU" in next(b.formula for b in eight.breakdown if b.name == "Vision tower weights")


def test_more_gpus_mean_less_per_gpu_and_more_blocks():
    ests = [estimate("Qwen2.5-VL-72B-Instruct", device="A100 80GB", tensor_parallel_size=tp, max_model_len=32768)
            for tp in (1, 2, 4, 8)]
    weights = [e.weights_bytes for e in ests]
    assert weights == sorted(weights, reverse=True) and weights[0] > 7.5 * weights[3]
    assert [e.activation_peak_bytes for e in ests] == sorted((e.activation_peak_bytes for e in ests), reverse=True)
    assert ests[0].num_blocks == ests[1].num_blocks == 0 < ests[2].num_blocks < ests[3].num_blocks
    for e in ests:  # the pool rule per GPU still adds up to the budget
        assert sum(b.bytes for b in e.breakdown if "peak (" not in b.name) == e.budget_bytes


def test_multi_gpu_presets_plan_tensor_parallel():
    four = estimate("Qwen2.5-VL-72B-Instruct", device="4× H100 80GB")
    assert four.tensor_parallel_size == 4
    assert four == estimate("Qwen2.5-VL-72B-Instruct", device="H100 80GB", tensor_parallel_size=4)
    with pytest.raises(ValueError, match="has 4 GPUs but tensor_parallel_size is 2"):
        estimate("Qwen2.5-VL-72B-Instruct", device="4× H100 80GB", tensor_parallel_size=2)


def test_which_gpus_for_72b_with_4_images_at_32k():
    workload = dict(images_per_request=4, max_model_len=32768, num_seqs=8)
    plans = {p.device: p for p in gpus_needed("Qwen2.5-VL-72B-Instruct", **workload)}
    assert {d: plans[d].gpus for d in ("A100 80GB", "H100 80GB", "H200", "L4")} == \
        {"A100 80GB": 4, "H100 80GB": 4, "H200": 2, "L4": None}
    # by hand: 73.4 B bf16 parameters are 136.7 GiB; halved (68.4 GiB) they leave too little of 0.9 × 80 GiB
    two = estimate("Qwen2.5-VL-72B-Instruct", device="A100 80GB", tensor_parallel_size=2, **workload)
    assert two.weights_bytes > 68 * 2 ** 30 and two.num_blocks == 0 and "leave no room" in two.limits[0]
    four = plans["H100 80GB"].estimate
    per_request = -(-(4 * (999 + 2) + 512) // 16) * 16  # 4 images of 999 vision tokens + start/end, 512 text tokens
    assert four.fits and four.kv_pool_tokens >= 8 * per_request == four.kv_demand_tokens
    assert "KV pool holds" in plans["L4"].reason  # 8 L4s hold the weights but too few KV blocks


@pytest.mark.parametrize("tp", [2, 4, 8])  # Qwen3-VL: its config names head_dim, so a shard keeps it
def test_prefill_peak_per_gpu_matches_a_decoder_of_one_gpus_widths(tp):
    """One GPU's shard of a decoder is a decoder with heads / tp, KV heads / tp (at least 1) and MLP width / tp, and
    the full hidden size: the bytes transformers allocates for it are the per-GPU prefill peak."""
    config = shrunk("Qwen3-VL-4B-Instruct")
    t = config.text_config
    t.vocab_size = 64
    whole = model_shape(config)
    t.head_dim = whole.head_dim  # kept: the shard has fewer heads, not narrower ones
    t.num_attention_heads //= tp
    t.num_key_value_heads = max(1, t.num_key_value_heads // tp)
    t.intermediate_size //= tp
    with torch.device("meta"):
        decoder = type(FAMILIES[config.model_type][1](config).model.language_model)._from_config(
            t, attn_implementation="sdpa", dtype=torch.float32)
    decoder = decoder.to_empty(device="cpu").eval()
    tokens = 128
    embeds = torch.randn(1, tokens, t.hidden_size)
    positions = torch.arange(tokens).view(1, 1, tokens).expand(3, 1, tokens)
    tracker = LiveBytes(p.untyped_storage().data_ptr() for p in decoder.parameters())
    with torch.no_grad(), tracker:
        decoder(inputs_embeds=embeds, position_ids=positions, use_cache=False)
    predicted = prefill_peak(whole, tokens, 0, 4, eager=False, tp=tp)[0]
    assert abs(predicted - tracker.peak) <= 0.03 * tracker.peak
    assert predicted < prefill_peak(whole, tokens, 0, 4, eager=False)[0]  # and below the single GPU's
