"""A public deployment (python app.py --shared, the session's process: tests/conftest.py) attacked through its public API the way a
visitor can reach it: gradio_client and raw HTTP. Every reconfiguring call is refused with a clear message and the
shared engine stays as it was: its settings, its pool, its cache. The operator's token still works."""
import json
import os
import time
import urllib.error
import urllib.request

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from minivlm import EngineConfig

from tests.app_server import APP_MODEL, SHARED_ADMIN_TOKEN, SHARED_NUM_BLOCKS
from tests.test_app_client import ask, image

NUM_BLOCKS = SHARED_NUM_BLOCKS
TOKEN = SHARED_ADMIN_TOKEN
REFUSED = "This is a shared deployment: its engine configuration belongs to the operator and was not changed"
QUESTION = ("How many shapes are there?", ["three_shapes.png"])
MODEL = APP_MODEL or EngineConfig().model


def cached_tokens(stats: str) -> int:
    return int(stats.split(" tokens, ")[1].split()[0])


@pytest.fixture(scope="module")
def app(shared_app_process):
    """(url, log path) of the session's `python app.py --shared` (also test_openai_serving.py's API-key app)."""
    return shared_app_process


@pytest.fixture(scope="module")
def alice(app):
    """A visitor whose prompt is in the shared engine's prefix cache (under her session's salt)."""
    client = Client(app[0], verbose=False)
    assert cached_tokens(ask(client, *QUESTION)[2]) == 0
    assert cached_tokens(ask(client, *QUESTION)[2]) > 0
    return client


@pytest.fixture(scope="module")
def onlooker(app):
    """A visitor who only looks (never launches nor asks): a session without a run of its own, whatever test ran."""
    return Client(app[0], verbose=False)


@pytest.fixture
def before(app, alice, onlooker):
    """The engine's status line and settings before an attack; afterwards they must be the same and Alice's
    prompt must still come from the cache."""
    state = alice.predict(api_name="/engine_status")
    yield state
    assert alice.predict(api_name="/engine_status") == state
    shared_view = onlooker.predict(api_name="/kv_snapshot")[2]  # a session without a run of its own
    # the shared pool as totals only, never its blocks (#24 item 7)
    assert "Shared engine, totals only" in shared_view and f" of {NUM_BLOCKS} blocks in use" in shared_view
    assert cached_tokens(ask(alice, *QUESTION)[2]) > 0


def test_status_shows_the_shared_settings(before):
    status, model, device, dtype, block_size, num_blocks, strategy = before
    assert f"{NUM_BLOCKS} blocks" in status and "prefix cache: C" in status
    assert (model, device, num_blocks, strategy) == ("tiny-qwen-vl" if not APP_MODEL else model, "cpu", NUM_BLOCKS, "C")
    assert "/" not in model or not os.path.isabs(model)  # no server path leaves the server


@pytest.mark.parametrize("attack", [
    (MODEL, "cpu", "float32", 16, 3, "C", ""),                      # a 48-token pool for every user
    ("Qwen/Qwen2.5-VL-7B-Instruct", "cpu", "auto", 16, 0, "C", ""),  # make the Space download a model
    (MODEL, "cpu", "auto", 16, NUM_BLOCKS, "A", "wrong-token"),     # unsafe strategy, with a guessed token
], ids=["tiny-pool", "hub-download", "wrong-token"])
def test_rebuild_is_refused_for_visitors(before, alice, attack):
    with pytest.raises(AppError, match=REFUSED):
        alice.predict(*attack, api_name="/rebuild")


def test_raw_http_rebuild_is_refused(before, app):
    """Without any client library: POST the call, read its event stream."""
    url = app[0] + "gradio_api/call/rebuild"
    body = json.dumps({"data": [MODEL, "cpu", "float32", 16, 3, "C", ""]}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    event_id = json.load(urllib.request.urlopen(req, timeout=30))["event_id"]
    stream = urllib.request.urlopen(f"{url}/{event_id}", timeout=120).read().decode()
    assert "event: error" in stream and REFUSED in stream


def test_unlock_is_refused_without_the_token(before, alice):
    for token in ("", "guess"):
        with pytest.raises(AppError, match=REFUSED):
            alice.predict(token, api_name="/unlock_header")


def test_launcher_is_bounded_and_isolated(before, alice):
    with pytest.raises(AppError, match="1 to 8 requests of 4 to 128 tokens"):
        alice.predict(32, 256, api_name="/kv_launch")
    _, _, summary, *_ = alice.predict(8, 64, api_name="/kv_launch")
    assert " of 96<br>" in summary  # its own pool, not the shared engine's 128 blocks


def test_one_answer_at_a_time_per_session(before, app):
    bob = Client(app[0], verbose=False)
    job = bob.submit({"text": QUESTION[0], "files": [image(f) for f in QUESTION[1]]}, [], 1500, 0.0, 1.0, 0, "", True, api_name="/chat")
    while len(job.outputs()) < 2:
        assert not job.done(), job.result()
        time.sleep(0.01)
    with pytest.raises(AppError, match="One answer at a time per session"):
        ask(bob, *QUESTION)
    bob.predict(api_name="/stop")
    assert "finish: abort" in job.result()[2]


def test_each_session_has_its_own_cache(before, alice, app):
    bob = Client(app[0], verbose=False)
    assert cached_tokens(ask(bob, *QUESTION)[2]) == 0  # never Alice's blocks (no timing side channel)


def upload(url: str, name: str, size: int) -> tuple[int, str]:
    """POST a file to gradio's upload route as a browser does (multipart); returns status and body."""
    boundary = "minivlm-test-boundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n")
    body = head.encode() + b"x" * size + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(url + "gradio_api/upload", body,
                                 {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_uploads_are_limited_and_cleaned(app):
    code, body = upload(app[0], "big.bin", 2 * 2**20)
    assert code == 413 and "maximum allowed size" in body
    code, body = upload(app[0], "small.bin", 1000)
    assert code == 200
    path = json.loads(body)[0]
    assert os.path.exists(path)
    deadline = time.monotonic() + 60
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not os.path.exists(path)  # --upload-ttl 2: gone a few seconds later


def test_operator_token_unlocks_and_rebuilds(app, alice):
    """Last: the operator changes the engine (and then puts it back)."""
    assert [u["interactive"] for u in alice.predict(TOKEN, api_name="/unlock_header")] == [True] * 6
    status, *_ = alice.predict(MODEL, "cpu", "float32", 16, 64, "A", TOKEN, api_name="/rebuild")
    assert "64 blocks" in status and "prefix cache: C" in status  # a shared engine stays on C, even for the operator
    status, *_ = alice.predict(MODEL, "cpu", "float32", 16, NUM_BLOCKS, "C", TOKEN, api_name="/rebuild")
    assert f"{NUM_BLOCKS} blocks" in status
    with open(app[1]) as f:
        log = f.read()
    assert "Traceback" not in log and log.count("minivlm:") == 0  # quiet: no traceback, no line per pool


def test_a_visitor_sees_the_shared_pool_as_totals_only(app, alice):
    """#24 item 7: before a visitor's own launch, the KV tab shows no block, key, table row or request of the
    shared engine (Alice's cached prompt is in it), only its totals."""
    ask(alice, *QUESTION)  # her prompt's blocks are cached now (an operator's rebuild may have emptied the pool)
    plot, table, summary, *_ = Client(app[0], verbose=False).predict(api_name="/kv_snapshot")
    fig = json.loads(plot["plot"])
    assert [v for row in fig["data"][0]["z"] for v in row if v is not None] == []  # no cell drawn
    assert not any(row and row[0] for row in table["data"])  # no block-table row
    assert "totals only" in fig["layout"]["title"]["text"] and "hash" not in json.dumps(fig["data"][0])
    cached = int(summary.split(" blocks in use, ")[1].split()[0])
    assert "Shared engine, totals only" in summary and cached > 0  # Alice's blocks, as a number
