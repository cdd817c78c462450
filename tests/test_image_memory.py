"""Pixel bombs on every route of the running app (python app.py, the session's app process), measured in that process's
own peak RSS (/proc VmHWM, reset before each request) and by the wall clock: eight 62 MP one-bit PNGs in one
request (a few KB each, under the per-image limit) and one 144 MP PNG go to the chat, the cache inspector, the
anatomy tab and the HTTP API. Each is refused from the image headers in under a second, with the same message and
the API's one error code, the peak grows by less than 300 MB, and the engine then answers as before (#24 items
3 and 4). The two 62 MP images the inspector and anatomy take are decoded reduced, within the same bound."""
import base64
import io
import json
import os
import time
import urllib.error
import urllib.request

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from minivlm.inputs.image_limits import MAX_IMAGE_BYTES
from tests.test_app_client import answer, ask

GROWTH_MB = 300
REFUSAL_S = 1.0
RESULTS: dict[str, tuple[float, float]] = {}  # route -> (peak RSS growth MB, seconds), printed at the end


def status(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split(field + ":")[1].split()[0]) / 1024  # MB


def measured(pid: int, route: str, call):
    """(call's result or exception, peak RSS growth in MB, seconds) in the app's process."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS now
    before, start = status(pid, "VmRSS"), time.perf_counter()
    try:
        result = call()
    except Exception as e:  # the refusal, as the client sees it
        result = e
    seconds = time.perf_counter() - start
    growth = status(pid, "VmHWM") - before
    RESULTS[route] = (growth, seconds)
    print(f"{route}: peak RSS +{growth:.0f} MB, {seconds:.2f} s")
    return result, growth, seconds


def png(path, size, mode="1"):
    Image.new(mode, size).save(path)
    return str(path)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    d = tmp_path_factory.mktemp("bombs")
    eight = [png(d / f"bomb{i}.png", (7900, 7900)) for i in range(8)]
    return eight, png(d / "huge.png", (12_000, 12_000))


@pytest.fixture(scope="module")
def app(tiny_app_process):
    """The session's app process (tests/conftest.py; its pid is the one measured): growth is measured from the
    resident size before each request, so what earlier modules left in it does not count."""
    return tiny_app_process


@pytest.fixture(scope="module")
def client(app):
    return Client(app, verbose=False)


def api(url, content, role="user"):
    body = json.dumps({"model": "tiny-qwen-vl", "max_tokens": 4,
                       "messages": [{"role": role, "content": content}]}).encode()
    req = urllib.request.Request(url + "v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def data_url(path_or_bytes) -> dict:
    raw = path_or_bytes if isinstance(path_or_bytes, bytes) else open(path_or_bytes, "rb").read()
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(raw).decode()}}


def upload(url, files) -> list[dict]:
    """Upload files in one request, as the page does; returns their FileData for a call."""
    boundary = "minivlmboundary"
    form = b"".join((f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\""
                     f"{os.path.basename(f)}\"\r\nContent-Type: image/png\r\n\r\n").encode()
                    + open(f, "rb").read() + b"\r\n" for f in files) + f"--{boundary}--\r\n".encode()
    req = urllib.request.Request(url + "gradio_api/upload", form,
                                 {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    paths = json.load(urllib.request.urlopen(req, timeout=60))
    return [{"path": p, "orig_name": os.path.basename(f), "meta": {"_type": "gradio.FileData"}}
            for p, f in zip(paths, files)]


def call(url, api_name, data) -> list:
    """One event through gradio's HTTP API (what the page sends after its upload); its last data, or the error."""
    req = urllib.request.Request(f"{url}gradio_api/call/{api_name}", json.dumps({"data": data}).encode(),
                                 {"Content-Type": "application/json"})
    event_id = json.load(urllib.request.urlopen(req, timeout=30))["event_id"]
    stream = urllib.request.urlopen(f"{url}gradio_api/call/{api_name}/{event_id}", timeout=120).read().decode()
    kind, payload = [line.split(": ", 1)[1] for line in stream.strip().splitlines()[-2:]]
    if kind == "error":
        raise RuntimeError(json.loads(payload))
    return json.loads(payload)


def refused_in_chat(url, files):
    uploaded = upload(url, files)  # as the page does, before the question is sent (not the refusal's time)

    def ask_it():
        msg = {"text": "What color is the shape?", "files": uploaded}
        history, _, stats = call(url, "chat", [msg, [], 4, 0.0, 1.0, 0, "", False, "", ""])  # no JSON schema
        assert stats.startswith("refused")
        return history[-1]["content"]
    return ask_it


@pytest.mark.slow  # one of the default run's longest (> 20 s on 2 cores); CI runs it with -m slow
def test_eight_bombs_in_one_chat_request(app, bombs):
    text, growth, seconds = measured(app.pid, "chat · 8 × 62 MP", refused_in_chat(app, bombs[0]))
    text = json.dumps(text)
    assert "499 MP together" in text and "over the 64 MP limit per request" in text and "bomb7.png" in text
    assert growth < GROWTH_MB and seconds < REFUSAL_S


def test_huge_upload_in_chat(app, bombs):
    text, growth, seconds = measured(app.pid, "chat · 144 MP", refused_in_chat(app, [bombs[1]]))
    assert "image 1 (huge.png) is 12000x12000 = 144 MP, over the 64 MP limit per image" in json.dumps(text)
    assert growth < GROWTH_MB and seconds < REFUSAL_S


def test_huge_upload_in_the_inspector(app, client, bombs):
    red = handle_file(bombs[0][0].replace("bomb0", "bomb0"))
    error, growth, seconds = measured(app.pid, "inspector · 144 MP", lambda: client.predict(
        red, handle_file(bombs[1]), "What color?", "", "processor default", "processor default", 1,
        api_name="/inspect"))
    assert isinstance(error, AppError)
    assert "Image 2 (huge.png) is 12000x12000 = 144 MP, over the 64 MP limit per image" in str(error)
    assert growth < GROWTH_MB and seconds < REFUSAL_S


def test_huge_upload_in_anatomy(app, client, bombs):
    error, growth, seconds = measured(app.pid, "anatomy · 144 MP", lambda: client.predict(
        handle_file(bombs[1]), None, "What color?", 16384, 16384, api_name="/anatomy"))
    assert isinstance(error, AppError)
    assert "Image (huge.png) is 12000x12000 = 144 MP, over the 64 MP limit per image" in str(error)
    assert growth < GROWTH_MB and seconds < REFUSAL_S


def test_two_62_mp_images_are_decoded_reduced(app, client, bombs):
    """The most the inspector and anatomy take: two images under every limit, decoded no larger than needed."""
    for route, call in [
        ("anatomy · 2 × 62 MP", lambda: client.predict(handle_file(bombs[0][0]), handle_file(bombs[0][1]), "Hi?",
                                                       16384, 16384, api_name="/anatomy")),
        ("inspector · 2 × 62 MP", lambda: client.predict(handle_file(bombs[0][0]), handle_file(bombs[0][1]), "Hi?",
                                                         "", "processor default", "processor default", 1,
                                                         api_name="/inspect"))]:
        result, growth, _ = measured(app.pid, route, call)
        assert not isinstance(result, Exception), result
        assert growth < GROWTH_MB


def test_the_api_refuses_the_same_way_with_one_code(app, bombs):
    for route, content, phrase in [
            ("API · 8 × 62 MP", [data_url(f) for f in bombs[0]], "over the 64 MP limit per request"),
            ("API · 144 MP", [data_url(bombs[1])], "image 1 is 12000x12000 = 144 MP, over the 64 MP limit per image"),
    ]:
        (code, body), growth, seconds = measured(app.pid, route, lambda: api(app, content))
        assert code == 400 and body["error"]["code"] == "image_too_large" and phrase in body["error"]["message"]
        assert growth < GROWTH_MB and seconds < REFUSAL_S
    buf = io.BytesIO()
    Image.new("1", (20_000, 20_000)).save(buf, "PNG")  # 400 MP: past PIL's own bomb cap, the same code
    code, body = api(app, [data_url(buf.getvalue())])
    assert code == 400 and body["error"]["code"] == "image_too_large" and "400 MP" in body["error"]["message"]
    code, body = api(app, [data_url(b"this is text, not a picture")])
    assert code == 400 and body["error"]["code"] == "invalid_image"
    assert "image 1 is not a readable image" in body["error"]["message"] and "_io." not in body["error"]["message"]


def test_one_upload_limit_for_the_page_and_the_api(app):
    big = b"\0" * (MAX_IMAGE_BYTES + 1)
    code, body = api(app, [data_url(big)])
    assert code == 400 and body["error"]["code"] == "image_too_large" and "20 MiB limit" in body["error"]["message"]
    boundary = "minivlmboundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"big.png\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + big + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(app + "gradio_api/upload", form,
                                 {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=60)
    assert refused.value.code == 413


def test_images_only_in_user_turns(app):
    red = open("assets/examples/red_circle.png", "rb").read()
    code, body = api(app, [data_url(red)], role="assistant")
    assert code == 400 and body["error"]["code"] == "invalid_image_role"


def test_the_engine_serves_normally_after(app, client):
    assert answer(ask(client, "What color is the shape?", ["red_circle.png"])[0]) == "red"
    code, body = api(app, [data_url(open("assets/examples/blue_circle.png", "rb").read()),
                           {"type": "text", "text": "What color is the shape?"}])
    assert code == 200 and body["choices"][0]["message"]["content"].strip() == "blue"
    print("\n".join(f"{r}: +{g:.0f} MB peak RSS, {s:.2f} s" for r, (g, s) in RESULTS.items()))
