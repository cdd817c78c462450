"""Chunked prefill's adaptive token budget (minivlm/engine/scheduling/step_budget.py): the engine measures what a decode step
and a prompt token cost and sizes each mixed step's chunk so the step stays within `max_step_slowdown` x a decode
step. The truth: a forward whose cost we set (a known time per step and per prompt token) gives a known budget;
the tokens stay those of the unchunked engine."""
import math

import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.config import DEFAULT_STEP_SLOWDOWN
from minivlm.engine.scheduling.step_budget import AdaptiveTokenBudget
from minivlm.experiments.mm_cache import BLUE, shape_image
from panels.decisions import decision_log
from panels.i18n import EN, ZH

BS = 8
STEP_S, TOKEN_S = 0.040, 0.004   # the cost we give the forward: per step, and per prompt token on top


def budget(decode_s: float, extras: dict[int, list[float]]) -> AdaptiveTokenBudget:
    b = AdaptiveTokenBudget(slowdown=1.5, ceiling=512)
    for s in (5.0, decode_s):  # a shape's first step pays one-time kernel setup: not measured
        b.observe(4, 0, s)
    for n, xs in extras.items():
        b.observe(4, n, 5.0)  # a size's first step pays one-time kernel setup: not measured
        for x in xs * AdaptiveTokenBudget.SAMPLES if len(xs) == 1 else xs:
            b.observe(4, n, decode_s + x)
        b.observe(4, 0, decode_s)  # a decode-only step now and then keeps the decode time fresh
    return b


def test_the_budget_follows_the_measured_costs():
    b = AdaptiveTokenBudget(slowdown=1.5, ceiling=512)
    assert b.decide(4).prompt_tokens == AdaptiveTokenBudget.START  # nothing measured yet: a few
    assert b.decide(0).prompt_tokens == 512                        # no stream to protect: the whole ceiling
    d = budget(0.020, {8: [0.010]}).decide(4)   # one size seen: all of its 10 ms is per token
    assert (d.decode_ms, d.fixed_ms, d.token_ms, d.prompt_tokens) == (20.0, 0.0, pytest.approx(1.25), 8)
    d = budget(0.020, {4: [0.006], 12: [0.010]}).decide(4)  # a line: 4 ms whatever the chunk, then 0.5 ms a token
    assert (d.fixed_ms, d.token_ms, d.prompt_tokens) == (pytest.approx(4.0), pytest.approx(0.5), 8)  # 12 fit: 8, a power of two
    d = budget(0.020, {4: [0.006], 8: [0.012], 12: [0.010]}).decide(4)  # 8 itself measured over the 10 ms
    assert (d.fixed_ms, d.token_ms, d.prompt_tokens) == (pytest.approx(16 / 3), pytest.approx(0.5), 4)  # line: 8; 4
    d = budget(0.020, {2: [0.012], 10: [0.016]}).decide(4)  # the fixed 11 ms alone is over the 10 ms allowed
    assert (d.fixed_ms, d.prompt_tokens) == (pytest.approx(11.0), 16)  # then chunks of fixed / per token (22 → 16)
    b = budget(0.020, {8: [0.010, 0.500, 0.010]})   # a step that met a busy core: the median ignores it
    assert b.decide(4).prompt_tokens == 8 and b.decide(30).prompt_tokens == 8
    assert b.decide(509).prompt_tokens == 3         # never past the step's ceiling of 512 tokens
    b.observe(0, 100, 9.0)                          # a prefill-only step says nothing about the streams
    assert b.decide(4).prompt_tokens == 8
    slow = budget(0.020, {8: [0.400]})              # a prompt token costs 50 ms: one token a step
    assert slow.decide(4).prompt_tokens == 1


def test_config():
    cfg = EngineConfig(enable_chunked_prefill=True)
    assert (cfg.max_step_slowdown, cfg.max_num_batched_tokens) == (DEFAULT_STEP_SLOWDOWN, 512)
    assert EngineConfig(enable_chunked_prefill=True, max_num_batched_tokens=64).max_step_slowdown is None  # pinned
    assert EngineConfig().max_step_slowdown is None
    with pytest.raises(ValueError, match="needs enable_chunked_prefill"):
        EngineConfig(max_step_slowdown=2.0)
    for bad in (1, 0.5, "2", True):
        with pytest.raises(ValueError, match=r"max_step_slowdown must be a number in \(1, 100\]"):
            EngineConfig(enable_chunked_prefill=True, max_step_slowdown=bad)


def costed(eng: Engine):
    """Give the engine a clock on which its forward costs STEP_S per step plus TOKEN_S per prompt token (the
    costs the budget measures are then known exactly, whatever else the machine is doing)."""
    forward, now = eng.core.runner.forward, [0.0]

    def timed(plan, *args):
        now[0] += STEP_S + TOKEN_S * sum(r.end - r.start for r in plan if r.kind != "decode")
        return forward(plan, *args)
    eng.core.runner.forward = timed
    eng.core.clock = lambda: now[0]


def test_mixed_steps_take_what_the_slowdown_allows_and_tokens_do_not_change(checkpoints):
    """Two streams decode while a 448x448-image prompt (271 tokens) arrives: once the costs are measured, every
    mixed step's chunk is (slowdown - 1) x 40 ms / 4 ms tokens as a power of two (the default 1.3: 3 tokens, so 2),
    the budget is in the step's `scheduled` event, and the tokens equal the unchunked engine's."""
    long = Request(prompt="Describe.", images=[shape_image(BLUE, size=(448, 448))], request_id="long")
    streams = [Request(prompt=f"Count from one to {n}.", request_id=f"s{n}") for n in (9, 20)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    cfg = dict(model=checkpoints["qwen3_vl"], block_size=BS, dtype="float32", device="cpu", max_model_len=1024,
               num_blocks=160)
    with Engine(EngineConfig(**cfg)) as eng:
        expected = {o.request_id: o.token_ids for o in eng.generate(streams + [long], params)}
    with Engine(EngineConfig(**cfg, enable_chunked_prefill=True, event_log_size=100_000)) as eng, eng.loop.lock:
        costed(eng)
        core, got = eng.core, {}
        running = [eng.make_sequence(r, SamplingParams(max_tokens=200, ignore_eos=True)) for r in streams]
        core.step(running)
        for _ in range(6):                # decode-only steps: the decode cost is measured
            core.step([])
        x = eng.make_sequence(long, params)
        new = [x]
        while x.finish_reason is None:
            core.step(new)
            new = []
        chunks = [ev.num_scheduled_tokens["long"] for ev in core.events.since(0)
                  if ev.kind == "scheduled" and ev.step_kind == "mixed" and "long" in ev.num_scheduled_tokens]
        budgets = [ev.budget for ev in core.events.since(0) if ev.kind == "scheduled" and ev.step_kind == "mixed"]
        logs = {lang: decision_log(core.events.since(0), max_steps=10_000, lang=lang) for lang in (EN, ZH)}
        got["long"] = x.output_ids
    first = 2 + AdaptiveTokenBudget.SAMPLES  # at the first size: the image's encode step and the shape's first step
    # are not measured, then SAMPLES steps are
    assert chunks[:first] == [AdaptiveTokenBudget.START] * first, chunks
    settled = chunks[first:-1]             # then adapted, before the prompt's last piece
    fits = (DEFAULT_STEP_SLOWDOWN - 1) * STEP_S / TOKEN_S
    assert settled and set(settled) == {2 ** int(math.log2(fits))} != {AdaptiveTokenBudget.START}, chunks
    assert all(b["slowdown"] == DEFAULT_STEP_SLOWDOWN and b["decode_ms"] >= 1e3 * STEP_S for b in budgets[1:])
    assert (budgets[-1]["fixed_ms"], budgets[-1]["token_ms"]) == (0, pytest.approx(1e3 * TOKEN_S))  # found
    assert got["long"] == expected["long"]
    last = budgets[-1]  # the KV tab's decision log says each mixed step's budget and why, in either language
    assert (f"budget: up to {last['prompt_tokens']} prompt tokens beside the decodes (a decode step "
            f"{last['decode_ms']:.1f} ms, a mixed step's extra {last['fixed_ms']:.1f} ms + {last['token_ms']:.2f} ms a "
            f"prompt token; mixed steps at most {DEFAULT_STEP_SLOWDOWN}x a decode step)") in logs[EN]
    assert f"budget: up to {AdaptiveTokenBudget.START} prompt tokens beside the decodes (nothing measured yet: a few " \
        "tokens to start)" in logs[EN]
    assert f"预算：除解码外最多 {last['prompt_tokens']} 个提示 token（解码步 {last['decode_ms']:.1f} ms" in logs[ZH]


def test_chunks_stay_within_the_c_layers_rows_and_the_decode_time_is_measured_again():
    b = budget(0.020, {4: [0.002], 12: [0.006]})  # 0.5 ms a token, nothing fixed: 20 tokens fit, 16 as a power of two
    assert b.decide(4).prompt_tokens == 16
    b.fast_rows = 16                               # the C layer takes 16 rows in one call: 4 decodes + 8 tokens
    assert [b.decide(n).prompt_tokens for n in (4, 9, 14, 16)] == [8, 4, 2, 16]  # 16 decodes: off the C layer anyway
    for _ in range(AdaptiveTokenBudget.REFRESH + 1):  # mixed steps in a row (the first of a shape is not measured)
        b.observe(4, 8, 0.024)
    d = b.decide(4)                                # then one decode-only step measures the decode time again
    assert (d.prompt_tokens, d.remeasure, d.to_dict()["remeasure"]) == (0, True, True)
    b.observe(4, 0, 0.030)
    assert not b.decide(4).remeasure and b.decide(4).prompt_tokens == 8


def test_what_a_step_leaves_the_sliced_tower():
    b = budget(0.020, {8: [0.010]})
    assert b.left_after(4, 0.022) == pytest.approx(0.008)  # 1.5 x 20 ms, less the step's own 22 ms
    assert b.left_after(4, 0.0295) == 0.0                   # 0.5 ms: not worth waking the tower for
    assert b.left_after(0, 5.0) == AdaptiveTokenBudget.IDLE_SLICE_S  # no stream decoding: a fixed slice
    assert AdaptiveTokenBudget(1.5, 512).left_after(4, 0.01) == 0.0  # no decode step measured yet
