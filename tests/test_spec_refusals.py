"""Where speculation cannot apply (a KV-cache group whose manager cannot give a guess back: hybrid models did not
before #55 item 2, and a group kind without `speculates` would not), the engine says why instead of proposing nothing
in silence: a `not_speculated` event on each request's first decode step with the reason, one log line per reason,
the step-through's sentence in English and Chinese; nothing is guessed and the answers are those without
speculation. The hybrid groups speculate now (tests/test_spec_hybrid.py), so the test takes that away from them."""
import logging

import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.engine.spec_decode.ngram import NOT_ON_THIS_MODEL

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.mark.slow  # makes two random hybrid checkpoints (~30 s on a busy machine)
@pytest.mark.parametrize("family, reason", [("qwen3_5", "recurrent_state"), ("gemma3", "sliding_window")])
def test_a_hybrid_model_says_why_it_does_not_speculate(tmp_path, caplog, monkeypatch, family, reason):
    from minivlm.engine.kv_cache.recurrent import RecurrentManager
    from minivlm.engine.kv_cache.sliding_window import SlidingWindowManager
    monkeypatch.setattr(RecurrentManager if family == "qwen3_5" else SlidingWindowManager, "speculates", False)
    from minivlm.views.events import describe
    from panels.i18n import EN, ZH
    from panels.i18n.events import describe_in
    if family == "qwen3_5":
        from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint as make
    else:
        from tools.make_checkpoint_gemma3 import make_gemma3_checkpoint as make
    path = make(str(tmp_path / family), seed=3)
    reqs = [Request(prompt="red red red red red"), Request(prompt="blue square, blue square")]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    answers = []
    for spec in (None, SPEC):
        with Engine(EngineConfig(model=path, device="cpu", dtype="float32", max_model_len=1024, num_blocks=64,
                                 speculative_config=spec)) as e:
            with caplog.at_level(logging.WARNING, logger="minivlm"):
                answers.append([o.token_ids for o in e.generate(reqs, params)])
                e.generate(Request(prompt="red red red"), params)  # a later request: an event, no log line
            events = e.events()
    said = [ev for ev in events if ev.kind == "not_speculated"]
    assert [ev.reason for ev in said] == [reason] * 3
    assert len({ev.request_id for ev in said}) == 3 and not any(ev.kind == "speculated" for ev in events)
    lines = [r.getMessage() for r in caplog.records if "speculative decoding does not apply" in r.getMessage()]
    assert lines == [f"speculative decoding does not apply ({reason}): {NOT_ON_THIS_MODEL[reason]}"]
    s = describe(said[0])
    assert s == describe_in(said[0], EN) == f"{said[0].request_id} does not speculate: {NOT_ON_THIS_MODEL[reason]}"
    assert "{" not in describe_in(said[0], ZH) and "推测解码" in describe_in(said[0], ZH)
    assert answers[0] == answers[1]
