"""Fault containment: a fault at any stage of a step fails exactly the requests it touched; a dead loop errors
every waiting caller at once; nobody ever waits forever, and no block stays referenced."""
import threading
import time

import pytest
from PIL import Image

from minivlm import Engine, EngineConfig, Request, RequestFailed, SamplingParams
from tests.faults import STAGES, inject

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)


def image(i: int) -> Image.Image:
    img = Image.new("RGB", (64 + 8 * i, 64), (235, 235, 235))
    img.paste((40 * i % 255, 90, 200), (16, 16, 40, 40))
    return img


def others() -> list[Request]:
    return [Request(prompt=f"Describe picture {i}.", images=[image(i)], request_id=f"other-{i}") for i in range(8)]


@pytest.fixture(scope="module")
def engine(checkpoints):
    with Engine(EngineConfig(model=checkpoints["qwen3_vl"], num_blocks=256, max_model_len=512)) as e:
        yield e


@pytest.fixture(scope="module")
def expected(engine):
    """Tokens of the eight requests and of the follow-up, fault-free."""
    return [o.token_ids for o in engine.generate(others() + [follow_up()], PARAMS)]


def follow_up():
    return Request(prompt="Describe picture 9.", images=[image(9)], request_id="after")


def stream_all(engine, requests, started: threading.Barrier) -> dict:
    """Stream each request from its own thread; per request: tokens, longest wait for an event, error."""
    results = {}

    def run(req):
        tokens, longest, last, error = [], 0.0, time.monotonic(), None
        gen = engine.stream(req, PARAMS, snapshots=False)
        try:
            for i, ev in enumerate(gen):
                now = time.monotonic()
                longest, last = max(longest, now - last), now
                if i == 0:
                    started.wait(timeout=30)
                if ev.finished:
                    tokens = ev.output.token_ids
        except Exception as e:
            error = e
        results[req.request_id] = (tokens, longest, error)

    threads = [threading.Thread(target=run, args=(r,)) for r in requests]
    [t.start() for t in threads]
    return results, threads


@pytest.mark.parametrize("stage", STAGES)
def test_a_fault_fails_only_the_request_it_touched(engine, expected, monkeypatch, stage):
    inject(monkeypatch, engine, stage, lambda rid: rid.startswith("victim"))
    started = threading.Barrier(9)
    results, threads = stream_all(engine, others(), started)
    started.wait(timeout=30)  # all eight are decoding
    victim = Request(prompt="Describe the victim picture.", images=[image(11)], request_id="victim")
    t0 = time.monotonic()
    with pytest.raises(RequestFailed, match=f"during {stage}") as failure:
        list(engine.stream(victim, PARAMS, snapshots=True))
    raised_after = time.monotonic() - t0
    [t.join(timeout=60) for t in threads]
    assert failure.value.stage == stage and failure.value.request_id == "victim"
    assert raised_after < 1.0, f"the faulted request raised after {raised_after:.2f}s"
    for i in range(8):
        tokens, longest, error = results[f"other-{i}"]
        assert error is None and tokens == expected[i], f"other-{i} was disturbed by a fault in {stage}"
        assert longest < 5.0, f"other-{i} waited {longest:.1f}s for an event"
    snap = engine.snapshot()
    assert not snap.block_tables and all(b.ref_count == 0 for b in snap.blocks)
    monkeypatch.undo()
    assert engine.generate(follow_up(), PARAMS).token_ids == expected[8]
    print(f"{stage}: victim raised after {raised_after * 1000:.0f} ms; longest wait of the others "
          f"{max(r[1] for r in results.values()) * 1000:.0f} ms")


def test_a_dead_loop_errors_every_waiting_caller_at_once_and_the_next_submission_restarts_it(engine, expected,
                                                                                            monkeypatch):
    started = threading.Barrier(9)
    real_step, die, died = engine.core.step, threading.Event(), []

    def dies_once(new, aborts=frozenset()):
        if die.is_set() and not died:
            died.append(time.monotonic())
            raise SystemError("the loop itself broke")  # outside every stage guard
        return real_step(new, aborts)
    monkeypatch.setattr(engine.core, "step", dies_once)
    results, threads = stream_all(engine, others(), started)
    started.wait(timeout=30)  # all eight are decoding
    die.set()
    [t.join(timeout=60) for t in threads]
    heard = time.monotonic()
    assert all(isinstance(r[2], RuntimeError) and "loop stopped" in str(r[2]) for r in results.values())
    assert heard - died[0] < 1.0, f"the callers heard {heard - died[0]:.2f}s after the loop died"
    snap = engine.snapshot()
    assert not snap.block_tables and all(b.ref_count == 0 for b in snap.blocks)
    assert engine.generate(follow_up(), PARAMS).token_ids == expected[8]  # a fresh loop serves it


def test_a_caller_never_hangs_on_a_loop_that_died_silently(engine, monkeypatch):
    """Even if the loop dies without telling anyone, a waiting caller finds out (it polls the loop's life)."""
    monkeypatch.setattr(engine.loop, "_died", lambda error: None)
    monkeypatch.setattr(engine.core, "step", lambda new, aborts: (_ for _ in ()).throw(SystemError("silent death")))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="loop is not running"):
        engine.generate(follow_up(), PARAMS)
    assert time.monotonic() - t0 < 5.0
    monkeypatch.undo()


def test_resubmitting_the_same_request_object_concurrently_is_safe(engine, expected):
    req = follow_up()
    outs = [None] * 6

    def run(i):
        outs[i] = engine.generate(req, PARAMS)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    [t.start() for t in threads]
    [t.join(timeout=60) for t in threads]
    assert all(o is not None and o.token_ids == expected[8] for o in outs)
    assert not engine.has_unfinished()
