"""Soak: 2,000 random requests from 16 threads against one engine, 20 % aborted at random times and 5 % with a
fault injected; every call returns or raises, block-manager invariants hold after every step, nothing leaks."""
import random
import threading
import time

import pytest
from PIL import Image

from minivlm import Engine, EngineConfig, Request, RequestFailed, SamplingParams
from tests.faults import STAGES, inject
from tests.test_block_manager import check_invariants

N, THREADS = 2000, 16


def invariant_hook(violations: list):
    """After every step: the block manager's books agree with the sequences that hold blocks."""
    def check(core):
        live = [s for s in (*core.scheduler.running, *core.scheduler.waiting) if core.block_manager.table(s)]
        try:
            check_invariants(core.block_manager, live)
        except AssertionError as e:
            violations.append(f"step {core.step_count}: {e}")
    return check


@pytest.mark.slow
def test_soak(checkpoints, monkeypatch):
    violations, outcomes, lock = [], {"done": 0, "aborted": 0, "failed": 0, "error": []}, threading.Lock()
    engine = Engine(EngineConfig(model=checkpoints["qwen3_vl"], num_blocks=96, block_size=8, max_model_len=512,
                                 cache_strategy="C"))
    engine.core.after_step = invariant_hook(violations)
    for stage in STAGES:
        inject(monkeypatch, engine, stage, lambda rid, stage=stage: rid.startswith(f"fault:{stage}:"))
    rng = random.Random(0)
    plans = []
    for i in range(N):
        kind = rng.random()
        label = f"fault:{rng.choice(STAGES)}:{i}" if kind < 0.05 else f"req-{i}"
        images = [Image.new("RGB", (rng.randint(32, 120), rng.randint(32, 120)), tuple(rng.randrange(256) for _ in "rgb"))
                  for _ in range(rng.choice([1, 2] if kind < 0.05 else [0, 1, 1, 2]))]  # faults need an image to encode
        abort_after = rng.randint(0, 6) if 0.05 <= kind < 0.25 else None
        plans.append((Request(prompt="word " * rng.randint(1, 30), images=images, request_id=label),
                      SamplingParams(max_tokens=rng.randint(2 if kind < 0.05 else 1, 24), ignore_eos=True), abort_after))

    def worker(k):
        for request, params, abort_after in plans[k::THREADS]:
            try:
                gen = engine.stream(request, params, snapshots=request.request_id.startswith("fault:snapshot"))
                for n, ev in enumerate(gen):
                    if abort_after is not None and n >= abort_after and not ev.finished:
                        gen.close()
                        break
                result = "aborted" if abort_after is not None and not ev.finished else "done"
            except RequestFailed:
                result = "failed"
            except Exception as e:  # anything else is a bug
                with lock:
                    outcomes["error"].append(repr(e))
                continue
            with lock:
                outcomes[result] += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    [t.start() for t in threads]
    [t.join(timeout=1800) for t in threads]
    wall = time.monotonic() - t0
    for _ in range(100):
        if not engine.has_unfinished():
            break
        time.sleep(0.05)
    snap = engine.snapshot()
    print(f"\nsoak: {N} requests from {THREADS} threads in {wall:.0f}s over {engine.core.step_count} steps: "
          f"{outcomes['done']} done, {outcomes['aborted']} aborted, {outcomes['failed']} failed by injected faults, "
          f"{snap.num_preemptions} preemptions")
    assert not any(t.is_alive() for t in threads), "a call never returned"
    assert not outcomes["error"], outcomes["error"][:5]
    assert outcomes["done"] + outcomes["aborted"] + outcomes["failed"] == N
    assert outcomes["failed"] == sum(p[0].request_id.startswith("fault:") for p in plans)
    assert not violations, violations[:5]
    assert not snap.block_tables and all(b.ref_count == 0 for b in snap.blocks), "blocks leaked"
    engine.close()
