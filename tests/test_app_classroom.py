"""A classroom's engine, shared by every page (python app.py, the session's app process, driven by gradio_client): a
pause by one page is said in the others' chats and KV tabs and any page resumes it; a picture-less or untrained
question gets a hint, not an unexplained guess; a long answer reaches the page in coalesced updates."""
import json
import time

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from tests.app_server import APP_MODEL
from tests.test_app_client import SAMPLING, image

pytestmark = pytest.mark.skipif(APP_MODEL is not None, reason="the hints are the shipped tiny model's")
PAUSED = "The engine is paused for step-through"


@pytest.fixture(scope="module")
def url(tiny_app_process):
    """The session's app process (tests/conftest.py): a classroom's engine is any engine every page shares."""
    return tiny_app_process


def texts(history) -> list[str]:
    return [c["text"] for m in history for c in m["content"] if c["type"] == "text"]


def wait_for(job, predicate, timeout=60.0):
    """The first output of a streaming job for which predicate holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for out in job.outputs():
            if predicate(out):
                return out
        assert not job.done() or any(predicate(o) for o in job.outputs()), job.outputs()[-1:]
        time.sleep(0.05)
    raise AssertionError(f"no such output within {timeout} s: {job.outputs()[-1:]}")


@pytest.mark.slow  # one of the default run's longest (> 20 s on 2 cores); CI runs it with -m slow
def test_a_pause_is_said_in_every_page_and_any_page_resumes_it(url):
    teacher, student = Client(url, verbose=False), Client(url, verbose=False)
    teacher.predict(api_name="/kv_pause")
    try:
        msg = {"text": "What color is the shape?", "files": [image("blue_circle.png")]}
        job = student.submit(msg, [], *SAMPLING, False, "", api_name="/chat")
        # the question is drawn at once, then the answer's place says why nothing comes
        asked = wait_for(job, lambda out: "What color is the shape?" in texts(out[0]))
        assert asked[0][-1]["role"] == "user"
        waiting = wait_for(job, lambda out: any(PAUSED in t for t in texts(out[0])))
        assert waiting[0][-1]["role"] == "assistant" and not job.done()
        summary = student.predict(api_name="/kv_snapshot")[2]  # the student's KV tab (no run of its own)
        assert "paused by step-through" in summary and "Run (resume)" in summary
        student.predict(api_name="/kv_resume")  # not the page that paused: it resumes all the same
        history, _, stats = job.result()
        assert texts(history)[-1] == "blue" and not any(PAUSED in t for t in texts(history))
        assert "finish: stop" in stats
    finally:
        teacher.predict(api_name="/kv_resume")
    assert "paused" not in student.predict(api_name="/kv_snapshot")[2]


def test_a_question_without_a_picture_gets_a_hint_and_is_not_sent(url):
    client = Client(url, verbose=False)
    before = client.predict(api_name="/kv_snapshot")[2]
    history, _, stats = client.predict({"text": "What color is the shape?", "files": []}, [], *SAMPLING, False, "",
                                       api_name="/chat")
    assert history[-1]["metadata"]["title"] == "ⓘ hint"
    assert "attach one" in texts(history)[-1] and "Where is the {colour} {shape}?" in texts(history)[-1]
    assert "not sent to the model" in stats
    step = lambda summary: int(summary.split("**step ")[1].split("**")[0])  # noqa: E731
    assert step(client.predict(api_name="/kv_snapshot")[2]) == step(before)  # the engine took no step for it
    # with the picture attached next, the hinted question is not part of the conversation the engine sees
    history, _, stats = client.predict({"text": "What color is the shape?", "files": [image("red_circle.png")]},
                                       history, *SAMPLING, False, "", api_name="/chat")
    assert texts(history)[-1] == "red" and "finish: stop" in stats


@pytest.mark.parametrize("question", ["What colour is the shape?", "Quelle est la couleur de la forme ?",
                                      "这个形状有多大？"])
def test_an_untrained_question_is_answered_with_a_note(url, question):
    client = Client(url, verbose=False)
    history, _, stats = client.predict({"text": question, "files": [image("red_circle.png")]}, [], *SAMPLING,
                                       False, "", api_name="/chat")
    roles = [m["role"] for m in history]
    assert roles == ["user", "user", "assistant", "assistant"] or roles == ["user", "assistant", "assistant"]
    note = texts(history)[-1]
    assert history[-1]["metadata"]["title"] == "ⓘ hint" and "is a guess" in note and question[:20] in note
    assert "finish:" in stats  # the model did answer; the note says what its answer is worth


@pytest.mark.parametrize("question,answer", [("  what color is the shape? ", "red"),
                                             ("这个形状是什么颜色?", "红色")])
def test_a_trained_question_gets_no_note(url, question, answer):
    """In either language the model was trained in (a half-width question mark is the same question)."""
    history, _, _ = Client(url, verbose=False).predict(
        {"text": question, "files": [image("red_circle.png")]}, [], *SAMPLING, False, "", api_name="/chat")
    assert not (history[-1].get("metadata") or {}).get("title") and texts(history)[-1] == answer


@pytest.mark.slow  # one of the default run's longest (> 20 s on 2 cores); CI runs it with -m slow
def test_a_long_answer_reaches_the_page_in_coalesced_updates(url):
    msg = {"text": "Describe the picture.", "files": [image("three_shapes.png")]}
    job = Client(url, verbose=False).submit(msg, [], 600, *SAMPLING[1:], True, "", api_name="/chat")
    history, _, stats = job.result()
    tokens = int(stats.split()[0])
    assert tokens == 600
    # one page update per token before; now at most ~20 a second whatever the engine's speed
    assert len(job.outputs()) < tokens / 3, len(job.outputs())
    assert len(texts(history)[-1]) > 600  # and nothing of the answer was lost on the way


def test_a_bad_seed_is_refused_in_plain_words(url):
    history, _, _ = Client(url, verbose=False).predict(
        {"text": "What color is the shape?", "files": [image("red_circle.png")]}, [], 16, 0.0, 1.0, 0, "12a", False,
        "", api_name="/chat")
    assert history[-1]["metadata"]["title"] == "⚠️ request refused"
    assert "not “12a”" in texts(history)[-1] and "'12a'" not in texts(history)[-1]


def test_the_page_says_which_questions_the_model_knows(url):
    config = json.loads(__import__("urllib.request").request.urlopen(url + "config").read())
    notes = [c["props"].get("value") for c in config["components"] if c["props"].get("elem_id") == "chat-trained"]
    assert notes and "How many shapes are there?" in notes[0] and "Is there a {colour} {shape}?" in notes[0]
