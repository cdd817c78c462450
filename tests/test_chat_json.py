"""The Chat tab's JSON answer (#42) through gradio_client against the app served in this process: every preset's
answer parses and validates against its schema with `jsonschema`, a schema box that is not JSON and a schema the
grammar cannot compile are refused in the chat (the app serves on), the parsed result and its line are what the
answer says, and the KV tab's decision log says for each constrained step how many tokens the grammar allowed and
which one was chosen (the engine's `constrained` events, counted against the answer's tokens)."""
import json
import os

import jsonschema
import pytest
from gradio_client import Client, handle_file

from panels import chat_json
from panels.decisions import decision_log
from panels.holder import EXAMPLES_DIR
from panels.i18n import EN, ZH, t
from tests.app_server import app_in_process

SAMPLING = (200, 0.0, 1.0, 0, "", False, "")  # max tokens, temperature, top-p, top-k, seed, ignore EOS, system


@pytest.fixture(scope="module")
def app():
    with app_in_process(num_blocks=256) as (holder, url):
        yield holder, Client(url, verbose=False)


def ask(client, schema: str, picture="three_shapes.png", question="Describe the picture."):
    msg = {"text": question, "files": [handle_file(os.path.join(EXAMPLES_DIR, picture))]}
    history, _, stats = client.predict(msg, [], *SAMPLING, schema, api_name="/chat")
    return history, stats


@pytest.mark.parametrize("preset", list(chat_json.PRESETS))
def test_every_presets_answer_parses_and_validates(app, preset):
    holder, client = app
    since = holder.get().snapshot().last_event_seq
    history, stats = ask(client, chat_json.preset_schema(preset))
    text = history[-1]["content"][0]["text"]
    jsonschema.validate(json.loads(text), chat_json.PRESETS[preset])
    assert "finish: stop" in stats
    value, line = chat_json.parsed([{"role": "assistant", "content": text}], chat_json.preset_schema(preset), EN)
    assert value == json.loads(text) and line == t(EN, "chat.json_parsed")
    events = [ev for ev in holder.get().events(since) if ev.kind == "constrained"]
    assert events and "".join(ev.fields["text"] for ev in events) == text  # one event per token, in order
    assert all(0 < ev.fields["allowed"] <= ev.fields["vocab"] for ev in events)
    log = decision_log(holder.get().events(since), max_steps=10_000)
    first = events[0].fields
    assert f"grammar allowed {first['allowed']} of {first['vocab']} tokens; it chose {first['text']!r}" in log


@pytest.mark.parametrize("schema, said", [('{"type": "object",', "does not hold JSON"),
                                          ('[1, 2]', "must be a JSON object"),
                                          ('{"type": "no-such-type"}', "structured_outputs.json does not compile")])
def test_a_bad_schema_is_refused_in_the_chat_and_the_app_serves_on(app, schema, said):
    _, client = app
    history, _ = ask(client, schema)
    assert history[-1]["metadata"]["title"] == t(EN, "chat.error_title") and said in history[-1]["content"][0]["text"]
    history, _ = ask(client, "", "red_circle.png", "What color is the shape?")
    assert history[-1]["content"][0]["text"].strip() == "red"


def test_the_parsed_line_says_a_capped_answer_never_closed_and_a_free_answer_shows_nothing():
    schema = chat_json.preset_schema("shapes")
    assert chat_json.parsed([{"role": "assistant", "content": '{"shapes": [{"col'}], schema, ZH) == \
        (None, t(ZH, "chat.json_unfinished"))
    assert chat_json.parsed([{"role": "assistant", "content": "red"}], "", EN) == (None, "")
    assert chat_json.preset_schema("none") == "" and chat_json.structured("  ", EN) is None
