"""async_vision: the vision tower runs on its own thread while the running requests keep stepping. The truth
is the same engine with the tower in the step: the same tokens and logprobs (within 1e-4), a request is never
scheduled before its images are encoded, a tower error fails only its own request, and an engine with nothing
to run but images in the tower waits instead of counting empty steps."""
import os
import sys
import threading
import time

import pytest

from minivlm import RequestFailed, SamplingParams
from minivlm.views.events import describe
from tests.test_chunked_prefill import PARAMS, assert_same, engine, path, requests, unchunked, watch  # noqa: F401


class GatedTower:
    """The real vision tower behind a gate the test opens (or an error it raises), to control timing."""

    def __init__(self, vision, error: Exception | None = None):
        self.vision, self.error, self.gate, self.calls = vision, error, threading.Event(), 0

    def encode(self, pixels, grids):
        self.calls += 1
        if sys.platform == "linux":
            tid = threading.get_native_id()
            self.policy, self.nice = os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)
        self.gate.wait(30)
        if self.error is not None:
            raise self.error
        return self.vision.encode(pixels, grids)


@pytest.mark.parametrize("chunk", [None, 24])
def test_same_tokens_as_the_tower_in_the_step(path, unchunked, chunk):
    log = []
    with engine(path, chunk, async_vision=True) as eng:
        watch(eng, log)  # invariants and replay == snapshot after every step
        assert_same(unchunked, eng.generate(requests(), PARAMS))
        assert eng.core.vision_worker is not None


def test_text_runs_while_an_image_is_in_the_tower(path, unchunked):
    reqs = requests()
    image, text = reqs[0], reqs[-1]
    with engine(path, 24, async_vision=True) as eng:
        gated = eng.core.vision_worker.vision = GatedTower(eng.core.vision_worker.vision)
        box = {}
        t = threading.Thread(target=lambda: box.update(out=eng.generate(image, PARAMS)))
        t.start()
        [text_out] = eng.generate([text], PARAMS)  # finishes while the image request's tower is held
        scheduled = [ev for ev in eng.events() if ev.kind == "scheduled" and image.request_id in ev.request_ids]
        assert gated.calls == 1 and not scheduled and t.is_alive()
        if sys.platform == "linux":  # the tower's thread yields the CPU to the steps (niced where SCHED_IDLE is refused)
            assert gated.policy == os.SCHED_IDLE or gated.nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
            assert os.sched_getscheduler(0) == os.SCHED_OTHER  # and only that thread: the engine's keep their share
        gated.gate.set()
        t.join(60)
    assert text_out.token_ids == unchunked[-1].token_ids
    assert_same([unchunked[0]], [box["out"]])
    # the log says it: one vision_encoded event, in the step that first computed the image's tokens
    [encoded] = [ev for ev in eng.events() if ev.kind == "vision_encoded"]
    first = min(ev.step for ev in eng.events() if ev.kind == "scheduled" and image.request_id in ev.request_ids)
    assert encoded.request_id == image.request_id and encoded.num_images == 1 and encoded.seconds > 0
    assert encoded.step >= first and encoded.arrived_step < first
    assert "encoded on the vision thread" in describe(encoded) and "ran without it" in describe(encoded)


def test_a_tower_error_fails_only_its_request(path, unchunked):
    reqs = requests()
    with engine(path, None, async_vision=True) as eng:
        gated = eng.core.vision_worker.vision = GatedTower(eng.core.vision_worker.vision, RuntimeError("tower broke"))
        gated.gate.set()
        with pytest.raises(RequestFailed, match="vision encode.*tower broke"):
            eng.generate(reqs[0], PARAMS)
        eng.core.vision_worker.vision = gated.vision
        assert_same(unchunked[1:2], eng.generate([reqs[1]], PARAMS))  # the engine keeps serving
        assert eng.core.block_manager.num_free == eng.num_blocks


def test_waiting_for_the_tower_is_not_a_step(path):
    with engine(path, None, async_vision=True) as eng:
        gated = eng.core.vision_worker.vision = GatedTower(eng.core.vision_worker.vision)
        t = threading.Thread(target=eng.generate, args=(requests()[0], SamplingParams(max_tokens=2)))
        t.start()
        time.sleep(0.2)
        steps = eng.core.step_count
        time.sleep(0.5)
        assert eng.core.step_count == steps <= 1  # one step admitted it; none since, however long the tower takes
        gated.gate.set()
        t.join(60)
        assert eng.core.step_count > steps


def test_app_flags_serve_with_chunked_prefill_and_async_vision():
    """`python app.py --enable-chunked-prefill --max-num-batched-tokens 24 --async-vision` builds such an engine,
    and it answers like the plain one."""
    import app
    from minivlm import Engine
    config = app.engine_config(app.parse_args(["--enable-chunked-prefill", "--max-num-batched-tokens", "24",
                                               "--async-vision", "--device", "cpu"]))
    assert (config.enable_chunked_prefill, config.max_num_batched_tokens, config.async_vision) == (True, 24, True)
    assert app.engine_config(app.parse_args([])).async_vision is False
    with Engine(config) as eng, Engine(app.engine_config(app.parse_args(["--device", "cpu"]))) as plain:
        req = requests()[0]
        assert eng.generate(req, PARAMS).token_ids == plain.generate(req, PARAMS).token_ids
