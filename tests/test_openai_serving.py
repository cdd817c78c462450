"""The HTTP API under load and change: API keys and shared deployments (per-key cache salts), concurrent clients
batched together, an engine rebuild under a running request, and clients that hang up."""
import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.api_app import MODEL, image_message, inprocess_app, text_request
from tests.app_server import running_app

ANSWERS = {"red_circle.png": ("What color is the shape?", "red"), "blue_circle.png": ("What color is the shape?", "blue"),
           "green_triangle.png": ("What shape is it?", "triangle"), "yellow_square.png": ("What shape is it?", "square")}


@pytest.fixture(scope="module")
def shared_app_with_key(shared_app_process):
    """The session's `python app.py --shared` (tests/conftest.py), started with MINIVLM_API_KEY=class-key,teacher-key
    (also test_shared_deployment.py's app)."""
    return shared_app_process[0]


def test_key_protects_the_api_and_each_key_and_user_gets_its_own_cache(shared_app_with_key):
    url = shared_app_with_key + "v1"
    no_key = httpx.post(url + "/chat/completions", json=text_request(), timeout=60)  # the openai client needs one
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
    assert no_key.headers["www-authenticate"] == "Bearer"
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=url, api_key="wrong", max_retries=0, timeout=60).chat.completions.create(
            model=MODEL, messages=image_message("red_circle.png"))
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    assert httpx.get(url + "/models").status_code == 401
    student = openai.OpenAI(base_url=url, api_key="class-key", max_retries=0, timeout=60)
    teacher = openai.OpenAI(base_url=url, api_key="teacher-key", max_retries=0, timeout=60)

    def cached(c, user):
        r = c.chat.completions.create(model=MODEL, messages=image_message("red_circle.png"), temperature=0, user=user)
        assert r.choices[0].message.content == "red"
        assert user not in r.model_extra["minivlm"]["request_id"]  # user names stay private on a shared deployment
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached(student, "ann") == 0
    assert cached(student, "ann") > 0     # the same key and user: its own cache works
    assert cached(student, "bob") == 0    # another user under the same key: salted apart
    assert cached(teacher, "ann") == 0    # another key: salted apart
    assert httpx.get(shared_app_with_key + "metrics").status_code == 200


@pytest.mark.slow  # a second app of its own (~13 s): CI runs it with -m slow
def test_shared_deployment_without_key_turns_the_api_off(tmp_path, monkeypatch):
    monkeypatch.delenv("MINIVLM_API_KEY", raising=False)
    with running_app("--shared", log_path=str(tmp_path / "app.log")) as url:
        r = httpx.post(url + "v1/chat/completions", json=text_request(), timeout=60)
        assert r.status_code == 403 and r.json()["error"]["code"] == "api_disabled"
        assert httpx.get(url + "v1/models").status_code == 403
        assert httpx.get(url).status_code == 200  # the UI still serves


@pytest.fixture(scope="module")
def inprocess():
    """The app served from this process (as tests/test_browser.py does), so a test can watch the engine."""
    with inprocess_app(num_blocks=256) as served:
        yield served


def test_concurrent_api_requests_run_in_one_batch(inprocess):
    """8 clients x 4 requests, each answered right; the engine's event log shows steps that ran many at once."""
    holder, url = inprocess
    engine = holder.get()
    since = engine.events()[-1].seq if engine.events() else 0

    def one_client(i):
        c = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=120)
        names = list(ANSWERS)
        out = []
        for k in range(4):
            question, answer = ANSWERS[names[(i + k) % 4]]
            r = c.chat.completions.create(model=MODEL, messages=image_message(names[(i + k) % 4], question),
                                          temperature=0)
            out.append((r.choices[0].message.content == answer, r.model_extra["minivlm"]["request_id"]))
        return out

    with ThreadPoolExecutor(8) as pool:
        results = [pair for got in pool.map(one_client, range(8)) for pair in got]
    assert len(results) == 32 and all(ok for ok, _ in results)
    ids = {rid for _, rid in results}
    steps = [ev.request_ids for ev in engine.events(since) if ev.kind == "scheduled"]
    assert ids == {r for batch in steps for r in batch}  # every API request ran, and only they did
    assert max(len(batch) for batch in steps) >= 4, "API requests never shared a step"
    assert all(b.ref_count == 0 for b in engine.snapshot().blocks)  # every block released


def test_router_follows_the_engine_across_a_rebuild(inprocess):
    holder, url = inprocess
    c = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=120)
    before = c.chat.completions.create(model=MODEL, messages=image_message("red_circle.png"), temperature=0)
    assert before.model_extra["minivlm"]["cache_strategy"] == "C"
    holder.load(dataclasses.replace(holder.config, cache_strategy="A"))
    try:
        after = c.chat.completions.create(model=MODEL, messages=image_message("red_circle.png"), temperature=0)
        assert after.model_extra["minivlm"]["cache_strategy"] == "A" and after.choices[0].message.content == "red"
        assert after.usage.prompt_tokens_details.cached_tokens == 0  # a new engine: a new, empty cache
    finally:
        holder.load(dataclasses.replace(holder.config, cache_strategy="C"))


def test_a_request_cut_off_by_a_rebuild_gets_503_and_the_new_engine_serves(inprocess):
    holder, url = inprocess
    c = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=120)
    old, errors = holder.get(), []

    def long_request():
        try:
            c.chat.completions.create(model=MODEL, messages=image_message("red_circle.png"), max_tokens=3900,
                                      extra_body={"ignore_eos": True})
        except openai.APIStatusError as e:
            errors.append(e)
    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 60
    while not any(r.startswith("api-") for r in old.snapshot().running) and time.monotonic() < deadline:
        time.sleep(0.01)
    holder.load()  # the header's "Rebuild engine": the old engine closes under the running request
    t.join(60)
    assert len(errors) == 1 and errors[0].status_code == 503 and errors[0].body["code"] == "engine_rebuilt"
    r = c.chat.completions.create(model=MODEL, messages=image_message("red_circle.png"), temperature=0)
    assert r.choices[0].message.content == "red"


def test_a_client_that_hangs_up_frees_its_request(inprocess):
    """Non-streaming: the client gives up (timeout) mid-answer; the engine stops the request before its 3900
    tokens (it alone runs, one token per step, so fewer steps than that means it was cut short) and frees it."""
    holder, url = inprocess
    engine = holder.get()
    start = engine.snapshot().step
    body = {"model": MODEL, "messages": image_message("red_circle.png"), "max_tokens": 3900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=1))
    deadline = time.monotonic() + 300
    while any(r.startswith("api-") for r in engine.snapshot().block_tables) and time.monotonic() < deadline:
        time.sleep(0.05)
    snap = engine.snapshot()
    assert snap.step - start < 3900 and not snap.running and all(b.ref_count == 0 for b in snap.blocks)
