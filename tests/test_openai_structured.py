"""Issue #42's OpenAI surface through the `openai` client against `python app.py` (the shipped tiny model):
answers to six JSON schemas parse and validate with `jsonschema` (also streamed), json_object / choice / regex hold,
a named tool and `required` give tool_calls whose arguments validate against the tool's schema, n=3 gives three
choices (choice i is what seed + i draws alone), logit_bias changes the first token (token ids from the
checkpoint's own tokenizer), and bad schemas, regexes, grammars and tools are 400s naming the field, within the
stated compile budget, with the engine serving on. The `auto` tool-call reader is checked against transformers' own
response parser for Qwen (tokenizer.parse_response with its Qwen response template)."""
import json
import re
import time

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer
from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS

from minivlm.api.tool_calls import ToolCallStream, hermes_calls
from minivlm.config import DEFAULT_MODEL
from tests.api_app import MODEL, image_message, text_request
from tests.app_server import APP_MODEL

COLOURS, SHAPES = ["red", "green", "blue", "yellow"], ["circle", "square", "triangle"]
CLOSED = {"additionalProperties": False}  # OpenAI's strict mode asks it of every object (else a free key may follow)
SCHEMAS = {  # bounded as a real user bounds them: a tiny model writes an unbounded string until max_tokens
    "required fields": {"type": "object", **CLOSED, "required": ["answer", "sure"],
                        "properties": {"answer": {"type": "string", "maxLength": 24}, "sure": {"type": "boolean"}}},
    "enums": {"type": "object", **CLOSED, "required": ["colour"], "properties": {"colour": {"enum": COLOURS}}},
    "integer bounds": {"type": "object", **CLOSED, "required": ["count"],
                       "properties": {"count": {"type": "integer", "minimum": 1, "maximum": 3}}},
    "arrays": {"type": "object", **CLOSED, "required": ["shapes"], "properties": {
        "shapes": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"enum": SHAPES}}}},
    "nested object": {"type": "object", **CLOSED, "required": ["shape"], "properties": {"shape": {
        "type": "object", **CLOSED, "required": ["kind", "where"], "properties": {
            "kind": {"enum": SHAPES},
            "where": {"type": "object", **CLOSED, "required": ["x", "y"],
                      "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                     "y": {"type": "integer", "minimum": 0, "maximum": 9}}}}}}},
    "additionalProperties false": {"type": "object", **CLOSED, "required": ["colour", "shape"],
                                   "properties": {"colour": {"enum": COLOURS}, "shape": {"enum": SHAPES},
                                                  "note": {"type": "string", "maxLength": 12}}},
}
REPORT = {"type": "object", "additionalProperties": False, "required": ["shapes"], "properties": {"shapes": {
    "type": "array", "maxItems": 3, "items": {"type": "object", "additionalProperties": False,
                                              "required": ["colour", "shape"],
                                              "properties": {"colour": {"enum": COLOURS}, "shape": {"enum": SHAPES}}}}}}
COUNT = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}
TOOLS = [{"type": "function", "function": {"name": "report_shapes", "description": "the shapes in the picture",
                                           "parameters": REPORT}},
         {"type": "function", "function": {"name": "count_shapes", "parameters": COUNT}}]
PICTURE = image_message("three_shapes.png", "Describe the picture.")


@pytest.fixture(scope="module")
def app(tiny_app_process):
    """The session's `python app.py` (tests/conftest.py), shared with test_app_client.py."""
    return tiny_app_process


@pytest.fixture(scope="module")
def client(app):
    return openai.OpenAI(base_url=app + "v1", api_key="unused", max_retries=0, timeout=120)


def ask(client, messages=PICTURE, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, **{"temperature": 0, **kw})


def streamed(client, messages=PICTURE, **kw) -> dict:
    """A streamed answer put together per choice: {index: (text, {call index: [id, name, arguments]}, finish)}."""
    out = {}
    for chunk in ask(client, messages, stream=True, **kw):
        for c in chunk.choices:
            text, calls, finish = out.get(c.index, ("", {}, None))
            text += c.delta.content or ""
            for part in c.delta.tool_calls or []:
                call = calls.setdefault(part.index, [None, None, ""])
                call[0] = part.id or call[0]
                call[1] = part.function.name or call[1]
                call[2] += part.function.arguments or ""
            out[c.index] = (text, calls, c.finish_reason or finish)
    return out


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_answers_parse_and_validate_also_streamed(client, name):
    schema = SCHEMAS[name]
    fmt = {"type": "json_schema", "json_schema": {"name": name.replace(" ", "_"), "schema": schema, "strict": True}}
    r = ask(client, response_format=fmt, max_tokens=80)
    text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), schema)
    assert r.choices[0].finish_reason == "stop" and "\n" not in text
    text_streamed, _, finish = streamed(client, response_format=fmt, max_tokens=80)[0]
    assert text_streamed == text and finish == "stop"  # greedy: the same answer, put together from its deltas


def test_json_object_choice_and_regex_hold(client):
    counted = ask(client, image_message("two_shapes.png", "How many shapes are there?"),
                  response_format={"type": "json_object"}, max_tokens=40).choices[0].message.content
    assert isinstance(json.loads(counted), dict)
    picked = ask(client, extra_body={"structured_outputs": {"choice": COLOURS}}).choices[0]
    assert picked.message.content in COLOURS and picked.finish_reason == "stop"
    pattern = r"(red|green|blue|yellow) (circle|square|triangle) at [0-9]"
    said = ask(client, extra_body={"structured_outputs": {"regex": pattern}}).choices[0].message.content
    assert re.fullmatch(pattern, said), said
    assert streamed(client, extra_body={"structured_outputs": {"regex": pattern}})[0][0] == said


def test_a_named_tool_and_required_give_valid_tool_calls_also_streamed(client):
    named = ask(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "report_shapes"}},
                max_tokens=80).choices[0]
    assert named.message.content is None and named.finish_reason == "stop"  # as OpenAI answers a forced function
    (call,) = named.message.tool_calls
    assert call.type == "function" and call.function.name == "report_shapes" and call.id.startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(call.function.arguments), REPORT)
    (text, calls, finish), = streamed(client, tools=TOOLS, max_tokens=80,
                                      tool_choice={"type": "function", "function": {"name": "report_shapes"}}).values()
    assert text == "" and finish == "stop" and [c[1:] for c in calls.values()] == [["report_shapes",
                                                                                    call.function.arguments]]
    required = ask(client, tools=TOOLS, tool_choice="required", max_tokens=120).choices[0]
    assert required.finish_reason == "tool_calls" and required.message.tool_calls
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in required.message.tool_calls:
        jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])
    (_, calls, finish), = streamed(client, tools=TOOLS, tool_choice="required", max_tokens=120).values()
    assert finish == "tool_calls"
    assert [c[1:] for c in calls.values()] == [[c.function.name, c.function.arguments]
                                               for c in required.message.tool_calls]
    assert all(c[0].startswith("chatcmpl-tool-") for c in calls.values())
    one = ask(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=120).choices[0]
    assert len(one.message.tool_calls) == 1


def test_tools_in_a_conversation_are_taken_and_tool_choice_none_answers_in_text(client):
    turns = PICTURE + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call-1", "type": "function", "function": {"name": "count_shapes", "arguments": '{"n": 3}'}}]},
        {"role": "tool", "tool_call_id": "call-1", "content": "3"},
        {"role": "user", "content": "Describe the picture."}]
    r = ask(client, turns, tools=TOOLS, tool_choice="none", max_tokens=8).choices[0]
    assert r.message.tool_calls is None and r.message.content


def test_a_tool_result_must_answer_a_call_of_the_assistant_turn_before_it(client):
    """The round trip a client makes: the ids the API gave its calls are answered (200); a result naming another id,
    or with no assistant turn with tool_calls before it, is a 400 naming the message's index and the id (#52.2)."""
    called = ask(client, tools=TOOLS, tool_choice="required", max_tokens=120).choices[0].message
    calls = [c.model_dump(include={"id", "type", "function"}) for c in called.tool_calls]
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "3"} for c in calls]
    turns = PICTURE + [{"role": "assistant", "content": None, "tool_calls": calls}] + results
    answered = ask(client, turns, tools=TOOLS, tool_choice="none", max_tokens=8).choices[0]
    assert answered.message.content and answered.finish_reason in ("stop", "length")
    wrong = turns[:-1] + [{"role": "tool", "tool_call_id": "call-nobody-made", "content": "3"}]
    orphan = PICTURE + [{"role": "tool", "tool_call_id": calls[0]["id"], "content": "3"}]
    after_a_user_turn = turns[:2] + [PICTURE[0]] + results  # the user spoke in between: nothing is being answered
    cases = [(wrong, len(wrong) - 1, "call-nobody-made", "tool_call_id"), (orphan, 1, calls[0]["id"], "role"),
             (after_a_user_turn, 3, calls[0]["id"], "role")]
    for messages, index, named, field in cases:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as e:
                ask(client, messages, tools=TOOLS, max_tokens=8, stream=stream)
            error = e.value.body
            assert f"messages[{index}]" in error["message"] and named in error["message"], error
            assert error["param"] == f"messages[{index}].{field}" and error["code"] == "invalid_value", error
    assert ask(client, turns, tools=TOOLS, tool_choice="none", max_tokens=8).choices[0].message.content


def test_n_3_gives_three_choices_each_what_its_seed_draws_alone(client):
    kw = dict(temperature=1.5, max_tokens=6, extra_body={"ignore_eos": True}, logprobs=True, top_logprobs=2)
    r = client.chat.completions.create(model=MODEL, messages=PICTURE, n=3, seed=40, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:  # choice i draws with seed + i (the engine's rule), so it equals that request alone
        alone = client.chat.completions.create(model=MODEL, messages=PICTURE, seed=40 + c.index, **kw).choices[0]
        assert c.message.content == alone.message.content
        assert [e.token for e in c.logprobs.content] == [e.token for e in alone.logprobs.content]
        assert len(c.logprobs.content) == 6 and all(len(e.top_logprobs) == 2 for e in c.logprobs.content)
    assert r.usage.completion_tokens == 18
    ids = r.model_extra["minivlm"]["request_ids"]
    assert ids[0] == r.model_extra["minivlm"]["request_id"] and ids[1:] == [f"{ids[0]}#1", f"{ids[0]}#2"]
    parts = streamed(client, PICTURE, n=3, seed=40, **kw)
    assert {i: p[0] for i, p in parts.items()} == {c.index: c.message.content for c in r.choices}
    assert {p[2] for p in parts.values()} == {"length"}


def test_logit_bias_changes_the_first_token_and_penalties_reach_the_sampler(client):
    tokenizer = AutoTokenizer.from_pretrained(APP_MODEL or DEFAULT_MODEL)
    plain = ask(client, max_tokens=3, logprobs=True).choices[0].logprobs.content[0].token
    blue = tokenizer.convert_tokens_to_ids("blue")
    assert plain != "blue"
    biased = ask(client, max_tokens=3, logprobs=True, logit_bias={str(blue): 100}).choices[0]
    assert biased.logprobs.content[0].token == "blue"
    banned = ask(client, max_tokens=3, logprobs=True,
                 logit_bias={str(tokenizer.convert_tokens_to_ids(plain)): -100}).choices[0]
    assert banned.logprobs.content[0].token != plain
    base = ask(client, max_tokens=24, extra_body={"ignore_eos": True}).choices[0].message.content
    repeated = ask(client, max_tokens=24, extra_body={"ignore_eos": True, "repetition_penalty": 10.0})
    assert repeated.choices[0].message.content != base
    frequent = ask(client, max_tokens=24, extra_body={"ignore_eos": True}, frequency_penalty=2.0)
    assert frequent.choices[0].message.content != base


def nested(depth: int) -> dict:
    schema = {"type": "integer", "maximum": 3}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"], "additionalProperties": False}
    return schema


def rf(schema) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def so(**kind) -> dict:
    return {"structured_outputs": kind}


BAD = {  # name: (fields, param)
    "schema of an unknown type": (rf({"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
                                  "response_format.json_schema.schema"),
    "schema not an object": (rf("integer"), "response_format.json_schema.schema"),
    "json_schema without its object": ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    "regex that does not compile": (so(regex="[a-z"), "structured_outputs.regex"),
    "grammar that fails": (so(grammar="root ::= undefined_rule"), "structured_outputs.grammar"),
    "json that is not JSON": (so(json="{not json"), "structured_outputs.json"),
    "two kinds at once": (so(regex="a", choice=["a"]), "structured_outputs"),
    "empty choice": (so(choice=[]), "structured_outputs.choice"),
    "both response_format and structured_outputs": ({**rf(SCHEMAS["enums"]), **so(regex="a")}, "structured_outputs"),
    "tool whose parameters are not a schema": ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": 5}}}]}, "tools[0].function.parameters"),
    "tool whose parameters are a list": ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": [1]}}]}, "tools[0].function.parameters"),
    "named tool that is not among the tools": ({"tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    "required without tools": ({"tool_choice": "required"}, "tool_choice"),
    "forced tool and a response_format": ({"tools": TOOLS, "tool_choice": "required", **rf(REPORT)}, "tool_choice"),
    "logit_bias key not a token id": ({"logit_bias": {"blue": 5}}, "logit_bias"),
    "logit_bias beyond the vocabulary": ({"logit_bias": {"100000": 5}}, "logit_bias"),
    "logit_bias over 100": ({"logit_bias": {"5": 500}}, "logit_bias"),
    "n over 16": ({"n": 17}, "n"),
    "presence_penalty over 2": ({"presence_penalty": 3}, "presence_penalty"),
    "repetition_penalty 0": ({"repetition_penalty": 0}, "repetition_penalty"),
    "tool message without its call id": ({"messages": [{"role": "tool", "content": "3"}]},
                                         "messages[0].tool_call_id"),
    "tool message answering no call": ({"messages": [
        {"role": "user", "content": "?"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call-1", "type": "function", "function": {"name": "count_shapes", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call-2", "content": "3"}]}, "messages[2].tool_call_id"),
    "tool message with no call before it": ({"messages": [{"role": "user", "content": "?"},
                                                          {"role": "tool", "tool_call_id": "call-1", "content": "3"}]},
                                            "messages[1].role"),
    # pathological: refused within the compile budget (docs/HTTP_API.md), never a stall or a 500
    "schema nested 200 deep": (rf(nested(200)), "response_format.json_schema.schema"),
    "regex (a{1000}){1000}": (so(regex="(a{1000}){1000}"), "structured_outputs.regex"),
    "regex (a?){500}a{500}": (so(regex="(a?){500}a{500}"), "structured_outputs.regex"),
    "schema with 2,000 optional properties": (rf({"type": "object", "properties": {
        f"p{i}": {"type": "integer"} for i in range(2000)}}), "response_format.json_schema.schema"),
    "grammar of 9,000 alternatives": (so(grammar="root ::= " + " | ".join(f'"t{i}"' for i in range(9000))),
                                      "structured_outputs.grammar"),
}
BUDGET_S = 5  # what a refusal may take end to end on a busy 2-core CPU (measured: under 2 s, docs/HTTP_API.md)


@pytest.mark.parametrize("name", list(BAD))
def test_bad_constraints_are_400s_naming_the_field_and_the_engine_serves_on(app, client, name):
    fields, param = BAD[name]
    for stream in (False, True):
        start = time.monotonic()
        r = httpx.post(app + "v1/chat/completions", json=text_request(**fields, stream=stream), timeout=120)
        assert time.monotonic() - start < BUDGET_S
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.json()
    assert ask(client, image_message("red_circle.png")).choices[0].message.content == "red"


def test_a_regex_of_10000_alternatives_compiles_within_the_budget(client):
    words = [f"{c}{i}" for i in range(2500) for c in COLOURS]
    start = time.monotonic()
    said = ask(client, extra_body={"structured_outputs": {"regex": "|".join(words)}}).choices[0].message.content
    assert time.monotonic() - start < BUDGET_S and said in words


QWEN_TEMPLATE = next(v for k, v in _RESPONSE_TEMPLATE_FALLBACKS.items() if "qwen3_vl" in k)
ANSWERS = [  # what a Qwen model writes after <|im_start|>assistant\n
    'Let me look.\n<tool_call>\n{"name": "count_shapes", "arguments": {"n": 3}}\n</tool_call>',
    '<tool_call>\n{"name": "report_shapes", "arguments": {"shapes": [{"colour": "red", "shape": "circle"}]}}\n'
    '</tool_call>\n<tool_call>\n{"name": "count_shapes", "arguments": {"n": 1}}\n</tool_call>',
    "No tool is needed: a red circle.",
]


@pytest.mark.parametrize("answer", ANSWERS)
def test_auto_reads_qwens_tool_calls_as_transformers_own_parser_does_also_streamed(answer):
    truth = AutoTokenizer.from_pretrained(APP_MODEL or DEFAULT_MODEL).parse_response(
        answer, QWEN_TEMPLATE, prefix="<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    content, calls = hermes_calls(answer)
    want = [(c["function"]["name"], c["function"]["arguments"]) for c in truth.get("tool_calls", [])]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == want
    assert (content or "").strip() == truth.get("content", "").strip()
    stream, pieces = ToolCallStream("auto"), []
    for end in range(len(answer) + 1):  # the text growing a character at a time
        pieces.append(stream.update(answer[:end], final=end == len(answer)))
    assert "".join(p.get("content", "") for p in pieces) == (content or "")
    assert [(p["function"]["name"], p["function"]["arguments"]) for d in pieces for p in d.get("tool_calls", [])] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


QWEN3_5_TEMPLATE = next(v for k, v in _RESPONSE_TEMPLATE_FALLBACKS.items() if "qwen3_5" in k)
XML_ANSWERS = [  # what Qwen3.5 (and Qwen3-Coder) write: the XML form inside <tool_call>
    'Let me count.\n<tool_call>\n<function=count_shapes>\n<parameter=n>\n3\n</parameter>\n<parameter=colour>\nred\n'
    '</parameter>\n<parameter=where>\n{"x": 1, "y": [2]}\n</parameter>\n<parameter=exact>\ntrue\n</parameter>\n'
    '</function>\n</tool_call>',
    '<tool_call>\n<function=report_shapes>\n<parameter=shapes>\n[{"colour": "blue", "shape": "square"}]\n</parameter>\n'
    '<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=count_shapes>\n'
    '<parameter=n>\n1.5\n</parameter>\n</function>\n</tool_call>',
]
XML_SCHEMAS = {"count_shapes": {"type": "object", "properties": {"n": {"type": "number"}, "colour": {"type": "string"},
                                                                  "where": {"type": "object"},
                                                                  "exact": {"type": "boolean"}}},
               "report_shapes": {"type": "object", "properties": {"shapes": {"type": "array"},
                                                                   "note": {"type": "string"}}}}


@pytest.mark.parametrize("answer", XML_ANSWERS)
def test_auto_reads_qwen3_5s_xml_tool_calls_as_transformers_parser_splits_them_typed_by_the_schema(answer):
    """transformers' own Qwen3.5 response parser splits the XML into names and string values; the calls hold the same
    names and values, each typed by its parameter's schema (vLLM's qwen3_coder rules), also streamed."""
    from minivlm.api.tool_calls import typed
    truth = AutoTokenizer.from_pretrained(APP_MODEL or DEFAULT_MODEL).parse_response(
        answer, QWEN3_5_TEMPLATE, prefix="<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    content, calls = hermes_calls(answer, XML_SCHEMAS)
    want = [(c["function"]["name"], {k: typed(v, XML_SCHEMAS[c["function"]["name"]]["properties"][k])
                                     for k, v in c["function"]["arguments"].items()}) for c in truth["tool_calls"]]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == want
    assert (content or "").strip() == (truth.get("content") or "").strip()
    first = json.loads(calls[0]["function"]["arguments"])
    assert first in ({"n": 3, "colour": "red", "where": {"x": 1, "y": [2]}, "exact": True},
                     {"shapes": [{"colour": "blue", "shape": "square"}], "note": None})
    stream, pieces = ToolCallStream("auto", schemas=XML_SCHEMAS), []
    for end in range(len(answer) + 1):
        pieces.append(stream.update(answer[:end], final=end == len(answer)))
    assert [(p["function"]["name"], p["function"]["arguments"]) for d in pieces for p in d.get("tool_calls", [])] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
