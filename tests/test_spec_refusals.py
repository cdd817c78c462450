"""Where speculation cannot apply, the engine says why instead of proposing nothing in silence (#55): a KV-cache
group whose manager cannot hold guesses and give them back (`speculates`; every kind here can since hybrid
speculation, so the full-attention group of the shipped model is made to say it cannot, as a new kind would) gives a
`not_speculated` event on each request's first decode step naming the group kind, one log line per kind, the
step-through's sentence in English and Chinese; nothing is guessed and the answers are those without speculation."""
import logging

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.engine.spec_decode.ngram import NOT_ON_THIS_MODEL

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def test_a_group_that_cannot_hold_guesses_is_said_once_per_request_and_logged_once(caplog, monkeypatch):
    from minivlm.views.events import describe
    from panels.i18n import EN, ZH
    from panels.i18n.events import describe_in
    reqs = [Request(prompt="Read this back: red circle, blue square, red circle."), Request(prompt="blue, blue")]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    answers = []
    for spec in (None, SPEC):
        with Engine(EngineConfig(device="cpu", num_blocks=64, speculative_config=spec)) as e:
            monkeypatch.setattr(e.core.block_manager.managers[0], "speculates", False, raising=False)
            with caplog.at_level(logging.WARNING, logger="minivlm"):
                answers.append([o.token_ids for o in e.generate(reqs, params)])
                e.generate(Request(prompt="red red red"), params)  # a later request: an event, no log line
            events = e.events()
    said = [ev for ev in events if ev.kind == "not_speculated"]
    assert [ev.reason for ev in said] == ["full_attention"] * 3 and len({ev.request_id for ev in said}) == 3
    assert not any(ev.kind == "speculated" for ev in events)
    lines = [r.getMessage() for r in caplog.records if "speculative decoding does not apply" in r.getMessage()]
    assert lines == ["speculative decoding does not apply: " + NOT_ON_THIS_MODEL.format(kind="full_attention")]
    s = describe(said[0])
    assert s == describe_in(said[0], EN) == f"{said[0].request_id} does not speculate: the model's full_attention " \
                                            "KV-cache group cannot hold guessed tokens and give them back"
    assert "{" not in describe_in(said[0], ZH) and "推测解码" in describe_in(said[0], ZH)
    assert answers[0] == answers[1]
