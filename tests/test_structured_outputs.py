"""Structured outputs, n, penalties and logit_bias in the engine (#42), against independent truths: the grammar library's
own matcher says, step by step, which tokens a grammar allows (and the engine reports exactly that many); answers
validate against their JSON Schema with `jsonschema`; penalties change logits by the hand-computed amounts; the n
choices of a request share the prompt's block ids; a bad grammar is refused naming the field and the engine serves on."""
import json
import os

import jsonschema
import llguidance
import llguidance.hf
import pytest
import torch
from PIL import Image

from minivlm import Engine, EngineConfig, Request, SamplingParams, StructuredOutputsParams as SO
from minivlm.engine.sampling.grammar_masks import MaskFiller, default_mode
from minivlm.engine.sampling.logits_shaping import shape_logits
from minivlm.refusals import Refused
from panels.holder import EXAMPLES_DIR

PICTURE = Image.open(os.path.join(EXAMPLES_DIR, "three_shapes.png"))
SHAPES = {"type": "object", "additionalProperties": False, "required": ["shapes", "count"],
          "properties": {"count": {"type": "integer", "minimum": 0, "maximum": 9},
                         "shapes": {"type": "array", "maxItems": 3, "items": {
                             "type": "object", "additionalProperties": False, "required": ["colour", "shape"],
                             "properties": {"colour": {"enum": ["red", "blue", "green", "yellow"]},
                                            "shape": {"enum": ["circle", "square", "triangle"]},
                                            "where": {"type": "object", "properties": {"x": {"type": "integer"}}}}}}}}


@pytest.fixture(scope="module")
def engine():
    with Engine(EngineConfig(device="cpu", num_blocks=128)) as e:
        yield e


def ask(engine, so, n_tokens=40, **kw):
    return engine.generate(Request(prompt="What shapes are in the picture?", images=[PICTURE]),
                           SamplingParams(max_tokens=n_tokens, structured_outputs=so, **kw))


class LibraryMatcher:
    """A grammar library's own matcher of a GBNF grammar, used as it documents it: its mask as token ids, a token
    taken."""

    def __init__(self, backend: str, engine, grammar: str):
        vocab = engine.hf_config.text_config.vocab_size
        if backend == "guidance":
            m = llguidance.LLMatcher(llguidance.hf.from_tokenizer(engine.tokenizer, n_vocab=vocab),
                                     llguidance.grammar_from("gbnf", grammar))
            self.mask = lambda: (lambda bits: [t for t in range(vocab) if bits[t // 8] >> (t % 8) & 1])(
                m.compute_bitmask())
            self.take = lambda t: m.validate_tokens([t]) == 1 and m.consume_token(t)
        else:
            xgr = pytest.importorskip("xgrammar", reason="xgrammar is optional (its Linux wheel pulls triton)")
            info = xgr.TokenizerInfo.from_huggingface(engine.tokenizer, vocab_size=vocab)
            m, bits = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(grammar)), \
                xgr.allocate_token_bitmask(1, vocab)
            self.mask = lambda: (m.fill_next_token_bitmask(bits), [
                t for t in range(vocab) if int(bits[0, t // 32]) >> (t % 32) & 1])[1]
            self.take = m.accept_token


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
def test_every_step_allows_what_the_grammar_librarys_own_matcher_allows(engine, monkeypatch, backend):
    """Each step's allowed tokens are those the grammar library's own matcher allows, with either library (they
    differ: llguidance allows only the canonical tokenization of forced text, xgrammar every token that fits)."""
    grammar = 'root ::= "The " colour " " shape "."\ncolour ::= "red" | "blue" | "green"\nshape ::= "circle" | "square"'
    truth = LibraryMatcher(backend, engine, grammar)
    monkeypatch.setattr(engine.intake, "_grammars", None)
    monkeypatch.setattr(engine.config, "structured_outputs_backend", backend)
    since = engine.snapshot().last_event_seq
    out = ask(engine, SO(grammar=grammar))
    assert engine.intake.grammars().backend == backend
    assert out.finish_reason == "stop" and out.text.startswith("The ") and out.text.endswith(".")
    steps = [ev for ev in engine.events(since) if ev.kind == "constrained"]
    assert [ev.token for ev in steps] == out.token_ids
    for ev in steps:  # the library's own matcher, fed the same tokens, computing its own mask
        allowed = truth.mask()
        assert ev.allowed_ids == allowed and ev.allowed == len(allowed)
        assert truth.take(ev.token)  # and the chosen token is one the grammar can take


def test_json_schema_answers_validate_and_json_has_no_free_whitespace(engine):
    out = ask(engine, SO(json=SHAPES), n_tokens=80)
    answer = json.loads(out.text)
    jsonschema.validate(answer, SHAPES)
    assert "\n" not in out.text
    assert out.finish_reason == "stop"
    for so, check in ((SO(choice=["red", "blue", "green"]), lambda t: t in ("red", "blue", "green")),
                      (SO(regex=r"(red|blue) (circle|square)"), lambda t: t.split()[0] in ("red", "blue")),
                      (SO(json=json.dumps({"type": "object", "properties": {"n": {"type": "integer", "maximum": 99}},
                                           "required": ["n"], "additionalProperties": False})),
                       lambda t: isinstance(json.loads(t)["n"], int))):
        out = ask(engine, so)
        assert out.finish_reason == "stop" and check(out.text), out.text


@pytest.mark.parametrize("so, field", [(dict(json={"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
                                        "structured_outputs.json"),
                                       (dict(regex="[a-z"), "structured_outputs.regex"),
                                       (dict(grammar="root ::= undefined_rule"), "structured_outputs.grammar"),
                                       (dict(json="{not json"), "structured_outputs.json")])
def test_a_bad_grammar_is_refused_naming_the_field_and_the_engine_serves_on(engine, so, field):
    with pytest.raises(Refused) as e:
        ask(engine, SO(**so))
    assert e.value.param == field
    assert ask(engine, SO(choice=["yes", "no"])).text in ("yes", "no")


def test_penalties_and_bias_change_logits_by_the_hand_computed_amounts():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 1.0]])

    class Row:  # a plan row: its params and the tokens its penalties count
        def __init__(self, params, history=(), num_prompt=0):
            self.seq_id, self.params, self.history, self.num_prompt = 0, params, history, num_prompt
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0, logit_bias={4: -3.0})
    # prompt [1, 0]; answer [3, 3, 2]: repetition on 0, 1, 2, 3; frequency 2x on 3, 1x on 2; presence on 2, 3
    got = shape_logits(logits.clone(), [Row(p, (1, 0, 3, 3, 2), 2)])
    want = torch.tensor([[2.0 / 2, -1.0 * 2, 0.5 / 2 - 0.25 - 0.5, 3.0 / 2 - 0.5 - 0.5, 1.0 - 3.0]])
    assert torch.allclose(got, want)


def test_logit_bias_changes_the_first_token(engine):
    plain = ask(engine, None, n_tokens=3)
    blue = engine.tokenizer.convert_tokens_to_ids("blue")
    assert plain.token_ids[0] != blue
    assert ask(engine, None, n_tokens=3, logit_bias={blue: 100}).token_ids[0] == blue
    with pytest.raises(Refused) as e:
        ask(engine, None, logit_bias={10 ** 7: 1})
    assert e.value.param == "logit_bias"


def test_n_choices_share_the_prompts_blocks_and_each_has_its_own_seed(engine):
    engine.reset_prefix_cache()
    request = Request(prompt="Describe the picture.", images=[PICTURE])
    params = SamplingParams(max_tokens=8, n=3, temperature=1.5, seed=11)
    engine.pause()
    try:
        handle = engine.submit(request, params)
        engine.step()  # the step that admits all three
        snap = engine.snapshot()
    finally:
        engine.resume()
    outs = {}
    for ev in handle:
        if ev.finished:
            outs[ev.index] = ev.output
    tables = [snap.block_tables[rid] for rid in handle.request_ids]
    full = (len(engine.make_sequence(request, params)) - 1) // 16  # the prompt's full blocks
    assert full >= 2 and tables[0][:full] == tables[1][:full] == tables[2][:full]  # one prompt, three branches
    assert len({t[-1] for t in tables}) == 3  # each its own last block
    assert sorted(outs) == [0, 1, 2]
    alone = engine.generate(request, SamplingParams(max_tokens=8, temperature=1.5, seed=12))
    assert outs[1].token_ids == alone.token_ids  # choice i draws with seed + i


def test_grammars_hold_through_chunked_prefill_and_preemption(engine):
    """The matcher follows its request: chunked prefill and preemption (recompute) change no token of a constrained
    batch."""
    so = SO(json=SHAPES)
    reqs = [Request(prompt=q, images=[PICTURE]) for q in ("What shapes are in the picture?", "Describe the picture.",
                                                          "List the shapes.")]
    params = SamplingParams(max_tokens=40, structured_outputs=so)
    reference = [o.token_ids for o in engine.generate(reqs, params)]
    prompts = [len(engine.make_sequence(r, params)) for r in reqs]
    small = engine.isolated(num_blocks=-(-(max(prompts) + 40) // 16))  # one request fits, three must take turns
    chunked = engine.isolated(enable_chunked_prefill=True, max_num_batched_tokens=16, num_blocks=128)
    try:
        for e in (small, chunked):
            outs = e.generate(reqs, params)
            assert [o.token_ids for o in outs] == reference
            for o in outs:
                if o.finish_reason == "stop":
                    jsonschema.validate(json.loads(o.text), SHAPES)
        assert small.snapshot().num_preemptions > 0
    finally:
        small.close()
        chunked.close()


def test_a_grammar_that_gives_out_mid_answer_is_the_clients_400_not_a_500(engine):
    """A matcher that can no longer take a token (its budget spent mid-answer) refuses, naming structured_outputs,
    and the HTTP API answers that failed request as the 400 it would have been at intake."""
    from minivlm.api.errors import from_engine
    from minivlm.engine.step_result import RequestFailed
    m = engine.intake.grammars().matcher(SO(choice=["red", "blue"]))
    red = engine.tokenizer.convert_tokens_to_ids("red")
    m.advance(red)
    with pytest.raises(Refused) as e:
        m.advance(red)  # the grammar is complete: no token may follow
    assert e.value.param == "structured_outputs"
    api = from_engine(RequestFailed("req-1", "advance", e.value))
    assert api.status == 400 and api.param == "structured_outputs"


def test_masks_filled_ahead_beside_the_forward_or_at_sampling_give_the_same_tokens_and_counts(engine, monkeypatch):
    """The masks fill on a worker thread from the previous step's update (ahead), from the step's start (beside the
    forward), or on the step thread at sampling; all three give the same tokens and the same step-through counts on
    the same batch, and ahead the step finds its masks filled for it."""
    filler = engine.core.masks
    reqs = [Request(prompt=q, images=[PICTURE]) for q in ("What shapes are in the picture?", "Describe the picture.")]
    params = SamplingParams(max_tokens=40, structured_outputs=SO(json=SHAPES))
    runs, chosen, reused = {}, filler.mode, []
    real_start = filler.start

    def start(reqs, drafts=None):
        ahead, masks = filler._ahead, real_start(reqs, drafts)
        if masks is not None:
            reused.append(masks is ahead)
        return masks
    monkeypatch.setattr(filler, "start", start)
    try:
        for mode in filler.MODES:
            filler.mode, reused[:] = mode, []
            since = engine.snapshot().last_event_seq
            outs = engine.generate(reqs, params)
            counts = [(ev.request_id, ev.allowed, ev.token) for ev in engine.events(since) if ev.kind == "constrained"]
            runs[mode] = ([o.token_ids for o in outs], counts, sum(reused), len(reused))
        assert filler._pool is not None  # the worker thread did the filling
    finally:
        filler.mode = chosen
    assert filler.mode == default_mode("cpu") == ("ahead" if torch.get_num_threads() < len(os.sched_getaffinity(0)) else "sampling")
    assert runs["ahead"][0] == runs["beside"][0] == runs["sampling"][0]
    assert [c[1:] for c in runs["ahead"][1]] == [c[1:] for c in runs["beside"][1]] == \
        [c[1:] for c in runs["sampling"][1]] and len(runs["ahead"][1]) >= 2 * 10
    steps = runs["ahead"][3]  # steps that sampled under a grammar: all but the first found their masks filled ahead
    assert runs["ahead"][2] == steps - 1 and steps >= 10 and runs["beside"][2] == runs["sampling"][2] == 0


@pytest.mark.parametrize("mode", MaskFiller.MODES)
def test_a_matcher_that_faults_fails_its_request_alone(engine, monkeypatch, mode):
    """A grammar whose mask raises fails that request; the other constrained request of the same batch finishes."""
    grammars, made = engine.intake.grammars(), []
    real_matcher = grammars.matcher

    def broken(bits, row):
        raise RuntimeError("the first request's grammar broke")

    def matcher(so):  # the first request's matcher (either library's) raises when asked for a mask
        made.append(real_matcher(so))
        if len(made) == 1:
            made[0].fill = broken
        return made[-1]
    monkeypatch.setattr(grammars, "matcher", matcher)
    monkeypatch.setattr(engine.core.masks, "mode", mode)
    params = SamplingParams(max_tokens=20, structured_outputs=SO(choice=["red circle", "blue square"]))
    handles = [engine.submit(Request(prompt=q, images=[PICTURE]), params) for q in ("Describe.", "List the shapes.")]
    from minivlm.engine.step_result import RequestFailed
    with pytest.raises(RequestFailed, match="failed during sampling: RuntimeError: the first request's grammar broke"):
        list(handles[0])
    ok = list(handles[1])
    assert ok[-1].output.finish_reason == "stop" and ok[-1].output.text in ("red circle", "blue square")
    assert engine.generate(Request(prompt="Describe."), SamplingParams(max_tokens=4)).token_ids  # serving on


def test_what_xgrammar_cannot_build_llguidance_serves(engine, monkeypatch):
    """With xgrammar installed, a grammar it lacks a feature for (a case-insensitive regex, a Unicode class) is served
    by llguidance's matcher, and the answer holds to it; what both build gets xgrammar's."""
    pytest.importorskip("xgrammar", reason="xgrammar is optional (its Linux wheel pulls triton)")
    import re
    monkeypatch.setattr(engine.intake, "_grammars", None)
    monkeypatch.setattr(engine.config, "structured_outputs_backend", "auto")
    grammars = engine.intake.grammars()
    assert grammars.backend == "xgrammar"
    kinds = [type(grammars.matcher(so)).__name__ for so in (
        SO(regex="(?i)(red|blue) circle"), SO(regex=r"\p{L}+ circle"),
        SO(regex="(red|blue) circle"), SO(json=SHAPES))]
    assert kinds == ["Matcher", "Matcher", "XMatcher", "XMatcher"]
    out = ask(engine, SO(regex="(?i)(red|blue) circle"))
    assert re.fullmatch("(?i)(red|blue) circle", out.text) and out.finish_reason == "stop"


def test_the_grammar_library_setting_is_checked(monkeypatch):
    """A library vLLM names that minivlm lacks is refused by the config; "xgrammar" where it is not installed, by the
    engine, saying how to install it."""
    with pytest.raises(ValueError, match="structured_outputs_backend must be one of"):
        EngineConfig(structured_outputs_backend="outlines")
    from minivlm.engine import intake
    monkeypatch.setattr(intake, "xgrammar_installed", lambda: False)
    with pytest.raises(ValueError, match="xgrammar is not installed"):
        Engine(EngineConfig(device="cpu", num_blocks=16, structured_outputs_backend="xgrammar"))
