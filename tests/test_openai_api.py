"""The HTTP API with the clients people use (the `openai` package, raw HTTP) against the running app (`python
app.py`, started by tests/app_server.py): answers, prefix-cache reporting, streaming, sampling, media, bad input."""
import functools
import http.server
import io
import json
import os
import threading

import httpx
import openai
import pytest
from PIL import Image

from panels.holder import EXAMPLES_DIR
from tests.api_app import MODEL, data_url, image_message, text_request
from tests.app_server import APP_MODEL


@pytest.fixture(scope="module")
def media_server():
    """A local HTTP server with the example images: the one domain the app may fetch from."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=EXAMPLES_DIR)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture(scope="module")
def app(tiny_app_process):
    """The app as users start it (the session's process, tests/conftest.py), with the API open (no key) and
    127.0.0.1 as the one allowed media domain."""
    return tiny_app_process


@pytest.fixture(scope="module")
def client(app):
    return openai.OpenAI(base_url=app + "v1", api_key="unused", max_retries=0, timeout=120)


def test_models_lists_the_served_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == [APP_MODEL or MODEL]


def test_red_circle_answers_red_and_the_repeat_hits_the_prefix_cache(client):
    first = client.chat.completions.create(model=MODEL, messages=image_message("red_circle.png"), temperature=0,
                                           extra_body={"cache_salt": "test-red"})
    assert first.choices[0].message.content == "red"
    assert first.choices[0].finish_reason == "stop"
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # a salt nobody used before: a cold cache
    again = client.chat.completions.create(model=MODEL, messages=image_message("red_circle.png"), temperature=0,
                                           extra_body={"cache_salt": "test-red"})
    assert again.choices[0].message.content == "red"
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached == (again.usage.prompt_tokens - 1) // 16 * 16 > 0  # every full block but the last token's
    ext = again.model_extra["minivlm"]
    assert ext["cached_tokens"] == cached and ext["cache_hit_blocks"] * ext["block_size"] == cached
    assert ext["false_hit_blocks"] == 0 and ext["cache_strategy"] == "C"
    assert [h["logical_index"] for h in ext["cache_hits"]] == list(range(ext["cache_hit_blocks"]))
    assert ext["request_id"].startswith("api-") and again.id == f"chatcmpl-{ext['request_id']}"


def test_stream_gives_the_same_text_and_one_usage_chunk(client):
    messages = image_message("blue_circle.png")
    plain = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content == "blue"
    with_usage = [c for c in chunks if c.usage is not None]
    assert len(with_usage) == 1 and with_usage[0] is chunks[-1] and chunks[-1].choices == []
    assert with_usage[0].usage.completion_tokens == plain.usage.completion_tokens
    assert with_usage[0].usage.prompt_tokens == plain.usage.prompt_tokens
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[0].choices[0].delta.role == "assistant"
    no_usage = list(client.chat.completions.create(model=MODEL, messages=messages, temperature=0, stream=True))
    assert all(c.usage is None for c in no_usage) and all(c.choices for c in no_usage)


def test_logprobs_and_sampling_parameters(client):
    messages = image_message("green_triangle.png", "What shape is it?")
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and content[0].token == "triangle"
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy: the sampled token is the most likely
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
    streamed = [c for c in client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                          logprobs=True, top_logprobs=3, stream=True)
                if c.choices and c.choices[0].logprobs]
    assert [e.logprob for c in streamed for e in c.choices[0].logprobs.content] == [e.logprob for e in content]
    # each token's logprobs come with the chunk that carries its text, not all at the end
    assert streamed[0].choices[0].delta.content == "triangle" and streamed[0].choices[0].finish_reason is None
    assert [e.token for e in streamed[0].choices[0].logprobs.content] == ["triangle"]
    past_eos = [c for c in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True, stream=True,
        extra_body={"ignore_eos": True}) if c.choices and c.choices[0].logprobs]
    tokens = [e.token for c in past_eos for e in c.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in past_eos)  # special tokens are not text
    assert len(tokens) == 8 and text == "".join(t for t in tokens if t != "<|im_end|>") and len(past_eos) > 2
    one = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=1,
                                         extra_body={"ignore_eos": True, "top_k": 1})
    assert one.usage.completion_tokens == 1 and one.choices[0].finish_reason == "length"
    long = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert long.usage.completion_tokens == 12 and long.choices[0].finish_reason == "length"
    cut = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, stop=["ang"])
    assert cut.choices[0].message.content == "tri" and cut.choices[0].finish_reason == "stop"
    sampled = [client.chat.completions.create(model=MODEL, messages=messages, temperature=1.5, top_p=0.9, seed=7,
                                              max_tokens=6, extra_body={"ignore_eos": True}).choices[0].message.content
               for _ in range(2)]
    assert sampled[0] == sampled[1]  # the same seed draws the same tokens


def test_allowed_domain_is_fetched_others_are_refused(client, media_server):
    r = client.chat.completions.create(model=MODEL, temperature=0,
                                       messages=image_message("red_circle.png", url=f"{media_server}/red_circle.png"))
    assert r.choices[0].message.content == "red"
    for url in ("http://example.com/red_circle.png", f"http://localhost:{media_server.rsplit(':', 1)[1]}/x.png",
                "file:///etc/passwd", "ftp://127.0.0.1/red_circle.png"):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=image_message("red_circle.png", url=url))
        assert e.value.body["code"] == "image_url_not_allowed"
        assert e.value.body["param"] == "messages[0].content[0].image_url.url"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=image_message("x", url=f"{media_server}/missing.png"))
    assert e.value.body["code"] == "image_fetch_failed"


def png_bytes(size, mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format="PNG")
    return buf.getvalue()


BAD_REQUESTS = {  # name: (body, status, code, param)
    "malformed JSON": (b'{"model": "tiny-qwen-vl", "messages": [', 400, "invalid_json", None),
    "not an object": (b'[1, 2]', 400, "invalid_json", None),
    "max_tokens as text": (text_request(max_tokens="five"), 400, "invalid_value", "max_tokens"),
    "temperature as text": (text_request(temperature="0"), 400, "invalid_value", "temperature"),
    "max_tokens zero": (text_request(max_tokens=0), 400, "invalid_value", "max_tokens"),
    "seed beyond 64 bits": (text_request(seed=2**70, temperature=1.0), 400, "invalid_value", "seed"),
    "messages empty": (text_request(messages=[]), 400, "invalid_value", "messages"),
    "content a number": ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400, "invalid_value",
                         "messages[0].content"),
    "function role": ({"model": MODEL, "messages": [{"role": "function", "content": "x"}]}, 400, "invalid_value",
                      "messages[0].role"),
    "unknown part": ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "audio"}]}]}, 400,
                     "invalid_value", "messages[0].content[0]"),
    "image url not a string": ({"model": MODEL, "messages": image_message("x", url=5)}, 400, "invalid_value",
                               "messages[0].content[0].image_url.url"),
    "http image url": ({"model": MODEL, "messages": image_message("x", url="https://example.com/a.png")}, 400,
                       "image_url_not_allowed", "messages[0].content[0].image_url.url"),
    "data url not an image": ({"model": MODEL, "messages": image_message("x", url="data:text/plain;base64,aGk=")},
                              400, "invalid_image_url", "messages[0].content[0].image_url.url"),
    "data url not base64": ({"model": MODEL, "messages": image_message("x", url="data:image/png;base64,%%%")}, 400,
                            "invalid_image", "messages[0].content[0].image_url.url"),
    "undecodable image": ({"model": MODEL, "messages": image_message("x", url=data_url(b"not a png at all"))}, 400,
                          "invalid_image", "messages"),
    "image over the pixel limit": ({"model": MODEL, "messages": image_message(
        "x", url=data_url(png_bytes((9000, 8000), "1")))}, 400, "image_too_large", "messages"),
    "image over the byte limit": ({"model": MODEL, "messages": image_message(
        "x", url=data_url(os.urandom(21 * 2**20)))}, 400, "image_too_large", "messages[0].content[0].image_url.url"),
    "prompt over max_model_len": (text_request(messages=[{"role": "user", "content": "red " * 5000}]), 400,
                                  "context_length_exceeded", "messages"),
    "n=17": (text_request(n=17), 400, "invalid_value", "n"),
    "functions": (text_request(functions=[{"name": "f"}]), 400, "unsupported_parameter", "functions"),
    "unknown field": (text_request(frobnicate=1), 400, "unknown_parameter", "frobnicate"),
    "stream_options without stream": (text_request(stream_options={"include_usage": True}), 400, "invalid_value",
                                      "stream_options"),
    "top_logprobs without logprobs": (text_request(top_logprobs=2), 400, "invalid_value", "top_logprobs"),
    "unknown model": (text_request(model="gpt-4o"), 404, "model_not_found", "model"),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_input_gets_an_openai_error_and_the_engine_keeps_serving(app, client, name):
    body, status, code, param = BAD_REQUESTS[name]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    for stream in (False, True) if isinstance(body, dict) and "stream_options" not in body else (False,):
        data = raw if not stream else json.dumps({**body, "stream": True}).encode()
        r = httpx.post(app + "v1/chat/completions", content=data, headers={"Content-Type": "application/json"},
                       timeout=120)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert (error["code"], error["param"]) == (code, param), error
        assert error["type"] == "invalid_request_error"
    ok = client.chat.completions.create(model=MODEL, messages=image_message("red_circle.png"), temperature=0)
    assert ok.choices[0].message.content == "red"


def test_openai_client_raises_its_typed_errors(client):
    with pytest.raises(openai.BadRequestError, match="n"):
        client.chat.completions.create(model=MODEL, messages=image_message("red_circle.png"), n=17)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=image_message("red_circle.png"))
