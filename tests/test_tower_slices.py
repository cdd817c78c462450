"""The sliced vision tower (async_vision with chunked prefill's adaptive budget): the tower runs only in the time the
step thread lends it between steps, stopping at module and attention boundaries. The truths: its output equals the
same tower run whole (transformers' module), it runs only while lent (never during a step, never after a lend has
returned, never while the engine is paused), it moves forward one slice at a time, closing the engine ends a parked
job, and the engine's tokens equal those of the engine with the tower in the step."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.experiments.mm_cache import GREEN, shape_image
from minivlm.engine.encoder.vision_worker import VisionWorker
from minivlm.model import tower_boundaries
from minivlm.views.events import describe
from panels.i18n import ZH
from panels.i18n.events import describe_in
from tests.test_chunked_prefill import PARAMS, assert_same, engine, path, requests, unchunked  # noqa: F401

SLICED = dict(enable_chunked_prefill=True, async_vision=True)  # no token budget given: the adaptive one


def tower_activity(module, thread_name: str) -> list[float]:
    """Times at which the named thread entered any module of the tower (removed with the returned list's owner)."""
    times = []

    def hook(*_):
        if threading.current_thread().name.startswith(thread_name):
            times.append(time.perf_counter())
    handles = [m.register_forward_pre_hook(hook) for m in module.modules()]
    return times, handles


def test_sliced_attention_equals_one_sdpa_call():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 3, 700, 16) for _ in range(3))
    module = SimpleNamespace(is_causal=False)
    whole = sdpa_attention_forward(module, q, k, v, None, scaling=0.25)[0]
    stops = []
    with tower_boundaries.pausable(lambda unit: stops.append(unit)):
        sliced = tower_boundaries.sliced_sdpa(module, q, k, v, None, scaling=0.25)[0]
    assert len(stops) == -(-700 // tower_boundaries.QUERY_ROWS)  # 700 query rows: a boundary before each slice
    torch.testing.assert_close(sliced, whole, rtol=0, atol=1e-6)
    assert tower_boundaries.sliced_sdpa(module, q, k, v, None, scaling=0.25)[0].equal(whole)  # no pause: one call
    causal = SimpleNamespace(is_causal=True)  # a causal attention is never split by query rows (its mask is implied)
    with tower_boundaries.pausable(lambda unit: stops.append(unit)):
        got = tower_boundaries.sliced_sdpa(causal, q, k, v, None, scaling=0.25, is_causal=None)[0]
    assert len(stops) == -(-700 // tower_boundaries.QUERY_ROWS) + 1 and got.equal(sdpa_attention_forward(causal, q, k, v, None, scaling=0.25)[0])


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "smolvlm", "internvl"])
def test_every_family_s_tower_passes_its_boundaries_and_gives_the_same_output(name, request, monkeypatch):
    """Full attention (Qwen2-VL), windows (Qwen2.5-VL), SigLIP with its patch mask (SmolVLM), InternViT's crops."""
    engine = request.getfixturevalue("matrix_engines" if name in ("smolvlm", "internvl") else "engines")[name]
    seq = engine.make_sequence(Request(prompt="Describe it.", images=[shape_image(GREEN, size=(224, 160))]), PARAMS)
    pixels, layout = engine.core.runner._pixels(engine.core.image_inputs[seq], [0])
    vision = engine.core.runner.vision
    [(whole, whole_deep)] = vision.encode(pixels, layout)
    monkeypatch.setattr(tower_boundaries, "QUERY_ROWS", 16)  # every long attention call in many pieces
    stops = []
    with tower_boundaries.pausable(lambda unit: stops.append(unit)):
        [(sliced, sliced_deep)] = vision.encode(pixels, layout)
    assert len(stops) > len(list(vision.module.modules()))  # every module, and attention's pieces on top
    torch.testing.assert_close(sliced, whole, rtol=0, atol=1e-5)
    for a, b in zip(sliced_deep, whole_deep, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_a_sliced_tower_equals_the_whole_one_and_runs_only_while_lent(path):
    with engine(path, None) as eng:
        vision = eng.core.runner.vision
        seq = eng.make_sequence(requests()[4], PARAMS)
        pixels, grids = eng.core.runner._pixels(eng.core.image_inputs[seq], [0])
        expected = vision.encode(pixels, grids)
        worker = VisionWorker(vision, sliced=True)
        activity, handles = tower_activity(vision.module, "minivlm-vision")
        try:
            future = worker.start(pixels, grids)
            time.sleep(0.2)
            assert not activity and not future.done()  # nothing lent: the tower has not started
            lends = 0
            while not future.done():
                worker.lend(0.002)
                lends += 1
                ran = len(activity)
                time.sleep(0.01)
                assert len(activity) == ran or future.done()  # parked as soon as the lend returned
            (embeds, deep), = future.result()[0]
            seconds, slices = future.result()[1:]
        finally:
            worker.close()
            for h in handles:
                h.remove()
    assert 3 < slices <= lends and 0 < seconds  # a lend the thread did not wake up for in time is not a slice
    torch.testing.assert_close(embeds, expected[0][0], rtol=0, atol=1e-5)
    for a, b in zip(deep, expected[0][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_the_engine_lends_the_tower_only_time_between_steps(path, unchunked):
    with engine(path, None, **SLICED) as eng:
        worker = eng.core.vision_worker
        assert worker.sliced and eng.config.max_step_slowdown is not None
        activity, handles = tower_activity(worker.vision.module, "minivlm-vision")
        steps, step = [], eng.core.step

        def timed(*args):
            start = time.perf_counter()
            try:
                return step(*args)
            finally:
                steps.append((start, time.perf_counter()))
        eng.core.step = timed
        try:
            outs = eng.generate(requests(), PARAMS)
        finally:
            for h in handles:
                h.remove()
    assert_same(unchunked, outs)
    assert activity and steps
    inside = [t for t in activity if any(a < t < b for a, b in steps)]
    assert not inside, f"{len(inside)} of the tower's {len(activity)} module calls ran during a step"
    encoded = [ev for ev in eng.events() if ev.kind == "vision_encoded"]
    assert len(encoded) == 5 and all(ev.slices >= 1 and ev.seconds > 0 for ev in encoded)
    ev = encoded[0]  # the decision log says it, in both languages
    assert f"the tower ran in {ev.slices} slices lent between steps" in describe(ev)
    assert f"视觉塔分 {ev.slices} 个时间片在步与步之间运行" in describe_in(ev, ZH)


def test_a_unit_known_to_overrun_the_slice_waits_for_the_next_one():
    """A unit's expected time is what the same unit took the last time, not the decaying longest recent one: after
    many short units a known long one does not start late in a slice (and so overrun it); the next slice runs it."""
    from minivlm.engine.encoder.tower_slices import TowerSlices
    slices, ran = TowerSlices(), []

    def job():
        for i in range(20):
            tower_boundaries.boundary(("short", i % 2))  # short units: the decaying estimate falls to ~0
        tower_boundaries.boundary(("long",))
        ran.append("long")
        return "done"
    slices.took[("long",)] = 10.0  # what it took the last time: far more than any slice below
    slices.submitted()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(slices.run, job)
        slices.lend(0.5)  # the short units fit; the long one does not: it parks before it, and the lend returns
        assert not ran and not future.done()
        slices.lend(0.001)  # a new slice always runs its first unit, whatever it is expected to take
        assert future.result(timeout=10) == "done" and ran == ["long"]
    assert slices.took[("short", 0)] < 0.5  # and what each unit took is kept for next time


def test_a_paused_engine_lends_nothing_and_closing_ends_a_parked_job(path):
    eng = engine(path, None, **SLICED)
    eng.core.scheduler.adaptive.IDLE_SLICE_S = 0.0  # no slice after a step by hand either: the job stays parked before its first module
    eng.pause()
    box = {}
    caller = threading.Thread(target=lambda: box.update(out=list(eng.stream(requests()[0], SamplingParams(max_tokens=2),
                                                                              snapshots=False))), daemon=True)
    caller.start()
    deadline = time.time() + 10
    while not eng.core.vision_worker.slices.pending() and time.time() < deadline:
        eng.step()  # one step by hand admits the request and starts its tower job
        time.sleep(0.01)
    [seq] = [s for s in eng.core.scheduler.waiting]
    future = eng.core.runner.pending[seq.seq_id][1]
    time.sleep(0.5)
    assert not future.done()  # paused: no steps, so no time lent
    eng.close()
    caller.join(10)
    assert not caller.is_alive()  # the caller heard: its request was aborted by the close
    assert box["out"][-1].finished and box["out"][-1].output.finish_reason == "abort"
    with pytest.raises(Exception, match="closed while this image waited"):
        future.result(timeout=10)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to this torch build")
def test_on_cuda_the_sliced_engine_gives_the_tower_in_the_step_s_tokens(path):
    """On a GPU each boundary synchronizes the device, so slices time the tower's work; the tokens stay the same."""
    cfg = dict(model=path, block_size=8, dtype="float32", device="cuda", max_model_len=1024, num_blocks=160)
    with Engine(EngineConfig(**cfg)) as eng:
        expected = eng.generate(requests(), PARAMS)
    with Engine(EngineConfig(**cfg, **SLICED)) as eng:
        assert eng.core.vision_worker.slices._sync is torch.cuda.synchronize
        outs = eng.generate(requests(), PARAMS)
    assert_same(expected, outs)
