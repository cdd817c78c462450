"""n-gram speculation on hybrid models (#55 item 2): Qwen3.5 (Gated DeltaNet state) and Gemma 3 (sliding window) give
the tokens and logprobs of decoding without speculation — whole and chunked prefill, n > 1, preemption on a small
pool — while drafts are proposed, partly accepted and partly rejected (asserted, so a state left after a rejected
guess, or a sliding block given back too early, shows as a changed token or logprob); and no state slot or block of
any group outlives requests aborted or failed mid-draft (exact counts)."""
import logging

import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams, StructuredOutputsParams as SO

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PROMPTS = ["red red red red red blue red red red", "blue square, blue square, blue square, red",
           "one two three one two three one two"]
MAX = 32
OPEN = 'root ::= item (", " item)*\nitem ::= colour " " shape\ncolour ::= "red" | "blue"\nshape ::= "circle" | "square"'


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from tools.make_checkpoint_gemma3 import make_gemma3_checkpoint
    from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
    root = tmp_path_factory.mktemp("spec_hybrid")
    return {"qwen3_5": make_qwen3_5_checkpoint(str(root / "qwen3_5"), seed=3),
            "gemma3": make_gemma3_checkpoint(str(root / "gemma3"), seed=3)}


def engine(path, **kw) -> Engine:
    return Engine(EngineConfig(model=path, device="cpu", dtype="float32", max_model_len=1024,
                               **{"num_blocks": 64, **kw}))


def requests():
    return [Request(prompt=p) for p in PROMPTS]


def params(n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=MAX, ignore_eos=True, logprobs=2, n=n)


@pytest.fixture(scope="module")
def reference(checkpoints):
    """Each family's answers without speculation (the third request asks for two greedy choices)."""
    out = {}
    for family, path in checkpoints.items():
        with engine(path) as e:
            out[family] = e.generate(requests(), [params(), params(), params(2)])
    return out


def answers(outs):
    return [(c.token_ids, c.logprobs) for o in outs for c in o.choices]


def check_same(outs, want):
    for (tokens, lps), (ref_tokens, ref_lps) in zip(answers(outs), answers(want), strict=True):
        assert tokens == ref_tokens and len(tokens) == MAX
        for t, a, b in zip(tokens, lps, ref_lps):
            assert abs(a[t] - b[t]) < 1e-4 and set(a) == set(b)


def check_guessed(stats):
    """Drafts were proposed, some accepted and some rejected: the rollback was exercised both ways."""
    assert stats.num_drafts > 0 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens, stats


def check_nothing_held(e):
    """Every group of the pool holds nothing for anyone: blocks back in the free queue, state slots free or holding
    checkpoints, no state kept past its step."""
    bm = e.core.block_manager
    for g in bm.managers:
        if g.kind == "recurrent":
            assert not g.slot_of and not g.pending and len(g.free) + len(g.checkpoints) == g.num_slots
            assert len(set(g.free) | set(g.checkpoints.values())) == g.num_slots  # each slot once
        elif g.kind != "kv_shared":
            assert all(b.ref_count == 0 for b in g.blocks) and g.num_free == len(g.blocks) and not g.tables
    assert not any(getattr(b, "kept", None) for b in e.core.runner.builders)


@pytest.mark.parametrize("settings", [{}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 16}],
                         ids=["whole", "chunked"])
@pytest.mark.parametrize("family", ["qwen3_5", "gemma3"])
def test_greedy_tokens_and_logprobs_equal_decoding_without_speculation(checkpoints, reference, family, settings):
    with engine(checkpoints[family], speculative_config=SPEC, **settings) as e:
        check_same(e.generate(requests(), [params(), params(), params(2)]), reference[family])
        check_guessed(e.spec_decode_stats())
        assert not any(ev.kind == "not_speculated" for ev in e.events())
        check_nothing_held(e)


@pytest.mark.parametrize("family", ["qwen3_5", "gemma3"])
def test_preemption_on_a_small_pool_changes_no_token_and_leaks_nothing(checkpoints, reference, family):
    with engine(checkpoints[family]) as plain:
        longest = max(len(plain.make_sequence(r, params())) for r in requests())
    with engine(checkpoints[family], speculative_config=SPEC, num_blocks=-(-(longest + MAX) // 16) + 1) as e:
        check_same(e.generate(requests(), [params(), params(), params(2)]), reference[family])
        check_guessed(e.spec_decode_stats())
        assert e.snapshot().num_preemptions > 0
        check_nothing_held(e)


@pytest.mark.parametrize("family", ["qwen3_5", "gemma3"])
def test_no_slot_or_block_outlives_a_request_aborted_or_failed_mid_draft(checkpoints, reference, family,
                                                                        monkeypatch):
    """Aborted right after a step that speculated, and failed while its guesses hold slots and kept states: every
    block of every group and every state slot comes back, and the request beside it answers as without
    speculation."""
    with engine(checkpoints[family], speculative_config=SPEC) as e:
        with e.submit(requests()[0], params()) as handle:
            for _ in handle:
                if e.spec_decode_stats().num_drafts:
                    break  # leaving the handle aborts the request
        e.generate(Request(prompt="red"), SamplingParams(max_tokens=2))  # a step after the abort
        check_nothing_held(e)
        real = e.core.runner.verify_drafts
        doomed = requests()[1]

        def fails_for_doomed(reqs, logits, masks=None):
            if any(e.core.live[r.seq_id].request_id == doomed.request_id for r in reqs):
                raise RuntimeError("verification failed")
            return real(reqs, logits, masks)
        monkeypatch.setattr(e.core.runner, "verify_drafts", fails_for_doomed)
        monkeypatch.setattr(logging.getLogger("minivlm"), "disabled", True)
        with e._submit(e._make_sequences([doomed, requests()[0]], params()), snapshots=False) as handle:
            with pytest.raises(Exception, match="verification failed"):
                for _ in handle:
                    pass
        survivor = e.generate(requests()[0], params())
        e.generate(Request(prompt="red"), SamplingParams(max_tokens=2))
        check_nothing_held(e)
    check_same([survivor], reference[family][:1])


@pytest.mark.parametrize("family", ["qwen3_5", "gemma3"])
def test_penalties_bias_and_a_grammar_answer_as_without_speculation(checkpoints, family):
    """Penalties and a logit bias (each guess's row shaped after the guesses before it) and a grammar (its matcher
    walked along the guesses and rolled back) on a hybrid model: the plain engine's tokens and logprobs."""
    reqs = [Request(prompt=PROMPTS[0]), Request(prompt="Read this back: red circle, blue square, red circle.")]
    ps = [SamplingParams(max_tokens=MAX, ignore_eos=True, repetition_penalty=1.2, presence_penalty=0.3,
                         logit_bias={89: 0.5}, logprobs=2),
          SamplingParams(max_tokens=24, ignore_eos=True, structured_outputs=SO(grammar=OPEN), logprobs=2)]
    with engine(checkpoints[family]) as plain:
        want = plain.generate(reqs, ps)
    with engine(checkpoints[family], speculative_config=SPEC) as e:
        got = e.generate(reqs, ps)
        spoke = {ev.request_id for ev in e.events() if ev.kind == "speculated"}
        check_guessed(e.spec_decode_stats())
        check_nothing_held(e)
    assert spoke == {o.request_id for o in got}  # both requests guessed
    for (tokens, lps), (ref_tokens, ref_lps) in zip(answers(got), answers(want), strict=True):
        assert tokens == ref_tokens
        assert all(abs(a[t] - b[t]) < 1e-4 for t, a, b in zip(tokens, lps, ref_lps))


@pytest.mark.slow  # one more random checkpoint (Gemma 4: sliding, full and kv_shared groups), ~30 s
def test_gemma4_speculates_as_it_decodes(tmp_path):
    from tools.make_checkpoint_gemma4 import make_gemma4_checkpoint
    path = make_gemma4_checkpoint(str(tmp_path / "gemma4"), seed=1)  # a seed whose answers repeat a little
    with engine(path) as plain:
        want = plain.generate(requests(), [params(), params(), params(2)])
    for settings in ({}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 16}):
        with engine(path, speculative_config=SPEC, **settings) as e:
            check_same(e.generate(requests(), [params(), params(), params(2)]), want)
            check_guessed(e.spec_decode_stats())
            check_nothing_held(e)


def saved_states(e, reqs, ps) -> tuple[dict, set]:
    """Every state the recurrent group saves into a checkpoint while e answers reqs: (request, token) -> each layer's
    states, and the keys saved by steps that verified guesses."""
    builder = next(b for b in e.core.runner.builders if b.kind == "recurrent")
    real, saved, drafted, order = builder.after, {}, set(), {}  # order: request ids count on across engines

    def after(plan, caches):
        real(plan, caches)
        for r in plan:
            if (p := r.groups[builder.group]).save_to >= 0:
                key = (order.setdefault(r.request_id, len(order)), r.end)
                saved[key] = [t[p.save_to].clone() for i in builder.layers for t in caches[i]]
                if p.draft:
                    drafted.add(key)
    builder.after = after
    e.generate(reqs, ps)
    return saved, drafted


def test_a_checkpoint_saved_by_a_verify_step_is_the_state_after_its_own_token(checkpoints):
    """A decode checkpoint saved in a step that verified guesses holds the state after the request's own token (not
    after its guesses): equal to the one decoding without speculation saves at the same token."""
    with engine(checkpoints["qwen3_5"]) as plain:
        want, _ = saved_states(plain, requests(), params())
    with engine(checkpoints["qwen3_5"], speculative_config=SPEC) as e:
        got, drafted = saved_states(e, requests(), params())
    both = drafted & set(want)
    assert both, "no checkpoint was saved by a verify step at a token the plain run also saved"
    for key in set(got) & set(want):
        assert all((a - b).abs().max() < 1e-5 for a, b in zip(got[key], want[key])), key
