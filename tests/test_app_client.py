"""Every endpoint of the running app (python app.py, started as a process) through gradio_client."""
import json
import os
import time

import pytest
from gradio_client import Client, handle_file

from minivlm import EngineConfig

from tests.app_server import APP_MODEL

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "examples")
NUM_BLOCKS = 256  # the session's app process (tiny_app_process): room for the 3000-token stream Stop interrupts
SAMPLING = (16, 0.0, 1.0, 0, "")  # max tokens, temperature, top-p, top-k, seed (empty = the engine's)


def image(name: str):
    return handle_file(os.path.join(EXAMPLES, name))


def resend(history) -> list:
    """A chat history as gradio_client returned it (files as local paths), ready to be sent back."""
    return [{**m, "content": [{**c, "file": handle_file(c["file"])} if c["type"] == "file" else c
                              for c in m["content"]]} for m in history]


def ask(client, text, files, history=(), ignore_eos=False, max_tokens=16):
    msg = {"text": text, "files": [image(f) for f in files]}
    return client.predict(msg, resend(history), max_tokens, *SAMPLING[1:], ignore_eos, api_name="/chat")


def answer(history) -> str:
    return history[-1]["content"][0]["text"].strip()


@pytest.fixture(scope="module")
def url(tiny_app_process):
    """The session's `python app.py --num-blocks 256` (tests/conftest.py), shared with test_openai_structured.py."""
    return tiny_app_process


@pytest.fixture
def client(url):
    return Client(url, verbose=False)


def test_every_endpoint_and_parameter_is_named_for_a_person(client):
    info = client.view_api(print_info=False, return_format="dict")
    named = info["named_endpoints"]
    assert {"/rebuild", "/engine_status", "/chat", "/regenerate", "/stop", "/kv_snapshot", "/kv_launch", "/kv_replay",
            "/inspect", "/vram"} <= set(named) and not info["unnamed_endpoints"]
    for name, endpoint in named.items():
        for p in endpoint["parameters"]:
            assert len(p["parameter_name"]) >= 4 and p["label"] and "value_" not in p["parameter_name"], (name, p)
        for r in endpoint["returns"]:
            assert r["label"] and not r["label"].startswith("value_"), (name, r)
        assert "between 0 and 1" not in json.dumps(endpoint["returns"]), name
    seed = next(p for p in named["/chat"]["parameters"] if p["parameter_name"] == "seed")
    assert seed["parameter_has_default"] and seed["parameter_default"] == ""  # empty = the engine's seed
    assert EngineConfig().model not in json.dumps(info)  # no absolute server path in any choice


def test_chat_answers_multi_turn_from_the_prefix_cache(client):
    history, _, stats = ask(client, "What color is the shape?", ["red_circle.png"])
    assert answer(history) == "red" and "finish: stop" in stats
    history, _, stats = ask(client, "What color is the shape?", ["blue_circle.png"], history)
    assert "finish: stop" in stats  # (the tiny model was trained on single turns: its answer here is not tested)
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    cached = int(stats.split(" tokens, ")[1].split()[0])
    assert cached >= 16, stats  # the first turn's full blocks come back from the prefix cache


def test_regenerate_answers_the_last_question_again(client):
    history, _, _ = ask(client, "What color is the shape?", ["yellow_square.png"])
    again, _, stats = client.predict(resend(history), *SAMPLING, False, "", api_name="/regenerate")
    assert [m["role"] for m in again] == ["user", "assistant"] and answer(again) == "yellow"
    assert "finish: stop" in stats and int(stats.split(" tokens, ")[1].split()[0]) >= 16  # its prompt was cached


def test_system_prompt_goes_before_the_conversation(client):
    msg = {"text": "What shape is it?", "files": [image("green_triangle.png")]}
    plain = client.predict(msg, [], *SAMPLING, False, "", api_name="/chat")[2]
    system = client.predict(msg, [], *SAMPLING, False, "Answer in one word.", api_name="/chat")[2]
    prompt_tokens = [int(s.split("prompt ")[1].split()[0]) for s in (plain, system)]
    assert prompt_tokens[1] > prompt_tokens[0]


def test_bad_image_is_refused_and_the_app_keeps_serving(client, tmp_path):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png at all")
    history, _, stats = client.predict({"text": "What color?", "files": [handle_file(str(bad))]}, [], *SAMPLING,
                                       False, api_name="/chat")
    assert history[-1]["metadata"]["title"] == "⚠️ request refused"
    # once (in the bubble, not again in the stats line), with the file's own name, not the server's temp path
    assert "not a readable image" in answer(history) and "(broken.png)" in answer(history)
    assert "/" not in answer(history) and "not a readable image" not in stats
    history, _, _ = ask(client, "What color is the shape?", ["green_triangle.png"], history)
    assert answer(history) == "green"


def test_stop_aborts_the_stream(client):
    msg = {"text": "What color is the shape?", "files": [image("red_circle.png")]}
    job = client.submit(msg, [], 3000, *SAMPLING[1:], True, api_name="/chat")
    while len(job.outputs()) < 3:
        assert not job.done(), job.result()
        time.sleep(0.01)
    client.predict(api_name="/stop")
    stats = job.result()[2]
    assert "finish: abort" in stats and int(stats.split()[0]) < 3000


def test_kv_launch_replay_and_snapshot(client):
    plot, table, summary, timeline, log, slider = client.predict(6, 24, api_name="/kv_launch")
    fig = json.loads(plot["plot"])
    z = [v for row in fig["data"][0]["z"] for v in row if v is not None]
    used = int(summary.split("blocks used ")[1].split()[0])
    assert len(z) == NUM_BLOCKS and sum(v >= 2 for v in z) == used > 0
    assert len(table["data"]) >= used and slider["minimum"] <= slider["value"] <= slider["maximum"]
    assert summary.startswith(f"**step {slider['value']}** · **replay**")
    assert "6 requests arrived, 6 finished" in summary
    assert len(json.loads(timeline["plot"])["data"][0]["y"]) == 6 and "arrived" in log  # the whole run, from events
    first = slider["minimum"]  # a finished launch opens at its fullest step; its minimum is before the first arrival
    _, _, replayed, _, log_then, _ = client.predict(first, api_name="/kv_replay")
    assert replayed.startswith(f"**step {first}** · **replay**") and "blocks used 0 /" in replayed
    assert log_then.startswith("_No decisions yet")
    _, _, now, *_ = client.predict(api_name="/kv_snapshot")
    assert "running 0 · waiting 0" in now


def test_inspect_same_text_different_image(client):
    table, _ = client.predict(image("red_circle.png"), image("blue_circle.png"), "What color is the shape?", "",
                              "processor default", "processor default", 4, api_name="/inspect")
    rows = {r[0]: dict(zip(table["headers"], r)) for r in table["data"]}
    assert rows["A"]["false hits"] > 0 and rows["C"]["false hits"] == 0 and rows["B"]["false hits"] == 0
    assert rows["C"]["answer · image 2"] == rows["C"]["cold answer · image 2"] == "blue"
    assert rows["A"]["answer · image 2"] == "red"  # the red circle's KV answered for the blue one
    assert float(rows["A"]["max |Δlogprob| vs cold"]) > 1.0 and float(rows["C"]["max |Δlogprob| vs cold"]) == 0


def test_vram_presets_and_this_engine(client):
    args = ["Qwen2.5-VL-3B-Instruct", "L4", 24, 0.9, 1024, 768, 1, 4096, 8, "bfloat16", "auto", 16]
    head_l4, _, versus, _ = client.predict(*args, api_name="/vram")
    args[1] = "H100 80GB"
    head_h100, _, _, _ = client.predict(*args, api_name="/vram")
    args[1] = "custom size"  # 24 GiB: a little more than the L4's 22.5 GiB
    head_24, _, _, _ = client.predict(*args, api_name="/vram")
    blocks = [int(h.split(": ")[1].split()[0].replace(",", "")) for h in (head_l4, head_h100, head_24)]
    assert blocks[1] > 3 * blocks[0] > 0 and blocks[0] < blocks[2] < blocks[1]
    with open(os.path.join(APP_MODEL or EngineConfig().model, "config.json")) as f:
        text = json.load(f)["text_config"]
    per_token = 2 * text["num_hidden_layers"] * text["num_key_value_heads"] * text["head_dim"] * 4  # fp32 on CPU
    engine = {r[0]: r[2] for r in versus["data"]}
    assert engine["KV blocks"] == str(NUM_BLOCKS) and engine["KV bytes / token"] == f"{per_token:,}"


def test_rebuild_reports_the_new_engine_and_refuses_bad_settings(client):
    model = APP_MODEL or EngineConfig().model
    status, *_ = client.predict(model, "cpu", "float32", 16, 48, "A", "", api_name="/rebuild")
    assert "48 blocks × 16 = **768 tokens**" in status and "prefix cache: A" in status
    status, _, device, *_ = client.predict(model, "cuda", "float32", 16, 48, "A", "", api_name="/rebuild")
    assert status.startswith("⚠️ cuda is not available") and device == "cpu"
    status, shown, *_, strategy = client.predict("no/such-model-offline", "cpu", "float32", 16, 48, "C", "",
                                                 api_name="/rebuild")
    assert "could not fetch model 'no/such-model-offline'" in status and "Still serving" in status
    assert "--local-dir &lt;dir&gt;" in status  # shown as text, not swallowed as a tag
    assert (shown, strategy) == (os.path.basename(model), "A")  # the header shows what still serves
    status, *_ = client.predict(model, "cpu", "float32", 16, NUM_BLOCKS, "C", "", api_name="/rebuild")
    assert f"{NUM_BLOCKS} blocks" in status and "prefix cache: C" in status
