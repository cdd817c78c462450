"""The calculator's hybrid memory (minivlm/budget/kv_groups.py, hybrid_kv.py) against hand-computed bytes, the caches
transformers really fills, models built on the meta device, the engine's own decoders, and the engine's real
allocation; and the families that are not hybrid keep exactly today's figures."""
import importlib
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
from transformers.models.gemma3 import Gemma3TextConfig
from transformers.models.qwen3_5 import Qwen3_5TextConfig

from minivlm.budget import estimate, hf_config, model_shape, parameter_count, vision_params
from minivlm.budget.kv_groups import (GroupShape, groups_from_specs, is_hybrid, layer_groups, size_groups,
                                      sliding_blocks, window_blocks)

HYBRID_PRESETS = ["Qwen3.5-0.8B", "Qwen3.5-2B", "Qwen3.5-4B", "Qwen3.5-9B", "Qwen3.5-27B", "gemma-3-4b-it",
                  "gemma-3-12b-it", "gemma-3-27b-it"]
# A Qwen3.5 text config of the tests' size: layers 0-2 Gated DeltaNet, layer 3 full attention.
QWEN = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_section": [1, 1, 0], "mrope_interleaved": True})
# A Gemma 3 text config: layers 0-4 slide over 8 tokens, layer 5 attends to all.
GEMMA = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, sliding_window=8)
QWEN_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
GEMMA_VISION = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, image_size=64, patch_size=8, vision_use_head=False)


def qwen_config(**text):
    return {"model_type": "qwen3_5", "text_config": dict(QWEN, **text), "vision_config": QWEN_VISION}


def gemma_config(**text):
    return {"model_type": "gemma3", "text_config": dict(GEMMA, **text), "vision_config": GEMMA_VISION,
            "mm_tokens_per_image": 16}


def cached_bytes(layer) -> dict[str, int]:
    """Bytes of every tensor one HF cache layer holds, by name (keys / values, conv / recurrent states)."""
    out = {name: t.nbytes for name, t in vars(layer).items() if isinstance(t, torch.Tensor) and t.numel()}
    for name in ("conv_states", "recurrent_states"):
        out.update({name: t.nbytes for t in (getattr(layer, name, None) or {}).values() if t is not None})
    return out


# ---- the groups and their bytes, by hand and against the caches transformers fills ---------------------------------
def test_qwen3_5_groups_by_hand():
    full, recurrent = layer_groups(qwen_config())
    assert (full.kind, full.layers) == ("full_attention", (3,))
    assert (recurrent.kind, recurrent.layers) == ("recurrent", (0, 1, 2))
    assert full.bytes_per_token("float32") == 2 * 1 * 2 * 16 * 4 == 256
    # conv_dim = 2 · 2 key heads · 8 + 4 value heads · 8 = 64; conv state 64 × 3, delta rule 4 × 8 × 8, in float32
    assert recurrent.state_shapes == ((64, 3), (4, 8, 8))
    assert recurrent.bytes_per_slot("bfloat16") == 3 * (64 * 3 * 4 + 4 * 8 * 8 * 4) == 5376
    auto = layer_groups(qwen_config(), state_dtype="auto")[1]  # HF's split: conv in the KV dtype, the rest float32
    assert auto.bytes_per_slot("bfloat16") == 3 * (64 * 3 * 2 + 4 * 8 * 8 * 4) == 4224
    assert layer_groups(qwen_config(), 2)[1].state_shapes == ((32, 3), (2, 8, 8))  # heads split over 2 GPUs


def test_gemma3_groups_by_hand():
    sliding, full = sorted(layer_groups(gemma_config()), key=lambda g: g.kind, reverse=True)
    assert (sliding.kind, sliding.layers, sliding.window) == ("sliding_window", (0, 1, 2, 3, 4), 8)
    assert (full.kind, full.layers) == ("full_attention", (5,))
    assert sliding.bytes_per_token("bfloat16") == 2 * 5 * 2 * 16 * 2 == 640 and full.bytes_per_token("bfloat16") == 128


def test_state_and_kv_bytes_equal_the_caches_transformers_fills():
    """HF's Qwen3.5 cache: the delta-rule state is exactly ours (float32, even in a bfloat16 model); its conv state
    keeps kernel columns, ours the kernel − 1 the causal conv still needs. HF's Gemma 3 sliding layers keep
    window − 1 tokens, its full layer every token, at our bytes per token."""
    tokens = 20
    model = AutoModelForCausalLM.from_config(Qwen3_5TextConfig(**QWEN), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.arange(tokens)[None], use_cache=True).past_key_values
    full, recurrent = layer_groups(qwen_config(), state_dtype="auto")
    held = [cached_bytes(layer) for layer in cache.layers]
    per_layer = recurrent.bytes_per_slot("bfloat16") // 3
    for layer in recurrent.layers:
        assert held[layer]["recurrent_states"] == math.prod(recurrent.state_shapes[1]) * 4
        assert held[layer]["conv_states"] // 4 * 3 == per_layer - held[layer]["recurrent_states"]
    assert held[3]["keys"] + held[3]["values"] == tokens * full.bytes_per_token("bfloat16")

    model = AutoModelForCausalLM.from_config(Gemma3TextConfig(**GEMMA)).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.arange(tokens)[None], use_cache=True).past_key_values
    sliding, full = sorted(layer_groups(gemma_config()), key=lambda g: g.kind, reverse=True)
    held = [cached_bytes(layer) for layer in cache.layers]
    one = sliding.bytes_per_token("float32") // len(sliding.layers)
    assert all(held[i]["keys"] + held[i]["values"] == (sliding.window - 1) * one for i in sliding.layers)
    assert held[5]["keys"] + held[5]["values"] == tokens * full.bytes_per_token("float32")


def test_layer_groups_equal_the_engines_decoders():
    """What the engine's own decoders say each layer keeps (their layer_specs), grouped, is what the config says."""
    for family, config, module in (("qwen3_5", qwen_config(), "qwen3_5"), ("gemma3", gemma_config(), "gemma3")):
        decoder_class = pytest.importorskip(f"minivlm.model.{module}")
        cls = getattr(decoder_class, {"qwen3_5": "Qwen3_5Decoder", "gemma3": "Gemma3Decoder"}[family])
        cfg = hf_config(config)
        with torch.device("meta"):
            decoder = cls(family, cfg.text_config, False)
        assert groups_from_specs(decoder.layer_specs) == layer_groups(cfg), family


def test_models_that_are_not_hybrid_are_one_full_group():
    for preset in ("Qwen2.5-VL-3B-Instruct", "Qwen3-VL-4B-Instruct", "SmolVLM2-2.2B-Instruct", "Qwen3-0.6B"):
        groups = layer_groups(preset)
        est = estimate(preset, device="L4")
        assert not is_hybrid(groups) and groups[0].layers == tuple(range(model_shape(preset).layers))
        assert groups[0].bytes_per_token("bfloat16") == est.kv_bytes_per_token
        assert est.kv_groups is None and not est.hybrid
        assert est.kv_cache_bytes == est.num_blocks * est.block_size * est.kv_bytes_per_token


# ---- sizing ---------------------------------------------------------------------------------------------------------
def test_sliding_group_sizes_by_hand():
    """block_size 4, 2 requests, chunks of 8: a request holds at most ceil((8 − 1 + 8) / 4) + 1 = 5 sliding blocks, so
    cap = 10. Full block f = 4 · 128 B, sliding block s = 4 · 640 B (bfloat16)."""
    groups = layer_groups(gemma_config())
    assert window_blocks(8, 8, 4) == 5 and sliding_blocks(6, 8, 8, 4) == 2 and sliding_blocks(64, 8, 8, 4) == 5

    def sizes(budget, **kw):
        s = size_groups(groups, "bfloat16", budget, 4, 2, 8, True, 64, **kw)
        return s.full_blocks, s.sliding_blocks, s.total_bytes

    f, s = 512, 2560
    assert sizes(20_000) == (20_000 // (f + s), 20_000 // (f + s), 6 * (f + s)) == (6, 6, 18_432)  # under the cap
    assert sizes(40_000) == ((40_000 - 10 * s) // f, 10, 28 * f + 10 * s) == (28, 10, 39_936)  # sliding capped at 10
    assert sizes(10 ** 9)[:2] == (32, 10)  # at most 2 requests × 64 / 4 full blocks
    assert sizes(None, num_blocks=7)[:2] == (7, 7) and sizes(None, num_blocks=12)[:2] == (12, 10)
    whole = size_groups(groups, "bfloat16", 40_000, 4, 2, 8, False, 64)  # no chunking: chunk = max_model_len
    assert whole.full_blocks == whole.sliding_blocks == 40_000 // (f + s)
    at_64 = size_groups(groups, "bfloat16", 40_000, 4, 2, 8, True, 64)
    assert at_64.max_concurrency == min(28 * 4 / 64, 10 / 5) == 1.75
    assert at_64.kv_tokens == 28 * 4


def test_recurrent_slots_by_hand():
    """2 requests, default 2 checkpoints each: 6 slots of 5,376 B first; then full blocks of 4 · 256 B (float32)."""
    groups = layer_groups(qwen_config())
    s = size_groups(groups, "float32", 50_000, 4, 2, 256, False, 256)
    assert (s.slots, s.checkpoints, s.full_blocks) == (6, 4, (50_000 - 6 * 5376) // 1024) == (6, 4, 17)
    assert s.total_bytes == 6 * 5376 + 17 * 1024 and s.kv_tokens == 68
    assert s.checkpoint_bytes == 4 * 5376  # what prefix caching costs: the checkpoint slots, within total_bytes
    assert s.max_concurrency == min(17 * 4 / 256, 2)
    fewer = size_groups(groups, "float32", 50_000, 4, 2, 256, False, 256, state_checkpoints=0)
    assert (fewer.slots, fewer.full_blocks) == (2, (50_000 - 2 * 5376) // 1024) == (2, 38)
    nothing = size_groups(groups, "float32", 6 * 5376 + 1000, 4, 2, 256, False, 256)  # not one block beside the slots
    assert (nothing.slots, nothing.full_blocks, nothing.total_bytes) == (0, 0, 0)


def test_estimate_sizes_a_hybrid_model_like_size_groups():
    """estimate's KV figures for a hybrid model are size_groups' on its usable memory; requests at once follow the
    per-request bytes, and a model whose every layer were full attention fits the fewer its longer requests allow."""
    config = gemma_config(num_hidden_layers=12)
    est = estimate(config, dtype="bfloat16", device_memory_gb=1, max_model_len=4096, num_seqs=4, images_per_request=0,
                   text_tokens_per_request=3000, enable_chunked_prefill=True, max_num_batched_tokens=256)
    groups = layer_groups(config)
    sizes = size_groups(groups, "bfloat16", est.usable_bytes, 16, 4, 256, True, 4096)
    assert est.kv_groups == sizes and est.num_blocks == sizes.full_blocks
    assert est.kv_cache_bytes == sizes.total_bytes == sum(b.bytes for b in est.breakdown if b.name.startswith("KV"))
    blocks = math.ceil(3000 / 16)
    per_request = 16 * (blocks * 256 + window_blocks(8, 256, 16) * 1280)  # 2 full + 10 sliding layers, 128 B each
    assert est.workload_concurrency == est.usable_bytes // per_request
    assert est.full_attention_concurrency == est.usable_bytes // (blocks * 16 * 12 * 128)
    assert est.workload_concurrency > 4 * est.full_attention_concurrency  # ten of twelve layers keep ~16 blocks


def test_recurrent_requests_pay_their_state_and_checkpoints():
    config = qwen_config(num_hidden_layers=8)
    est = estimate(config, dtype="float32", device_memory_gb=1, max_model_len=2048, num_seqs=2, images_per_request=0,
                   text_tokens_per_request=100)
    slot = layer_groups(config)[1].bytes_per_slot("float32")
    per_request = 7 * 16 * 2 * 256 + 3 * slot  # 7 blocks in 2 full layers; its slot and 2 checkpoints
    assert est.workload_concurrency == est.usable_bytes // per_request
    assert est.kv_groups.slots == 6 and est.fits
    rows = {b.name: b for b in est.breakdown}
    assert rows["Recurrent state (slots)"].bytes == 6 * slot
    assert "6 slots (2 running + 4 checkpoints)" in rows["Recurrent state (slots)"].formula


# ---- presets --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", HYBRID_PRESETS)
def test_hybrid_presets_count_like_a_meta_model_and_estimate(preset):
    config = hf_config(preset)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    assert parameter_count(preset) == sum(p.numel() for p in model.parameters())
    tower = [model.model.visual] if config.model_type == "qwen3_5" else \
        [model.model.vision_tower, model.model.multi_modal_projector]
    assert sum(vision_params(model_shape(preset)).values()) == sum(p.numel() for m in tower for p in m.parameters())
    est = estimate(preset, device="H100 80GB", max_model_len=32768, num_seqs=4, text_tokens_per_request=30000,
                   images_per_request=0, enable_chunked_prefill=True, max_num_batched_tokens=2048)
    assert est.hybrid and est.kv_groups.kv_tokens == est.num_blocks * 16 == est.kv_pool_tokens
    assert est.workload_concurrency > est.full_attention_concurrency  # 30,000 tokens: hybrid memory pays off


def test_published_kv_facts_of_the_presets():
    """KV bytes per token of the full-attention layers (bfloat16) and per request of the recurrent ones (float32)."""
    facts = {"Qwen3.5-0.8B": (2 * 6 * 2 * 256 * 2, 18 * 4 * (6144 * 3 + 16 * 128 * 128)),
             "Qwen3.5-9B": (2 * 8 * 4 * 256 * 2, 24 * 4 * (8192 * 3 + 32 * 128 * 128)),
             "Qwen3.5-27B": (2 * 16 * 4 * 256 * 2, 48 * 4 * (10240 * 3 + 48 * 128 * 128)),
             "gemma-3-27b-it": (2 * 10 * 16 * 128 * 2, 0)}
    for preset, (per_token, per_slot) in facts.items():
        groups = {g.kind: g for g in layer_groups(preset)}
        assert groups["full_attention"].bytes_per_token("bfloat16") == per_token, preset
        assert (groups["recurrent"].bytes_per_slot("bfloat16") if "recurrent" in groups else 0) == per_slot, preset
    assert layer_groups("gemma-3-4b-it")[1] == GroupShape("sliding_window", tuple(i for i in range(34) if i % 6 != 5),
                                                          4, 256, 1024)


# ---- the engine's real allocation -------------------------------------------------------------------------------
MAKERS = {"qwen3_5": ("tools.make_checkpoint_qwen3_5", "make_qwen3_5_checkpoint"),
          "gemma3": ("tools.make_checkpoint_gemma3", "make_gemma3_checkpoint")}


@pytest.fixture(scope="module", params=sorted(MAKERS))
def hybrid_checkpoint(request, tmp_path_factory):
    module, maker = MAKERS[request.param]
    make = getattr(importlib.import_module(module), maker)
    return make(str(tmp_path_factory.mktemp(request.param)))


def engine_report(path: str, **settings):
    from minivlm import Engine, EngineConfig
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", enforce_eager=True, **settings)) as engine:
        return engine.memory_report()


def group_sizes(report) -> dict[str, tuple[int, int]]:
    return {g["kind"]: (g["size"], g["bytes"]) for g in report.groups}


def test_engine_pools_equal_size_groups_for_given_blocks(hybrid_checkpoint):
    """num_blocks given: every group the engine allocates has size_groups' blocks or slots and bytes, for the groups
    layer_groups reads off the checkpoint's config alone."""
    settings = dict(num_blocks=40, block_size=4, max_num_seqs=3, max_model_len=256, enable_chunked_prefill=True,
                    max_num_batched_tokens=16)
    report = engine_report(hybrid_checkpoint, **settings)
    sizes = size_groups(layer_groups(hybrid_checkpoint), "float32", None, 4, 3, 16, True, 256, num_blocks=40)
    assert group_sizes(report) == {g.shape.kind: (g.slots or g.blocks, g.bytes) for g in sizes.groups}
    assert report.kv_cache_bytes == sizes.total_bytes and report.num_blocks == 40 == sizes.full_blocks


def test_calculator_equals_the_engines_real_allocation(hybrid_checkpoint):
    """num_blocks=None: the engine sizes every group from its memory budget, and estimate() with the same budget and
    settings says the same blocks, slots, bytes, tokens and concurrency (the budget is set so that it binds)."""
    settings = dict(block_size=4, max_num_seqs=3, max_model_len=256, enable_chunked_prefill=True,
                    max_num_batched_tokens=16)
    weights = engine_report(hybrid_checkpoint, num_blocks=8, **settings).weights_bytes
    config = hf_config(hybrid_checkpoint)  # a config, as the engine passes its own (image rules: the family's)

    def plan(budget):
        return estimate(config, dtype="float32", kv_dtype="float32", max_model_len=256, num_seqs=3,
                        max_num_batched_tokens=16, block_size=4, gpu_memory_utilization=1.0,
                        device_memory_bytes=budget, weights_bytes=weights, enable_chunked_prefill=True)
    first = plan(2 ** 40)
    budget = first.budget_bytes - first.usable_bytes + first.kv_groups.total_bytes // 2  # half of what could be used
    est, report = plan(budget), engine_report(hybrid_checkpoint, cpu_memory_budget_bytes=budget, **settings)
    assert 0 < est.num_blocks < first.num_blocks
    assert group_sizes(report) == {g.shape.kind: (g.slots or g.blocks, g.bytes) for g in est.kv_groups.groups}
    assert (report.num_blocks, report.kv_cache_bytes, report.kv_cache_tokens) == \
        (est.num_blocks, est.kv_cache_bytes, est.kv_pool_tokens)
    assert report.max_concurrency == pytest.approx(est.max_concurrency)
    # the checkpoints' memory: the engine's real slots against the calculator's figure, and the VRAM tab's row
    assert (report.checkpoint_slots, report.checkpoint_bytes) == (est.kv_groups.checkpoints,
                                                                  est.kv_groups.checkpoint_bytes)
    recurrent = next((g for g in report.groups if g["kind"] == "recurrent"), None)
    if recurrent is None:
        assert report.checkpoint_bytes == 0
        return
    assert report.checkpoint_bytes == recurrent["bytes"] // recurrent["size"] * 6 > 0  # 2 per request, 3 requests
    from panels.vram_tables import comparison
    for lang, name in (("en", "of which recurrent-state checkpoints (MiB)"), ("zh-CN", "其中循环状态检查点（MiB）")):
        row = comparison(est, report, lang).set_index(comparison(est, report, lang).columns[0]).loc[name]
        assert row.iloc[0] == row.iloc[1] == f"{report.checkpoint_bytes / 2**20:,.2f}"
