"""The calculator on Gemma 4 (minivlm/budget/params_gemma4.py, shapes_gemma4.py, kv_groups.py, soft_tokens.py)
against independent truths: models transformers builds on the meta device, the parameter counts Google and a public
safetensors census state, the caches transformers really fills (shared layers keep nothing), transformers' own
image processor, and the engine's real allocation on the random test checkpoint."""
import importlib
import importlib.util
import random

import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
from transformers.models.gemma4 import Gemma4ImageProcessorPil

from minivlm.budget import estimate, hf_config, image_plan, model_shape, parameter_count, text_params, vision_params
from minivlm.budget.kv_groups import SHARED, GroupShape, layer_groups, size_groups
from minivlm.budget.params import audio_params
from minivlm.inputs.soft_tokens import soft_tokens

PRESETS = ["gemma-4-E2B-it", "gemma-4-E4B-it", "gemma-4-12B-it", "gemma-4-26B-A4B-it", "gemma-4-31B-it"]
# Figures Google's model card states, in billions as rounded there, and the part of the model each one counts: the
# count must round to the same figure (within one unit of its last digit, as tests/test_budget_matrix.py checks).
PUBLISHED_B = {"gemma-4-E2B-it": ("all", "5.1"), "gemma-4-E4B-it": ("all", "8"), "gemma-4-12B-it": ("all", "12"),
               "gemma-4-26B-A4B-it": ("text", "25.2"), "gemma-4-31B-it": ("text", "30.7")}
CENSUS_31B = 31_273_088_876  # values in the 31B's safetensors (a public census): parameters + persistent buffers


def part(preset: str, which: str) -> int:
    s = model_shape(preset)
    return sum(text_params(s).values()) if which == "text" else parameter_count(preset)


@pytest.mark.parametrize("preset", PRESETS)
def test_parameter_counts_equal_a_meta_model_part_by_part(preset):
    config = hf_config(preset)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)

    def count(*names):
        return sum(p.numel() for n in names if getattr(model.model, n, None) is not None
                   for p in getattr(model.model, n).parameters())
    s = model_shape(preset)
    assert parameter_count(preset) == sum(p.numel() for p in model.parameters())
    assert sum(text_params(s).values()) == count("language_model")
    assert sum(vision_params(s).values()) == count("vision_tower", "embed_vision")
    assert sum(audio_params(s).values()) == count("audio_tower", "embed_audio")
    which, stated = PUBLISHED_B[preset]
    assert abs(part(preset, which) / 1e9 - float(stated)) <= 10 ** -len(stated.partition(".")[2]), preset


def test_published_figures_beyond_the_totals():
    """E2B's 2.3B effective (the language model without its per-layer embedding table), the 26B-A4B's 3.8B active
    (8 of 128 experts per token), and the 31B's safetensors census (+ 60 layer scalars, the tower's 2 · 1152
    standardisation buffers)."""
    e2b = model_shape("gemma-4-E2B-it")
    table = e2b.ple_vocab * e2b.layers * e2b.ple_dim
    assert round((sum(text_params(e2b).values()) - table) / 1e9, 1) == 2.3
    moe = model_shape("gemma-4-26B-A4B-it")
    experts = moe.layers * moe.experts * 3 * moe.expert_intermediate * moe.hidden
    active = sum(text_params(moe).values()) - experts * (1 - moe.top_k_experts / moe.experts)
    assert round(active / 1e9, 1) == 3.8
    assert parameter_count("gemma-4-31B-it") + 60 + 2 * 1152 == CENSUS_31B


def test_kv_bytes_per_token_by_hand():
    """E2B: 12 sliding layers of 1 KV head × 256 and 3 full ones of 1 × 512 keep K/V; layers 15-34 read layers 13
    (sliding) and 14 (full) and keep nothing. 31B: 50 sliding layers of 16 × 256, 10 full of 4 × 512 (keys = values
    in projection, both cached)."""
    full, sliding, shared = layer_groups("gemma-4-E2B-it")
    assert full == GroupShape("full_attention", (4, 9, 14), 1, 512)
    assert sliding == GroupShape("sliding_window", (0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13), 1, 256, 512)
    assert (full.bytes_per_token("bfloat16"), sliding.bytes_per_token("bfloat16")) == (2 * 3 * 1 * 512 * 2,
                                                                                       2 * 12 * 1 * 256 * 2)
    assert shared.kind == SHARED and shared.layers == tuple(range(15, 35)) and shared.bytes_per_token("bfloat16") == 0
    assert shared.sources == tuple(14 if i % 5 == 4 else 13 for i in range(15, 35))
    by_kind = {g.kind: g.bytes_per_token("bfloat16") for g in layer_groups("gemma-4-31B-it")}
    assert by_kind == {"full_attention": 2 * 10 * 4 * 512 * 2, "sliding_window": 2 * 50 * 16 * 256 * 2}
    est = estimate("gemma-4-E2B-it", device="L4")
    rows = {b.name: b for b in est.breakdown}
    shared_row = rows["KV cache: shared-KV layers (free)"]
    assert shared_row.bytes == 0 and "20 layers (15–34)" in shared_row.formula
    # 16 shared sliding layers (1 × 256) and 4 shared full ones (1 × 512), had they their own K/V
    assert f"would cost {16 * 2 * 256 * 2 + 4 * 2 * 512 * 2:,} B/token more" in shared_row.formula
    assert est.kv_groups.group(SHARED).blocks == 0 and est.kv_groups.group(SHARED).bytes == 0
    assert rows["Audio tower (not loaded)"].bytes == 0 and est.vision_weights_bytes == 2 * sum(
        vision_params(model_shape("gemma-4-E2B-it")).values())


# A Gemma 4 text config of the tests' size: sliding, sliding, full twice; the last 3 layers shared.
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, global_head_dim=16, num_kv_shared_layers=3, sliding_window=8,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            hidden_size_per_layer_input=4, vocab_size_per_layer_input=64)


@pytest.mark.parametrize("k_eq_v", [False, True])
def test_groups_equal_the_cache_transformers_fills(k_eq_v):
    """Bytes per token of every group = what HF's cache holds after 5 tokens (under the window): shared layers hold
    nothing (DummyLayer), the full layers' keys and values both, at global_head_dim (and 1 KV head with k_eq_v)."""
    text = dict(TINY, attention_k_eq_v=k_eq_v, num_global_key_value_heads=1 if k_eq_v else None)
    config = hf_config({"model_type": "gemma4", "text_config": text, "vision_config": None, "audio_config": None})
    with torch.device("meta"):
        decoder = AutoModelForCausalLM.from_config(config.text_config, dtype=torch.float32)
    decoder = decoder.to_empty(device="cpu").eval()
    with torch.no_grad():
        cache = decoder(input_ids=torch.arange(5)[None], use_cache=True).past_key_values
    held = [(layer.keys.nbytes + layer.values.nbytes) // 5 if getattr(layer, "keys", None) is not None else 0
            for layer in cache.layers]
    groups = {g.kind: g for g in layer_groups(config)}
    assert held[3:] == [0, 0, 0] and groups[SHARED].layers == (3, 4, 5) and groups[SHARED].sources == (1, 1, 2)
    assert sum(held) == sum(g.bytes_per_token("float32") for g in groups.values())
    assert held[2] == groups["full_attention"].bytes_per_token("float32") == 2 * (1 if k_eq_v else 2) * 16 * 4


def test_soft_tokens_equal_the_image_processor():
    """Tokens per image = transformers' Gemma 4 processor's num_soft_tokens_per_image, on thin, square, odd and
    huge images, at the default 280 budget and the smallest and largest; the plan pads the encoder to the budget."""
    rng = random.Random(4)
    sizes = [(4, 4), (20, 3000), (3000, 20), (768, 1024), (383, 385), (1080, 1920)] + \
        [(rng.randint(8, 2500), rng.randint(8, 2500)) for _ in range(4)]
    for budget in (70, 280, 1120):
        processor = Gemma4ImageProcessorPil(max_soft_tokens=budget, resample=0)
        for h, w in sizes[:: 1 if budget == 280 else 3]:
            out = processor(images=[Image.new("RGB", (w, h))])
            assert soft_tokens(h, w, 16, 3, budget) == out["num_soft_tokens_per_image"][0], (budget, h, w)
    plan = image_plan("gemma-4-E2B-it", 768, 1024)
    assert (plan.vision_tokens, plan.marker_tokens, plan.patches) == (soft_tokens(768, 1024, 16, 3, 280), 2, 280 * 9)
    assert image_plan("gemma-4-12B-it", 768, 1024).patches == 280  # merged 48-px patches, no encoder


def test_a_soft_token_budget_sizes_each_image_as_the_processor_counts():
    """estimate(..., max_soft_tokens=B), the VRAM tab's knob: each image's tokens are transformers' Gemma 4 image
    processor's own count under B (num_soft_tokens_per_image), for every B it accepts, and the encoder sees B · 9
    patches (the 12B: B merged patches); the workload grows with it; other values and other families are refused."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import _SUPPORTED_SOFT_TOKENS

    from minivlm.budget import SOFT_TOKEN_BUDGETS
    assert SOFT_TOKEN_BUDGETS == _SUPPORTED_SOFT_TOKENS
    processor, needed = Gemma4ImageProcessorPil(resample=0), []
    for budget in SOFT_TOKEN_BUDGETS:
        hf = processor(images=[Image.new("RGB", (1024, 768))], max_soft_tokens=budget)["num_soft_tokens_per_image"][0]
        est = estimate("gemma-4-E4B-it", device="L4", image_size=(1024, 768), max_soft_tokens=budget)
        assert est.vision_tokens_per_image == hf and est.image_marker_tokens == 2, budget
        assert image_plan("gemma-4-E4B-it", 768, 1024, max_soft_tokens=budget).patches == budget * 9
        assert image_plan("gemma-4-12B-it", 768, 1024, max_soft_tokens=budget).patches == budget
        needed.append(est.needed_tokens_per_request)
    assert needed == sorted(needed) and len(set(needed)) == 5
    assert estimate("gemma-4-E4B-it", device="L4").vision_tokens_per_image == \
        estimate("gemma-4-E4B-it", device="L4", max_soft_tokens=280).vision_tokens_per_image  # the default
    with pytest.raises(ValueError, match=r"max_soft_tokens must be one of \(70, 140, 280, 560, 1120\), got 100"):
        estimate("gemma-4-E4B-it", device="L4", max_soft_tokens=100)
    with pytest.raises(ValueError, match="max_soft_tokens is Gemma 4's soft-token budget per image; qwen2_5_vl has"):
        estimate("Qwen2.5-VL-3B-Instruct", device="L4", max_soft_tokens=280)



@pytest.mark.parametrize("layout", ["preprocessor_config.json", "processor_config.json"])
def test_a_checkpoints_saved_budget_sizes_every_gpu_plan(tmp_path, layout):
    """A checkpoint dir whose saved image processor sets max_soft_tokens: estimate and every row of gpus_needed (the
    VRAM tab's GPU table, which parses the config once) count its images at that budget, as HF's processor would."""
    import json

    from minivlm.budget import gpus_needed, load_model_preset
    config = {k: v for k, v in load_model_preset("gemma-4-E4B-it").items() if not k.startswith("_")}
    (tmp_path / "config.json").write_text(json.dumps(config))
    saved = {"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 70, "patch_size": 16,
             "pooling_kernel_size": 3}
    (tmp_path / layout).write_text(json.dumps(saved if layout.startswith("pre") else {"image_processor": saved}))
    hf = Gemma4ImageProcessorPil(resample=0)(images=[Image.new("RGB", (1024, 768))],
                                              max_soft_tokens=70)["num_soft_tokens_per_image"][0]
    assert estimate(str(tmp_path), device="L4", image_size=(1024, 768)).vision_tokens_per_image == hf
    plans = gpus_needed(str(tmp_path), image_size=(1024, 768))
    assert plans and {p.estimate.vision_tokens_per_image for p in plans} == {hf}
    assert hf != estimate("gemma-4-E4B-it", device="L4", image_size=(1024, 768)).vision_tokens_per_image

# ---- the engine's real allocation on the random Gemma 4 checkpoint -------------------------------------------------
def engine_missing() -> str:
    if importlib.util.find_spec("tools.make_checkpoint_gemma4") is None:
        return "tools/make_checkpoint_gemma4.py (the random Gemma 4 checkpoint) does not exist yet"
    from minivlm.families import FAMILIES
    if "gemma4" not in FAMILIES:
        return "minivlm.families has no gemma4 family: the engine cannot load Gemma 4 yet"
    from minivlm.model.cache_spec import KINDS
    if SHARED not in KINDS:
        return (f"minivlm/model/cache_spec.py has no {SHARED!r} kind yet: the engine would give Gemma 4's shared "
                "layers blocks of their own")
    return ""


@pytest.fixture(scope="module")
def gemma4_checkpoint(tmp_path_factory):
    if engine_missing():
        pytest.skip(engine_missing())
    make = importlib.import_module("tools.make_checkpoint_gemma4").make_gemma4_checkpoint
    return make(str(tmp_path_factory.mktemp("gemma4")))


def engine_report(path: str, **settings):
    from minivlm import Engine, EngineConfig
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", enforce_eager=True, **settings)) as engine:
        return engine.memory_report()


def test_calculator_equals_the_engines_allocation(gemma4_checkpoint):
    """Pinned blocks, then a budget that binds: the engine's pools per group (the shared layers' included, at 0
    bytes) are the calculator's, and so are the blocks, bytes, tokens and concurrency it reports; its weights are the
    predicted ones (float32: 4 B per parameter, the audio tower not loaded)."""
    settings = dict(block_size=4, max_num_seqs=3, max_model_len=256, enable_chunked_prefill=True,
                    max_num_batched_tokens=16)
    pinned = engine_report(gemma4_checkpoint, num_blocks=40, **settings)
    sizes = size_groups(layer_groups(gemma4_checkpoint), "float32", None, 4, 3, 16, True, 256, num_blocks=40)
    assert {g["kind"]: (g["size"], g["bytes"]) for g in pinned.groups if g["bytes"]} == \
        {g.shape.kind: (g.blocks, g.bytes) for g in sizes.groups if g.bytes}
    assert pinned.kv_cache_bytes == sizes.total_bytes and sizes.group(SHARED).bytes == 0
    shared = [g for g in pinned.groups if g["kind"] == SHARED]  # memory_report says the shared layers hold nothing
    assert len(shared) == 1 and shared[0]["bytes"] == 0
    assert tuple(shared[0]["layers"]) == sizes.group(SHARED).shape.layers
    config = hf_config(gemma4_checkpoint)

    def plan(budget):
        return estimate(config, dtype="float32", kv_dtype="float32", max_model_len=256, num_seqs=3,
                        max_num_batched_tokens=16, block_size=4, gpu_memory_utilization=1.0,
                        device_memory_bytes=budget, weights_bytes=pinned.weights_bytes, enable_chunked_prefill=True)
    first = plan(2 ** 40)
    # the weights it holds are the predicted ones: text + vision, the audio tower left out as counted
    assert (pinned.weights_bytes, pinned.vision_weights_bytes) == (first.predicted_weights_bytes,
                                                                   first.vision_weights_bytes)
    assert first.num_parameters - sum(audio_params(model_shape(config)).values()) == pinned.weights_bytes // 4
    budget = first.budget_bytes - first.usable_bytes + first.kv_groups.total_bytes // 2
    est, report = plan(budget), engine_report(gemma4_checkpoint, cpu_memory_budget_bytes=budget, **settings)
    assert 0 < est.num_blocks < first.num_blocks
    assert {g["kind"]: (g["size"], g["bytes"]) for g in report.groups if g["bytes"]} == \
        {g.shape.kind: (g.blocks, g.bytes) for g in est.kv_groups.groups if g.bytes}
    assert (report.num_blocks, report.kv_cache_bytes, report.kv_cache_tokens) == \
        (est.num_blocks, est.kv_cache_bytes, est.kv_pool_tokens)
    assert report.max_concurrency == pytest.approx(est.max_concurrency)


def test_the_vram_tab_shows_the_shared_layers_as_free():
    """The breakdown's shared-KV row is 0 GiB and the verdict names those layers as free, in English and Chinese;
    the picker lists every Gemma 4 preset."""
    from panels.i18n import EN, ZH
    from panels.vram import preset_choices
    from panels.vram_tables import breakdown_table, headline
    est = estimate("gemma-4-E2B-it", device="L4")
    for lang, item, group in ((EN, "KV cache: shared-KV layers (free)", "20 shared-KV layers (free"),
                              (ZH, "KV 缓存：共享 KV 层（不占内存）", "20 层共享 KV（不占内存")):
        table = breakdown_table(est, lang)
        row = table[table.iloc[:, 0] == item]
        assert len(row) == 1 and row.iloc[0, 1] == "0.000", lang
        assert group in headline(est, "L4", 8, lang)
    assert set(PRESETS) <= {value for _, value in preset_choices()}
