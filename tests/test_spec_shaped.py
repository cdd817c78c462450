"""Speculative decoding with grammars, penalties and logit_bias (#55 item 3), against independent truths: greedy tokens
and logprobs are those of the same engine without speculation (grammars with either library, penalties, logit bias,
n > 1, chunked prefill, preemption on a small pool); every accepted count is what the plain run's tokens say it must
be, and a guess the grammar library's own matcher forbids is never accepted; the masks along a draft are the
library's own after each guess, and the matcher ends where it began; no block or matcher outlives a request aborted
or failed mid-draft. The sampled distribution is tested in tests/test_spec_distribution.py."""
import gc
import logging
import os
import weakref

import llguidance
import llguidance.hf
import pytest
from PIL import Image

from minivlm import Engine, EngineConfig, Request, SamplingParams, StructuredOutputsParams as SO
from panels.holder import EXAMPLES_DIR
from tests.test_structured_outputs import LibraryMatcher

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
PICTURE = Image.open(os.path.join(EXAMPLES_DIR, "three_shapes.png"))
READ = Request(prompt="Read this back: red circle, blue square, red circle, blue square, red circle.")
DESCRIBE = Request(prompt="Describe the picture.", images=[PICTURE])
LIST = {"type": "object", "additionalProperties": False, "required": ["shapes"],
        "properties": {"shapes": {"type": "array", "minItems": 5, "maxItems": 5,
                                  "items": {"enum": ["red circle", "blue square", "green triangle"]}}}}
FIVE = 'root ::= item ", " item ", " item ", " item ", " item "."\nitem ::= colour " " shape\n' \
       'colour ::= "red" | "blue"\nshape ::= "circle" | "square"'
OPEN = 'root ::= item (", " item)*\nitem ::= colour " " shape\ncolour ::= "red" | "blue"\nshape ::= "circle" | "square"'
CASES = {  # request kinds: (requests, params)
    "json schema": ([READ], SamplingParams(max_tokens=48, structured_outputs=SO(json=LIST))),
    "gbnf grammar": ([READ], SamplingParams(max_tokens=48, structured_outputs=SO(grammar=FIVE))),
    "grammar, ignore_eos": ([READ], SamplingParams(max_tokens=24, ignore_eos=True, structured_outputs=SO(grammar=OPEN))),
    "choice": ([READ], SamplingParams(max_tokens=48, structured_outputs=SO(
        choice=["red circle, blue square, red circle", "blue square, red circle, blue square"]))),
    "repetition penalty": ([READ, DESCRIBE], SamplingParams(max_tokens=40, ignore_eos=True, repetition_penalty=1.3,
                                                            logprobs=2)),
    "presence, frequency, bias": ([READ, DESCRIBE], SamplingParams(  # frequency 1: an accepted guess changes the
        max_tokens=40, ignore_eos=True, presence_penalty=0.4, frequency_penalty=1.0, logit_bias={11: 2.0, 20: -1.0},
        logprobs=2)),  # next position's argmax here (counting only the tokens before the step gives other tokens)
    "grammar and penalties": ([READ], SamplingParams(max_tokens=48, repetition_penalty=1.2, frequency_penalty=0.2,
                                                     logit_bias={89: 0.5}, structured_outputs=SO(grammar=FIVE))),
    "n = 2": ([READ], SamplingParams(max_tokens=40, n=2, frequency_penalty=0.2, structured_outputs=SO(grammar=OPEN))),
}


def engine(**kw) -> Engine:
    return Engine(EngineConfig(device="cpu", **{"num_blocks": 128, **kw}))


@pytest.fixture(scope="module")
def plain():
    with engine() as e:
        yield e


@pytest.fixture(scope="module")
def spec():
    with engine(speculative_config=SPEC) as e:
        yield e


def answers(outs) -> list:
    return [(c.token_ids, c.logprobs, c.finish_reason) for o in outs for c in o.choices]


def check_same(got, want):
    """The same tokens and finish reasons; the same top logprobs' tokens, the chosen one's logprob within 1e-5 (a
    chunked prefill sums in another order)."""
    assert [(t, f) for t, _, f in got] == [(t, f) for t, _, f in want]
    for (tokens, a, _), (_, b, _) in zip(got, want):
        assert (a is None) == (b is None)
        for t, x, y in zip(tokens, a or [], b or []):
            assert set(x) == set(y) and abs(x[t] - y[t]) < 1e-5


def library_matcher(engine, so):
    """llguidance's own matcher of a request's grammar (the engine's source text for it)."""
    from minivlm.engine.sampling.structured_output import source
    fmt, text, _ = source(so)
    vocab = engine.hf_config.text_config.vocab_size
    return llguidance.LLMatcher(llguidance.hf.from_tokenizer(engine.tokenizer, n_vocab=vocab),
                                llguidance.grammar_from(fmt, text))


def check_verdicts(engine, events, outs, params) -> int:
    """Every speculated event's accepted count is the number of leading guesses the plain answer has at that point
    (replayed from the events); returns how many rejected guesses the grammar library's own matcher forbids there.
    One choice per request (choices of n > 1 share a request id: compared as whole answers only)."""
    answer = {o.request_id: o.token_ids for o in outs}
    done, forbidden = dict.fromkeys(answer, 0), 0
    for ev in events:
        if ev.kind == "scheduled":
            for r in ev.plan:
                if r["sample"] and "draft" not in r:
                    done[r["request_id"]] += 1
        elif ev.kind == "speculated":
            n, tokens = done[ev.request_id], answer[ev.request_id]
            truth = 0
            while truth < len(ev.draft) and n + truth < len(tokens) and ev.draft[truth] == tokens[n + truth]:
                truth += 1
            assert ev.accepted == truth, (ev.request_id, n, ev.draft, tokens[n:n + 5])
            if params.structured_outputs is not None and ev.accepted < len(ev.draft):
                m = library_matcher(engine, params.structured_outputs)
                assert m.consume_tokens([t for t in tokens[:n + ev.accepted] if t not in engine.core.outputs.eos_ids])
                forbidden += m.validate_tokens([ev.draft[ev.accepted]]) == 0
            done[ev.request_id] = n + ev.accepted + 1
    return forbidden


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_and_logprobs_are_those_without_speculation(plain, spec, case):
    reqs, params = CASES[case]
    want = plain.generate(reqs, params)
    since = spec.snapshot().last_event_seq
    got = spec.generate(reqs, params)
    check_same(answers(got), answers(want))
    events = spec.events(since)
    drafts = [ev for ev in events if ev.kind == "speculated"]
    assert drafts, "no request speculated"
    if params.n == 1:
        check_verdicts(spec, events, got, params)


@pytest.mark.parametrize("case", ["json schema", "gbnf grammar", "grammar, ignore_eos", "grammar and penalties"])
def test_with_xgrammar_too(plain, spec, monkeypatch, case):
    """The same with xgrammar's matchers (vLLM's default library; optional here): its masks along a draft come from
    accept_token / rollback."""
    pytest.importorskip("xgrammar", reason="xgrammar is optional (its Linux wheel pulls triton)")
    for e in (plain, spec):
        monkeypatch.setattr(e.intake, "_grammars", None)
        monkeypatch.setattr(e.config, "structured_outputs_backend", "xgrammar")
    assert spec.intake.grammars().backend == "xgrammar"
    test_greedy_tokens_and_logprobs_are_those_without_speculation(plain, spec, case)


def test_a_guess_the_grammar_forbids_is_rejected(plain, spec):
    """Over the grammar cases, guesses the library's own matcher forbids were proposed, and every one was rejected
    (the accepted counts equal the plain run's, so a forbidden guess accepted would differ from it)."""
    forbidden = 0
    for case in ("json schema", "gbnf grammar", "grammar and penalties"):
        reqs, params = CASES[case]
        since = spec.snapshot().last_event_seq
        outs = spec.generate(reqs, params)
        forbidden += check_verdicts(spec, spec.events(since), outs, params)
    assert forbidden > 0


@pytest.mark.parametrize("settings", [{"enable_chunked_prefill": True, "max_num_batched_tokens": 16}, {}],
                         ids=["chunked prefill", "preemption"])
def test_chunked_prefill_and_preemption_change_no_token(plain, settings):
    """Three requests at once (a grammar with penalties and bias, penalties and bias with an image, penalties): in
    prefill chunks of 16 tokens, or on a pool that holds one answer at a time, so requests are preempted mid-answer."""
    reqs = [Request(prompt=READ.prompt), DESCRIBE, Request(prompt=READ.prompt + " Then stop.")]
    params = [CASES["grammar and penalties"][1], CASES["presence, frequency, bias"][1], CASES["repetition penalty"][1]]
    want = answers(plain.generate(reqs, params))
    if not settings:  # the longest request's blocks and one more
        longest = max(len(plain.make_sequence(r, p)) + p.max_tokens for r, p in zip(reqs, params))
        settings = {"num_blocks": -(-longest // 16) + 1}
    with engine(speculative_config=SPEC, **settings) as e:
        got = answers(e.generate(reqs, params))
        snap = e.snapshot()
        stats = e.spec_decode_stats()
    check_same(got, want)
    assert stats.num_draft_tokens > 0 and all(b.ref_count == 0 for b in snap.blocks)
    if "num_blocks" in settings:
        assert snap.num_preemptions > 0


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
def test_the_masks_along_a_draft_are_the_librarys_and_the_matcher_ends_where_it_began(spec, monkeypatch, backend):
    """BatchMasks' rows for a speculating request: row j is the library's own mask after the accepted tokens and
    the guesses before j; a forbidden guess ends the walk (every token allowed after it: never read); the matcher
    then allows what the library allows after the accepted tokens alone, and takes them on as before."""
    from minivlm.engine.sampling.grammar_masks import BatchMasks
    from minivlm.engine.sampling.structured_output import allowed_ids
    so = SO(grammar=FIVE)
    tok = spec.tokenizer
    text = tok.encode("red circle, blue square, red circle, blue square, red circle.")
    if backend == "xgrammar":
        pytest.importorskip("xgrammar", reason="xgrammar is optional (its Linux wheel pulls triton)")
    monkeypatch.setattr(spec.intake, "_grammars", None)
    monkeypatch.setattr(spec.config, "structured_outputs_backend", backend)
    grammars = spec.intake.grammars()
    assert grammars.backend == backend
    vocab = spec.hf_config.text_config.vocab_size
    green = tok.encode("green")[0]
    # (tokens taken, the draft, rows the walk fills): all guesses allowed; "green" forbidden at its row; the last
    # guess completes the grammar (the walk stops after it)
    for start, draft, filled in ((2, text[2:6], 5), (2, text[2:4] + [green] + text[5:6], 3),
                                 (len(text) - 2, text[-2:] + text[:1], 2)):
        ours = grammars.matcher(so)
        for t in text[:start]:
            ours.advance(t)
        masks = BatchMasks([7], [ours], [tuple(draft)], [frozenset()], [True])
        masks.fill()
        assert masks.rows == {7: (0, 1 + len(draft))} and ours.consumed == start
        truth = LibraryMatcher(backend, spec, FIVE)
        for t in text[:start]:
            assert truth.take(t)
        for j in range(1 + len(draft)):
            want = truth.mask() if j < filled else list(range(vocab))  # past the walk's end: never read
            assert allowed_ids(masks.bits[j], vocab).tolist() == want, (start, j)
            if j < filled - 1:
                assert truth.take(draft[j])
        after = LibraryMatcher(backend, spec, FIVE)
        for t in text[:start]:
            assert after.take(t)
        assert allowed_ids(ours.allowed(), vocab).tolist() == after.mask()
        for t in text[start:]:
            assert not ours.finished()
            ours.advance(t)
        assert ours.finished()


def test_no_block_or_matcher_outlives_a_request_aborted_or_failed_mid_draft(plain, monkeypatch):
    """A grammar request aborted by its caller right after a step that speculated, and one whose verification
    raises while its guesses hold slots: every block comes back, their matchers are collected, and the request
    beside them answers as without speculation."""
    reqs, params = CASES["grammar and penalties"]
    other = plain.generate([DESCRIBE], CASES["presence, frequency, bias"][1])
    with engine(speculative_config=SPEC) as e:
        seqs = e._make_sequences([READ], params)
        matcher = weakref.ref(seqs[0].matcher)
        with e._submit(seqs, snapshots=False) as handle:
            for _ in handle:
                if e.spec_decode_stats().num_drafts:
                    break  # leaving the handle aborts the request
        del seqs
        e.generate([DESCRIBE], SamplingParams(max_tokens=2))  # a step after the abort
        gc.collect()
        assert matcher() is None
        assert all(b.ref_count == 0 for b in e.snapshot().blocks)
        real = e.core.runner.verify_drafts

        def fails_for_read(reqs, logits, masks=None):
            if any(e.core.live[r.seq_id].request_id == doomed.request_id for r in reqs):
                raise RuntimeError("verification failed")
            return real(reqs, logits, masks)
        doomed = Request(prompt=READ.prompt)
        monkeypatch.setattr(e.core.runner, "verify_drafts", fails_for_read)
        monkeypatch.setattr(logging.getLogger("minivlm"), "disabled", True)  # a captured record keeps the traceback
        seqs = e._make_sequences([doomed, DESCRIBE], [params, CASES["presence, frequency, bias"][1]])
        matcher = weakref.ref(seqs[0].matcher)
        with e._submit(seqs, snapshots=False) as handle:
            with pytest.raises(Exception, match="verification failed") as failed:
                for _ in handle:
                    pass
        survivor = e.generate([DESCRIBE], CASES["presence, frequency, bias"][1])
        del seqs, handle, failed  # the error's traceback holds the step's frames (and so the request)
        gc.collect()
        assert matcher() is None
        check_same(answers(survivor), answers(other))
        assert all(b.ref_count == 0 for b in e.snapshot().blocks)


def test_each_guess_row_counts_the_guesses_before_it():
    """Row j of a speculating request's logits is shaped as its token would be after the j guesses before it:
    hand-computed rows (prompt [1, 0], answer so far [3], guesses [2, 2])."""
    import torch
    from minivlm.engine.execution.input_batch import RequestState
    from minivlm.engine.sampling.logits_shaping import shape_draft_rows
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0, logit_bias={4: -3.0})
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 1.0]] * 3)
    state = RequestState(0, "r", p, None, [1, 0, 3], 2)
    got = shape_draft_rows(logits.clone(), state, (2, 2))
    want = torch.tensor([[2.0 / 2, -1.0 * 2, 0.5, 3.0 / 2 - 0.25 - 0.5, 1.0 - 3.0],       # answer [3]
                         [2.0 / 2, -1.0 * 2, 0.5 / 2 - 0.25 - 0.5, 3.0 / 2 - 0.25 - 0.5, 1.0 - 3.0],  # [3, 2]
                         [2.0 / 2, -1.0 * 2, 0.5 / 2 - 0.5 - 0.5, 3.0 / 2 - 0.25 - 0.5, 1.0 - 3.0]])  # [3, 2, 2]
    assert torch.allclose(got, want)


def test_the_rows_penalized_together_are_bitwise_those_penalized_one_by_one():
    """penalize_along (every draft row at once) gives exactly the floats penalize() gives each row with its history
    (the sampling path's): a greedy tie can never break another way. 50 random settings, drafts repeating tokens."""
    import torch
    from minivlm.engine.sampling.logits_shaping import penalize, penalize_along
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        r = torch.rand(3, generator=gen).tolist()
        p = SamplingParams(frequency_penalty=2 * r[0], presence_penalty=r[1], repetition_penalty=1 + r[2])
        rows = torch.randn(5, 97, generator=gen) * 3
        history = torch.randint(0, 97, (30,), generator=gen)
        draft = torch.randint(0, 97, (4,), generator=gen).tolist() if r[0] > 0.3 else [5, 5, 5, 5]
        together = rows.clone()
        penalize_along(together, history, draft, 10, p)
        for j in range(5):
            one = rows[j].clone()
            penalize(one, torch.cat([history, torch.tensor(draft[:j], dtype=torch.long)]), 10, p, 97)
            assert torch.equal(together[j], one)
