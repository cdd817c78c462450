"""The VRAM budget against independent truths: transformers' models and processors, checkpoint tensors, real
allocations, published parameter counts, and the activation bytes the HF towers really allocate."""
import json
import os
import random
import weakref

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

from minivlm import Engine
from minivlm.budget import (FAMILY_PROCESSOR, PRESET_DIR, estimate, hf_config, load_device_preset, model_shape,
                            parameter_count, prefill_peak, smart_resize, vision_params, vision_peak, vision_tokens)
from minivlm.inputs.processor import load_processor
from tools.make_checkpoint import FAMILIES, make_random_checkpoint

PRESETS = ["Qwen2.5-VL-3B-Instruct", "Qwen2.5-VL-7B-Instruct", "Qwen3-VL-2B-Instruct", "Qwen3-VL-4B-Instruct",
           "Qwen3-VL-8B-Instruct"]
# Parameter counts of the published checkpoints, as reported by people who loaded them (see the presets' _source).
PUBLISHED = {"Qwen2.5-VL-3B-Instruct": 3_754_622_976, "Qwen3-VL-4B-Instruct": 4_437_815_808}
# KV bytes per token in bfloat16 from the published configs: 2 · layers · KV heads · head_dim 128 · 2 B.
KV_FACTS = {"Qwen2.5-VL-3B-Instruct": 36_864, "Qwen2.5-VL-7B-Instruct": 57_344, "Qwen3-VL-4B-Instruct": 147_456,
            "Qwen3-VL-8B-Instruct": 147_456}
PATCH = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16}
TINY_MODEL = os.path.join(os.path.dirname(PRESET_DIR), "tiny-qwen-vl")
STORED_BYTES = {"F32": 4, "BF16": 2, "F16": 2}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Random-weight checkpoints of all three families (plus an untied one) with small processor limits."""
    out = {}
    for family in FAMILIES:
        factor = PATCH[family] * 2
        out[family] = make_random_checkpoint(family, str(tmp_path_factory.mktemp(family)), patch_size=PATCH[family],
                                             min_pixels=factor ** 2 * 4, max_pixels=factor ** 2 * 64)
    out["qwen3_vl_untied"] = make_random_checkpoint("qwen3_vl", str(tmp_path_factory.mktemp("untied")),
                                                    patch_size=16, tie=False)
    return out


def stored_tensor_bytes(checkpoint: str) -> int:
    """Bytes of every tensor in a checkpoint's safetensors files, read from their headers."""
    total = 0
    for name in sorted(os.listdir(checkpoint)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(checkpoint, name), "pt") as f:
                for key in f.keys():
                    piece = f.get_slice(key)
                    total += STORED_BYTES[piece.get_dtype()] * torch.Size(piece.get_shape()).numel()
    return total


# ---- weights -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_parameter_count_equals_transformers_model_on_meta(preset):
    config = hf_config(preset)
    with torch.device("meta"):
        model = FAMILIES[config.model_type][1](config)
    assert parameter_count(preset) == sum(p.numel() for p in model.parameters())
    assert sum(vision_params(model_shape(preset)).values()) == sum(p.numel() for p in model.model.visual.parameters())


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_weights_within_one_percent_of_published_checkpoint(preset):
    est = estimate(preset, dtype="bfloat16", device="H100 80GB")
    assert abs(est.num_parameters - PUBLISHED[preset]) <= 0.01 * PUBLISHED[preset]
    assert abs(est.predicted_weights_bytes - 2 * PUBLISHED[preset]) <= 0.01 * 2 * PUBLISHED[preset]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_untied"])
def test_weight_bytes_equal_checkpoint_and_loaded_tensors(checkpoints, family):
    path = checkpoints[family]
    assert estimate(path, dtype="float32", device_memory_gb=1).predicted_weights_bytes == stored_tensor_bytes(path)
    config = hf_config(path)
    model = FAMILIES[config.model_type][1].from_pretrained(path, dtype=torch.bfloat16)
    loaded = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied lm_head is one tensor
    assert estimate(path, dtype="bfloat16", device_memory_gb=1).predicted_weights_bytes == loaded


def test_weight_bytes_of_the_shipped_tiny_model():
    dtype = hf_config(TINY_MODEL).text_config.dtype or "float32"
    est = estimate(TINY_MODEL, dtype=str(dtype), device_memory_gb=1)
    assert est.predicted_weights_bytes == stored_tensor_bytes(TINY_MODEL)


def test_quantized_weights_shrink_only_the_decoder():
    bf16, int8, int4 = (estimate("Qwen2.5-VL-7B-Instruct", dtype=d, device="A100 80GB") for d in
                        ("bfloat16", "int8", "int4"))
    assert bf16.vision_weights_bytes == int8.vision_weights_bytes == int4.vision_weights_bytes
    assert bf16.text_weights_bytes > int8.text_weights_bytes > int4.text_weights_bytes
    embeddings = 2 * 2 * 152064 * 3584  # untied: embed_tokens + lm_head stay bfloat16
    assert int4.text_weights_bytes > embeddings


# ---- KV cache ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", sorted(KV_FACTS))
def test_kv_bytes_per_token_match_model_facts(preset):
    est = estimate(preset, dtype="bfloat16", device="H200")
    assert est.kv_bytes_per_token == KV_FACTS[preset]
    t = hf_config(preset).text_config
    assert est.kv_bytes_per_token < 2 * t.num_hidden_layers * t.num_attention_heads * 128 * 2  # GQA, not MHA


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_kv_bytes_equal_hf_cache_and_paged_pool_allocation(checkpoints, family):
    path = checkpoints[family]
    config = hf_config(path)
    model = FAMILIES[config.model_type][1].from_pretrained(path, dtype=torch.float32).eval()
    tokens = 23
    with torch.no_grad():
        cache = model(input_ids=torch.arange(tokens)[None] + 10, use_cache=True).past_key_values
    cached = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    est = estimate(path, dtype="float32", kv_dtype="float32", device_memory_gb=1, block_size=4)
    assert cached == tokens * est.kv_bytes_per_token
    t = config.text_config  # the engine's pool: per layer K and V of [num_blocks, block_size, kv_heads, head_dim]
    shape = (est.num_blocks, est.block_size, t.num_key_value_heads, t.head_dim)
    pool = [torch.empty(shape, dtype=torch.float32) for _ in range(2 * t.num_hidden_layers)]
    assert sum(x.nbytes for x in pool) == est.kv_cache_bytes > 0


def test_engine_kv_pool_and_weights_match_the_estimate(checkpoints):
    path = checkpoints["qwen2_5_vl"]
    with Engine(model=path, device="cpu", dtype="float32", num_blocks=7, block_size=4) as engine:
        report = engine.memory_report()
    est = estimate(path, dtype="float32", kv_dtype="float32", device_memory_gb=1, block_size=4)
    assert report.kv_bytes_per_token == est.kv_bytes_per_token
    assert report.kv_cache_bytes == 7 * 4 * est.kv_bytes_per_token
    assert report.weights_bytes == est.predicted_weights_bytes


# ---- vision tokens -------------------------------------------------------------------------------------------------
def random_sizes(seed, n, longest=1600):
    rng = random.Random(seed)
    sizes = [(rng.randint(1, longest), rng.randint(1, longest)) for _ in range(n)]
    return [(h, w) for h, w in sizes if max(h, w) <= 200 * min(h, w)] + [(27, 29), (14, 2800), (10, 10), (1, 150)]


@pytest.mark.parametrize("patch", [14, 16])
def test_vision_tokens_equal_transformers_processor(patch):
    factor = patch * 2
    limits = [(factor ** 2 * 4, factor ** 2 * 256), (factor ** 2 * 64, factor ** 2 * 80), (3136, 12845056)]
    for k, (lo, hi) in enumerate(limits):
        processor = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                             size={"shortest_edge": lo, "longest_edge": hi})
        for h, w in random_sizes(seed=patch * 10 + k, n=25):
            t, gh, gw = processor(images=[Image.new("RGB", (w, h))])["image_grid_thw"][0].tolist()
            ours = vision_tokens(h, w, "qwen3_vl", min_pixels=lo, max_pixels=hi, patch_size=patch)
            assert ours == t * gh * gw // 4, (h, w, lo, hi)
            assert smart_resize(h, w, factor, lo, hi) == (gh * patch, gw * patch)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_vision_tokens_equal_placeholders_of_the_minivlm_processor(checkpoints, family):
    path = checkpoints[family]
    processor = load_processor(path, family)
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for h, w in random_sizes(seed=len(family), n=8, longest=700):
        ids = processor(text=["<|vision_start|><|image_pad|><|vision_end|>hi"], images=[Image.new("RGB", (w, h))],
                        return_tensors="pt")["input_ids"][0]
        assert int((ids == pad).sum()) == vision_tokens(h, w, path), (h, w)


def test_family_defaults_and_factors():
    assert FAMILY_PROCESSOR["qwen2_5_vl"]["patch_size"] * 2 == 28
    assert FAMILY_PROCESSOR["qwen3_vl"]["patch_size"] * 2 == 32
    assert vision_tokens(768, 1024, "Qwen2.5-VL-3B-Instruct") == 27 * 37
    assert vision_tokens(768, 1024, "Qwen3-VL-4B-Instruct") == 24 * 32
    assert vision_tokens(10, 10, "qwen3_vl") == 8 * 8  # grown to the 256² minimum


# ---- activation peaks vs what transformers' modules really allocate ----------------------------------------------
class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every storage an op creates while it stays alive; keeps the peak."""

    def __init__(self, known):
        super().__init__()
        self.known, self.live, self.peak, self.alive = set(known), 0, 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        inputs = {a.untyped_storage().data_ptr() for a in tensors}  # views of an input allocate nothing
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                if size and key not in inputs and key not in self.known and key not in self.alive:
                    self.alive.add(key)
                    self.live += size
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self.free, key, size)
        return out

    def free(self, key, size):
        self.alive.discard(key)
        self.live -= size


# Qwen2-VL-2B-Instruct's widths (no preset ships for Qwen2-VL): ViT 1280 wide, MLP ratio 4, LLM 1536 / 8960.
QWEN2_VL_2B = {"model_type": "qwen2_vl", "vision_config": {"embed_dim": 1280, "hidden_size": 1536, "num_heads": 16},
               "text_config": {"hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
                               "num_key_value_heads": 2, "vocab_size": 151936}}
PEAK_MODELS = ["qwen2_vl", "Qwen2.5-VL-3B-Instruct", "Qwen3-VL-4B-Instruct"]


def shrunk(preset):
    """The preset's real widths with 3 ViT / 2 LLM layers, so a CPU forward stays quick; as in the real models the
    deepstack features are all taken before the last ViT block."""
    config = hf_config(QWEN2_VL_2B if preset == "qwen2_vl" else preset)
    config.vision_config.depth, config.text_config.num_hidden_layers = 3, 2
    if hasattr(config.vision_config, "fullatt_block_indexes"):
        config.vision_config.fullatt_block_indexes = [2]
    if hasattr(config.vision_config, "deepstack_visual_indexes"):
        config.vision_config.deepstack_visual_indexes = [0, 1]
    return config


@pytest.mark.parametrize("preset", PEAK_MODELS)
def test_vision_peak_matches_bytes_the_hf_tower_allocates(preset):
    torch.manual_seed(0)
    config = shrunk(preset)
    with torch.device("meta"):  # uninitialised weights: the bytes allocated do not depend on their values
        tower = type(FAMILIES[config.model_type][1](config).model.visual)._from_config(
            config.vision_config, attn_implementation="sdpa", dtype=torch.float32)
    tower = tower.to_empty(device="cpu").eval()
    s, (gh, gw) = model_shape(config), (12, 20)
    pixels = torch.randn(gh * gw, 3 * 2 * s.patch_size ** 2)
    tracker = LiveBytes(p.untyped_storage().data_ptr() for p in tower.parameters())
    with torch.no_grad(), tracker:
        tower(pixels, grid_thw=torch.tensor([[1, gh, gw]]))
    predicted = vision_peak(s, gh * gw, 4, eager=False)[0] - pixels.nbytes  # the pixels were made outside
    assert abs(predicted - tracker.peak) <= 0.03 * tracker.peak


@pytest.mark.parametrize("preset", PEAK_MODELS)
def test_prefill_peak_matches_bytes_the_hf_decoder_allocates(preset):
    config = shrunk(preset)
    config.text_config.vocab_size = 64
    with torch.device("meta"):
        decoder = type(FAMILIES[config.model_type][1](config).model.language_model)._from_config(
            config.text_config, attn_implementation="sdpa", dtype=torch.float32)
    decoder = decoder.to_empty(device="cpu").eval()
    tokens = 128
    embeds = torch.randn(1, tokens, config.text_config.hidden_size)
    positions = torch.arange(tokens).view(1, 1, tokens).expand(3, 1, tokens)
    tracker = LiveBytes(p.untyped_storage().data_ptr() for p in decoder.parameters())
    with torch.no_grad(), tracker:
        decoder(inputs_embeds=embeds, position_ids=positions, use_cache=False)
    predicted = prefill_peak(model_shape(config), tokens, 0, 4, eager=False)[0]
    assert abs(predicted - tracker.peak) <= 0.03 * tracker.peak


# ---- the num_blocks rule -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_num_blocks_fill_the_budget_and_never_go_negative(preset):
    for gib in (1, 8, 24, 80):
        est = estimate(preset, device_memory_gb=gib, gpu_memory_utilization=0.85, block_size=16)
        spent = est.weights_bytes + est.activation_peak_bytes + est.overhead_bytes + est.kv_cache_bytes
        block = 16 * est.kv_bytes_per_token
        budget = int(gib * 2 ** 30 * 0.85)
        assert est.num_blocks >= 0 and est.kv_cache_bytes == est.num_blocks * block
        assert spent <= budget or est.num_blocks == 0
        assert budget - spent < block or est.num_blocks == 0
        assert sum(item.bytes for item in est.breakdown if "peak (" not in item.name) == budget
    assert estimate(preset, device_memory_gb=1).num_blocks == 0  # no model here fits 1 GiB: 0 blocks, not negative


def test_measured_weights_override_moves_blocks_by_exactly_their_size():
    base = estimate("Qwen3-VL-2B-Instruct", device="L4")
    block = base.block_size * base.kv_bytes_per_token
    heavier = estimate("Qwen3-VL-2B-Instruct", device="L4", weights_bytes=base.predicted_weights_bytes + 10 * block)
    assert heavier.num_blocks == base.num_blocks - 10 and heavier.weights_bytes != heavier.predicted_weights_bytes
    rows = [item.bytes for item in heavier.breakdown if "peak (" not in item.name]
    assert sum(rows) == int(heavier.memory_bytes * 0.9)  # the breakdown still adds up to the budget


def test_concurrency_like_vllm_and_workload():
    est = estimate("Qwen2.5-VL-3B-Instruct", device="A10G", max_model_len=4096, block_size=16, num_seqs=4,
                   images_per_request=2, image_size=(1024, 768), text_tokens_per_request=300)
    assert est.max_concurrency == est.num_blocks / 256
    assert est.tokens_per_request == 2 * (999 + 2) + 300
    assert est.workload_concurrency == est.num_blocks // -(-est.tokens_per_request // 16)
    assert est.fits and not estimate("Qwen2.5-VL-3B-Instruct", device="A10G", max_model_len=1024).fits_context


def test_device_presets_state_their_units():
    with open(os.path.join(PRESET_DIR, "devices.json")) as f:
        devices = json.load(f)["devices"]
    for name in ("T4", "L4", "A10G", "RTX 4090", "A100 40GB", "A100 80GB", "H100 80GB", "H200"):
        assert name in devices
    for name, d in devices.items():
        stated = float(d["vendor_states"].split(": ")[1].split(" GB")[0])
        assert 0.9 * stated <= d["memory_bytes"] / 2 ** 30 <= stated, name  # vendor GB ~ GiB, driver shows less
        assert 0 < d["working_set_fraction"] <= 1
    mac = estimate("Qwen3-VL-2B-Instruct", device="Apple M-series 16 GB")
    assert mac.memory_bytes == int(16 * 2 ** 30 * load_device_preset("Apple M-series 16 GB")["working_set_fraction"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(model_config="Qwen9-VL"), "unknown model preset"),
    (dict(model_config={"model_type": "llama"}), "not a supported family"),
    (dict(dtype="int3"), "unknown dtype"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(device="L4", device_memory_gb=24), "exactly one"),
    (dict(device="Z80"), "unknown device preset"),
    (dict(image_size=(5000, 10)), "aspect ratio"),
    (dict(block_size=0), "block_size"),
    (dict(min_pixels=10 ** 6, max_pixels=10), "min_pixels"),
])
def test_bad_input_is_a_clear_value_error(kwargs, match):
    args = dict(model_config="Qwen2.5-VL-3B-Instruct", device_memory_gb=24) | kwargs
    if "device" in kwargs and "device_memory_gb" not in kwargs:
        args.pop("device_memory_gb")
    with pytest.raises(ValueError, match=match):
        estimate(args.pop("model_config"), **args)
