"""Refusals are data (#39 item 6): the HTTP API answers a refusal's code and param, the Chinese page says its reason
from its fields. Neither reads the English wording, so a reworded refusal keeps its HTTP code and its Chinese."""
import io
import json
import pickle

import httpx
import pytest
from PIL import Image

from minivlm import Refused, Request, SamplingParams
from minivlm.engine import intake
from minivlm.inputs import image_limits
from minivlm.refusals import Name
from panels.i18n import ZH, t
from panels.i18n.errors import localize_error
from tests.api_app import MODEL, data_url, image_message, inprocess_app, text_request


def png(size) -> bytes:
    buf = io.BytesIO()
    Image.new("1", size).save(buf, format="PNG")
    return buf.getvalue()


HUGE = png((9000, 8000))  # 72 MP, over the 64 MP limit per image
# name: (the module and template that word it, a new wording, the HTTP body, the same request for the engine)
CASES = {
    "image over the pixel limit": (image_limits, "IMAGE_PIXELS_WH", "the engine will not take {name} ({size}, {pixels} "
                                   "> {limit})", {"model": MODEL, "messages": image_message("x", url=data_url(HUGE))},
                                   Request(prompt="x", images=[HUGE])),
    "prompt over max_model_len": (intake, "PROMPT_TOO_LONG", "{n} prompt tokens do not fit {limit}",
                                  text_request(messages=[{"role": "user", "content": "red " * 5000}]),
                                  Request(prompt="red " * 5000)),
}


@pytest.fixture(scope="module")
def served():
    with inprocess_app(num_blocks=64) as (holder, url):
        yield holder, url


def answer(url: str, body: dict) -> list[tuple[int, dict]]:
    """(status, error) of the body sent plain and streamed."""
    out = []
    for stream in (False, True):
        r = httpx.post(url + "v1/chat/completions", content=json.dumps({**body, "stream": stream}),
                       headers={"Content-Type": "application/json"}, timeout=120)
        out.append((r.status_code, r.json()["error"]))
    return out


def refusal(engine, request: Request) -> Refused:
    with pytest.raises(Refused) as e:
        engine.submit(request, SamplingParams(max_tokens=4))
    assert not engine.has_unfinished()  # refused at submit: nothing was queued
    return e.value


@pytest.mark.parametrize("case", list(CASES))
def test_a_reworded_refusal_keeps_its_http_code_and_its_chinese_sentence(served, monkeypatch, case):
    holder, url = served
    module, template, reworded, body, request = CASES[case]
    before_http, before = answer(url, body), refusal(holder.get(), request)
    monkeypatch.setattr(module, template, reworded)
    after_http, after = answer(url, body), refusal(holder.get(), request)
    assert str(after) != str(before) and str(after) == reworded.format(**after.fields)  # the English changed
    for (status, error), (status_0, error_0) in zip(after_http, before_http):
        assert status == status_0 == 400 and error["message"] == str(after) != error_0["message"]
        assert (error["code"], error["param"], error["type"]) == (error_0["code"], error_0["param"], error_0["type"])
        assert error["code"] == after.code in ("image_too_large", "context_length_exceeded")
    assert localize_error(after, ZH) == localize_error(before, ZH) != str(before)  # the same Chinese sentence


def test_a_refusal_is_a_value_error_with_its_data_and_survives_pickling():
    name = image_limits.image_name("/tmp/uploads/cat.png", 1)
    assert isinstance(name, Name) and name == "image 2 (cat.png)" and (name.kind, name.number) == ("image", 2)
    with pytest.raises(ValueError, match="over the 64 MP limit per image") as e:
        image_limits.check_size(9000, 8000, name)
    error = e.value
    assert (error.code, error.param, error.reason) == ("image_too_large", "messages", "image_pixels_wh")
    assert error.fields == {"name": name, "size": "9000x8000", "pixels": "72 MP", "limit": "64 MP"}
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.code, again.fields["name"].number) == (str(error), error.code, 2)
    assert localize_error(error, ZH).startswith("图片 2 (cat.png) 为 9000x8000")


@pytest.mark.parametrize("make, param, reason", [
    (lambda: SamplingParams(max_tokens=0), "max_tokens", "sampling_param"),
    (lambda: SamplingParams(top_p=2.0), "top_p", "sampling_param"),
    (lambda: Request(prompt="  ").to_messages(), "messages", "empty_request"),
    (lambda: Request(messages=[]).to_messages(), "messages", "messages_shape")])
def test_a_bad_request_or_sampling_parameter_is_refused_naming_its_param(make, param, reason):
    with pytest.raises(Refused) as caught:
        make()
    e = caught.value
    assert (e.code, e.param, e.reason) == ("invalid_value", param, reason)
    said = localize_error(e, ZH)
    assert said != str(e) and said == t(ZH, f"error.{reason}", **e.fields)  # the Chinese page keys on the reason
