"""The wall-clock timeline (minivlm/views/timeline.py) on a running engine whose clock the test drives: every forward
takes exactly FORWARD s and the test lets GAP s pass between steps, so every step's start and end is known in
advance. Each span, token time and latency is checked against those times, and the percentiles against numpy's."""
import numpy as np
import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.views.timeline import percentile, timeline

FORWARD, GAP = 0.010, 0.001
STEP = FORWARD + GAP  # step k starts at (k - 1) * STEP and ends FORWARD later


class Clock:
    """The engine's clock: time moves only when a forward runs or the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def start(k: int) -> float:
    return (k - 1) * STEP


def end(k: int) -> float:
    return start(k) + FORWARD


def driven(**kw) -> tuple[Engine, Clock]:
    engine = Engine(EngineConfig(device="cpu", dtype="float32", max_model_len=512, **kw))
    clock = Clock()
    engine.core.clock = clock
    runner = engine.core.runner
    forward = runner.forward

    def timed_forward(*a, **k):  # the step's work takes FORWARD s of the engine's clock
        clock.now += FORWARD
        return forward(*a, **k)
    runner.forward = timed_forward
    engine.pause()
    return engine, clock


def step(engine: Engine, clock: Clock):
    engine.step()
    clock.now += GAP


def run_until_done(engine, clock, handles):
    while not all(h.finished for h in handles):
        step(engine, clock)
        for h in handles:
            while h.get(0) is not None:
                pass


PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)


def test_spans_tokens_and_latencies_are_the_clock_s_step_times():
    """Two requests prefill together in step 1; a third arrives before step 2 and prefills alone (no chunked
    prefill: the others wait); then every step decodes all three, and all finish in step 4."""
    engine, clock = driven(num_blocks=64)
    with engine:
        a, b = (engine.submit(Request(prompt=p, request_id=r), PARAMS) for p, r in (("Hello there", "a"),
                                                                                   ("Count to five", "b")))
        step(engine, clock)
        c = engine.submit(Request(prompt="A third question, a little longer than the rest", request_id="c"), PARAMS)
        run_until_done(engine, clock, [a, b, c])
        tl = timeline(engine.events())
    ra, rc = tl.requests["a"], tl.requests["c"]
    assert [s.step for s in tl.steps] == [1, 2, 3, 4]
    for s in tl.steps:
        assert (s.started, s.planned, s.ended) == pytest.approx((start(s.step), start(s.step), end(s.step)))
    assert [s.kind for s in tl.steps] == ["prefill", "prefill", "decode", "decode"]
    assert [(s.kind, s.steps) for s in ra.spans] == [("queue", ()), ("prefill", (1,)), ("decode", (3,)),
                                                      ("decode", (4,))]
    assert [(s.kind, s.steps) for s in rc.spans] == [("queue", ()), ("prefill", (2,)), ("decode", (3,)),
                                                      ("decode", (4,))]
    # flat list: pytest 9.2's approx refuses nested tuples
    assert [t for s in ra.spans for t in (s.start, s.end)] == pytest.approx([0, 0, 0, end(1), start(3), end(3),
                                                                               start(4), end(4)])
    assert ra.token_times == pytest.approx([end(1), end(3), end(4)])
    assert rc.arrived == pytest.approx(start(2)) and rc.token_times == pytest.approx([end(2), end(3), end(4)])
    assert ra.ttft == pytest.approx(FORWARD) and rc.ttft == pytest.approx(FORWARD)
    assert ra.itl == pytest.approx([2 * STEP, STEP]) and rc.itl == pytest.approx([STEP, STEP])
    assert ra.e2e == pytest.approx(end(4)) and rc.e2e == pytest.approx(end(4) - start(2))
    assert ra.queue_time == 0 and ra.finish_reason == "length" and ra.finished_step == 4
    assert ra.mean_itl == pytest.approx(1.5 * STEP) and ra.p99_itl == pytest.approx(np.percentile(ra.itl, 99))
    run = tl.summary()
    itl = [2 * STEP, STEP] * 2 + [STEP, STEP]
    for q in (50, 90, 99):
        assert run["itl"][f"p{q}"] == pytest.approx(np.percentile(itl, q))
        assert run["e2e"][f"p{q}"] == pytest.approx(np.percentile([end(4)] * 2 + [end(4) - start(2)], q))
    assert run["ttft"]["mean"] == pytest.approx(FORWARD) and run["itl"]["count"] == 6
    assert run["step"]["mean"] == pytest.approx(FORWARD)
    assert run["tokens"] == 9 and run["tokens_per_s"] == pytest.approx(9 / end(4))


def test_chunks_at_the_budget_s_edges_and_decodes_beside_them():
    """A 16-token budget: a running request decodes while a longer prompt is prefilled in chunks of what the budget
    leaves (15, then 15, ...); each chunk is one span of its step with its token count, the last one samples."""
    engine, clock = driven(num_blocks=64, enable_chunked_prefill=True, max_num_batched_tokens=16)
    with engine:
        short = engine.submit(Request(prompt="Hi", request_id="short"), SamplingParams(max_tokens=20, ignore_eos=True))
        step(engine, clock)
        long = engine.submit(Request(prompt="Please describe " + "a very long and winding road " * 4,
                                     request_id="long"), PARAMS)
        run_until_done(engine, clock, [short, long])
        outs = {h.request_id: h for h in (short, long)}
        tl = timeline(engine.events())
    plans = {e.step: e for e in engine.events() if e.kind == "scheduled"}
    rl = tl.requests["long"]
    chunks = [s for s in rl.spans if s.kind in ("chunk", "prefill")]
    n_prompt = next(e for e in engine.events() if e.kind == "arrived" and e.request_id == "long").num_prompt_tokens
    assert sum(s.tokens for s in chunks) == n_prompt and len(chunks) >= 2
    assert all(s.tokens <= 15 for s in chunks)  # the budget less the decode beside it
    for s in chunks:
        (k,) = s.steps
        assert (s.start, s.end) == pytest.approx((start(k), end(k)))
        assert plans[k].num_scheduled_tokens["long"] == s.tokens and plans[k].step_kind == "mixed"
        assert "short" in plans[k].request_ids  # the running stream kept decoding beside every chunk
    assert rl.token_times[0] == pytest.approx(end(chunks[-1].steps[0]))  # the last chunk samples the first token
    assert rl.ttft == pytest.approx(end(chunks[-1].steps[0]) - start(2))
    assert len(tl.requests["short"].token_times) == 20 and outs["short"].finished


def test_preempted_span_runs_from_the_preemption_to_its_next_step():
    """A pool too small for both: the newest request is preempted, waits, and computes again later."""
    engine, clock = driven(num_blocks=10, block_size=8, max_num_seqs=2)
    with engine:
        params = SamplingParams(max_tokens=20, ignore_eos=True)
        hs = [engine.submit(Request(prompt="Tell me about the sea and the sky", request_id=r), params) for r in "xy"]
        run_until_done(engine, clock, hs)
        tl = timeline(engine.events())
        lost = [e for e in engine.events() if e.kind == "preempted"]
    assert lost, "the pool was meant to run out"
    for ev in lost:
        r = tl.requests[ev.request_id]
        span = next(s for s in r.spans if s.kind == "preempted" and s.steps[0] == ev.step)
        back = next(s for s in r.spans if s.start > span.start and s.kind != "preempted")
        assert span.start == pytest.approx(start(ev.step)) and span.end == pytest.approx(back.start)
        assert back.start == pytest.approx(start(back.steps[0])) and back.steps[0] == span.steps[-1] + 1
    for r in tl.requests.values():
        assert len(r.token_times) == 20 and r.finish_reason == "length"
        assert all(b.start >= a.end - 1e-12 for a, b in zip(r.spans, r.spans[1:]))  # spans never overlap


def test_a_speculating_step_delivers_its_accepted_guesses_with_its_own_token():
    engine, clock = driven(num_blocks=64, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                              "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    with engine:
        h = engine.submit(Request(prompt="one two three one two three one two three one two", request_id="s"),
                          SamplingParams(max_tokens=24, ignore_eos=True))
        out = None
        while out is None:
            step(engine, clock)
            while (ev := h.get(0)) is not None:
                out = ev.output if ev.finished else None
        tokens = len(out.token_ids)
        tl = timeline(engine.events())
        verdicts = {e.step: e.accepted for e in engine.events() if e.kind == "speculated"}
    r = tl.requests["s"]
    assert len(r.token_times) == tokens == 24
    decodes = [s for s in r.spans if s.kind == "decode"]
    for s in decodes:
        assert s.accepted == verdicts.get(s.steps[0], 0) and s.tokens == 1 + s.accepted
    assert sum(verdicts.values()) > 0, "the prompt was meant to be guessed from"
    assert sum(g == 0 for g in r.itl) == sum(verdicts.values())  # guesses arrive with their step's token


def test_percentile_is_numpy_s_linear_one_and_empty_is_none():
    xs = [0.3, 0.01, 0.2, 0.05, 0.07]
    for q in (0, 25, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert percentile([], 50) is None and percentile([4.0], 99) == 4.0


def test_arrival_is_when_the_request_reached_the_engine_not_its_admission():
    """A request that waits in the engine's inbox (a step was running) has that wait in its queue span and TTFT."""
    engine, clock = driven(num_blocks=64)
    with engine:
        h = engine.submit(Request(prompt="Hello", request_id="late"), PARAMS)
        clock.now += 0.004  # the step it waits for
        run_until_done(engine, clock, [h])
        r = timeline(engine.events()).requests["late"]
    assert r.arrived == 0 and (r.spans[0].kind, r.spans[0].start, r.spans[0].end) == ("queue", 0, 0.004)
    assert r.queue_time == pytest.approx(0.004) and r.ttft == pytest.approx(0.004 + FORWARD)
