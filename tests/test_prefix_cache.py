"""Strategies A / B / C in the engine's real KV loop: false hits happen for real under A and B, never under C."""
import pytest
import torch

from minivlm import Request, SamplingParams
from minivlm.views.cache_study import compare_strategies
from minivlm.experiments.mm_cache import BLUE, Q, RED, cases, shape_image

CASES = cases()


@pytest.fixture(scope="module")
def results(engines):
    return {name: {r.strategy: r for r in compare_strategies(engines["qwen3_vl"], *pair)}
            for name, pair in CASES.items()}


def test_strategy_c_reuse_gives_exactly_the_cold_run(results):
    """Whatever C reuses must be what the request would compute: same tokens and logprobs as a run with no cache."""
    for name, per in results.items():
        c = per["C"]
        assert c.second.token_ids == c.cold.token_ids, name
        assert c.max_logprob_diff < 1e-4, f"{name}: C reused K/V that moved logprobs by {c.max_logprob_diff}"
    for name in ("2 identical request", "3 same image, different text"):
        assert results[name]["C"].hits > 0, f"{name}: C must reuse the identical blocks"


def test_strategy_a_false_hits_on_a_different_image(results):
    a = results["1 same text, different image"]["A"]
    assert a.false_hits > 0 and a.max_logprob_diff > 1e-3  # it really reused the other image's KV
    for per in results.values():  # wherever the C truth differs, A reports it
        assert per["A"].false_hits >= per["B"].false_hits >= per["C"].false_hits


def test_strategy_b_false_hits_on_a_resize_but_not_on_a_different_image(results):
    assert results["4 same image, different resize"]["B"].false_hits > 0
    assert results["1 same text, different image"]["B"].false_hits == 0
    assert results["5 two images swapped"]["B"].false_hits == 0


def test_true_hit_kv_is_identical_to_recomputed_kv(engines):
    with engines["qwen3_vl"].isolated(cache_strategy="C", num_blocks=64) as engine:
        req = Request(prompt=Q, images=[shape_image(RED)])
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        first_table = next(iter(engine.stream(req, params))).snapshot.block_tables
        table = list(first_table.values())[0]
        n_full = engine.generate(req, params).num_cached_tokens // engine.config.block_size
        assert n_full > 0
        cached_kv = engine.core.pool.kv_cache[:, :, table[:n_full]].clone()
        engine.reset_prefix_cache()
        fresh = next(iter(engine.stream(req, params))).snapshot.block_tables
        recomputed = engine.core.pool.kv_cache[:, :, list(fresh.values())[0][:n_full]]
        assert torch.allclose(cached_kv, recomputed, atol=1e-6, rtol=0)


def test_salts_isolate_and_same_salt_shares(engines):
    with engines["qwen3_vl"].isolated(cache_strategy="C", num_blocks=64) as engine:
        params = SamplingParams(max_tokens=2)
        img = shape_image(BLUE)
        engine.generate(Request(prompt=Q, images=[img], cache_salt="alice"), params)
        bob = engine.generate(Request(prompt=Q, images=[img], cache_salt="bob"), params)
        alice = engine.generate(Request(prompt=Q, images=[img], cache_salt="alice"), params)
        assert bob.num_cached_tokens == 0 and not bob.cache_hits
        assert alice.num_cached_tokens > 0


@pytest.mark.parametrize("strategy", ["A", "B"])
def test_salt_isolates_under_every_strategy(engines, strategy):
    with engines["qwen3_vl"].isolated(cache_strategy=strategy, num_blocks=64) as engine:
        params = SamplingParams(max_tokens=2)
        engine.generate(Request(prompt=Q, images=[shape_image(RED)], cache_salt="s1"), params)
        other = engine.generate(Request(prompt=Q, images=[shape_image(BLUE)], cache_salt="s2"), params)
        assert not other.cache_hits


def test_repeated_image_skips_the_vision_tower(engines, monkeypatch):
    with engines["qwen3_vl"].isolated(cache_strategy="none", num_blocks=64) as engine:
        calls = []
        real = engine.model.vision.encode
        monkeypatch.setattr(engine.model.vision, "encode", lambda *a: calls.append(1) or real(*a))
        img = shape_image(RED)
        engine.generate(Request(prompt=Q, images=[img]), SamplingParams(max_tokens=2))
        engine.generate(Request(prompt="What shape is it?", images=[img.copy()]), SamplingParams(max_tokens=2))
        assert len(calls) == 1 and engine.encoder_cache_stats()["hits"] == 1


@pytest.mark.parametrize("async_vision", [False, True], ids=["in-step", "async-vision"])
def test_vision_cache_entries_are_per_salt(engines, monkeypatch, async_vision):
    """#24 item 5: user B sending user A's image runs the tower again (no timing side channel through the vision
    cache); the same salt still reuses its own entry."""
    with engines["qwen3_vl"].isolated(cache_strategy="none", num_blocks=64, async_vision=async_vision) as engine:
        calls = []
        real = engine.model.vision.encode
        monkeypatch.setattr(engine.model.vision, "encode", lambda *a: calls.append(1) or real(*a))
        img, params = shape_image(RED), SamplingParams(max_tokens=2)
        engine.generate(Request(prompt=Q, images=[img], cache_salt="session:a"), params)
        engine.generate(Request(prompt=Q, images=[img], cache_salt="session:b"), params)
        stats = engine.encoder_cache_stats()
        assert len(calls) == 2 and stats["hits"] == 0 and stats["entries"] == 2
        engine.generate(Request(prompt=Q, images=[img], cache_salt="session:a"), params)
        assert len(calls) == 2 and engine.encoder_cache_stats()["hits"] == 1
        engine.generate(Request(prompt=Q, images=[img]), params)  # unsalted: its own entry too
        assert len(calls) == 3 and engine.encoder_cache_stats()["hits"] == 1


def test_shipped_model_answers_red_for_blue_under_a_only():
    """The lesson with a model that really sees: a false hit hands the blue circle the red circle's KV."""
    from minivlm import Engine, EngineConfig
    with Engine(EngineConfig(device="cpu", num_blocks=64)) as engine:
        first = Request(prompt=Q, images=[shape_image(RED)])
        second = Request(prompt=Q, images=[shape_image(BLUE)])
        per = {r.strategy: r for r in compare_strategies(engine, first, second, num_blocks=64)}
    assert per["A"].first.text.strip() == "red" and per["A"].cold.text.strip() == "blue"
    assert per["A"].false_hits > 0 and per["A"].second.text.strip() == "red"
    assert per["B"].second.text.strip() == "blue" and per["C"].second.text.strip() == "blue"
    assert per["B"].false_hits == per["C"].false_hits == 0
