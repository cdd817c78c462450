"""One stream handle (#39 item 6): Engine.submit returns a RequestHandle that a thread iterates (`for`) and an event
loop awaits (`async for`) with the same events; closing it aborts the request and frees its blocks; a refusal
raises from submit; a dead loop is an error, never a hang, for an async reader too; and a streamed API request
runs on the event loop with no thread of its own."""
import asyncio
import json
import threading
import time

import httpx
import pytest

from minivlm import Engine, EngineConfig, Refused, RequestHandle, Request, SamplingParams
from tests.api_app import MODEL, image_message, inprocess_app

PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def engine():
    with Engine(EngineConfig(device="cpu", num_blocks=64)) as e:
        yield e


def run(coro):
    """asyncio.run on a thread of its own: an event loop the session already runs in this thread (the shared
    Playwright browser's) makes asyncio.run refuse here; an API server's loop is its own thread's too."""
    box = {}

    def target():
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:  # re-raised in the test's thread, so pytest.raises sees it
            box["error"] = e
    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def question(i: int = 0) -> Request:
    return Request(prompt=f"What color is the shape? ({i})", request_id=f"handle-{i}")


def settled(engine, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while engine.has_unfinished() and time.monotonic() < deadline:
        time.sleep(0.02)
    snap = engine.snapshot()
    return not snap.block_tables and all(b.ref_count == 0 for b in snap.blocks)


def test_the_handle_iterates_sync_and_async_with_the_same_events(engine):
    expected = engine.generate(question(), PARAMS)
    handle = engine.submit(question(), PARAMS)
    assert isinstance(handle, RequestHandle) and handle.request_id == "handle-0"
    sync = [(ev.delta, ev.finished) for ev in handle]

    async def read():
        return [(ev.delta, ev.finished) async for ev in engine.submit(question(), PARAMS)]
    assert run(read()) == sync
    assert "".join(d for d, _ in sync) == expected.text and [f for _, f in sync].count(True) == 1 and sync[-1][1]
    assert handle.finished and settled(engine)


def test_two_async_readers_share_one_event_loop_and_one_batch(engine):
    async def both():
        async def read(i):
            return [ev async for ev in engine.submit(question(i), PARAMS)]
        return await asyncio.gather(read(1), read(2))
    since = engine.events()[-1].seq
    one, two = run(both())
    assert len(one[-1].output.token_ids) == len(two[-1].output.token_ids) == 12
    steps = [ev.request_ids for ev in engine.events(since) if ev.kind == "scheduled"]
    assert any({"handle-1", "handle-2"} <= set(batch) for batch in steps)


def test_closing_the_handle_aborts_the_request_and_frees_its_blocks(engine):
    long = SamplingParams(max_tokens=400, ignore_eos=True)
    with engine.submit(question(3), long) as handle:
        first = next(handle)
        assert not first.finished and "handle-3" in engine.snapshot().block_tables
    assert handle.finished and next(handle, None) is None
    assert settled(engine)
    finished = [ev for ev in engine.events() if ev.kind == "finished" and ev.request_id == "handle-3"]
    assert finished[-1].finish_reason == "abort"

    async def abort_async():
        handle = engine.submit(question(4), long)
        async for ev in handle:
            handle.abort()
        return ev
    assert not run(abort_async()).finished and settled(engine)


def test_a_refusal_raises_from_submit_before_anything_is_queued(engine):
    with pytest.raises(Refused) as e:
        engine.submit(Request(prompt="red " * 5000), PARAMS)
    assert e.value.code == "context_length_exceeded" and not engine.has_unfinished()


def test_an_async_reader_never_hangs_on_a_loop_that_died_silently(engine, monkeypatch):
    monkeypatch.setattr(engine.loop, "_died", lambda error: None)
    monkeypatch.setattr(engine.core, "step", lambda *a: (_ for _ in ()).throw(SystemError("silent death")))

    async def read():
        return [ev async for ev in engine.submit(question(5), PARAMS)]
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="loop is not running"):
        run(read())
    assert time.monotonic() - t0 < 5.0
    monkeypatch.undo()
    assert engine.generate(question(6), PARAMS).finish_reason == "length"  # a fresh loop serves again


def test_a_streamed_api_request_has_no_thread_of_its_own():
    """While an SSE answer streams, the process runs exactly the threads it ran before it (EventPump started one per
    request); the engine's loop thread wakes the event loop instead."""
    with inprocess_app(num_blocks=64) as (holder, url):
        body = {"model": MODEL, "messages": image_message("red_circle.png"), "stream": True, "max_tokens": 64,
                "ignore_eos": True}
        httpx.post(url + "v1/chat/completions", json={**body, "max_tokens": 2}, timeout=120)  # warm: loop, pools
        before = {t.ident: t.name for t in threading.enumerate()}
        chunks, during = 0, None
        with httpx.stream("POST", url + "v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    json.loads(line[6:])
                if chunks == 8:  # mid-answer
                    assert holder.get().has_unfinished()
                    during = {t.ident: t.name for t in threading.enumerate()}
        assert chunks > 8 and during is not None
        assert {i: n for i, n in during.items() if i not in before} == {}
