"""Speculative decoding with n-gram prompt lookup (#43): greedy outputs and logprobs are those of decoding without it
(batches with images, chunked prefill, preemption), max_tokens and ignore_eos hold; the rejection sampler keeps the
target distribution (against the softmax itself, 15,000 draws per draft); every accepted count is what the plain run's tokens
say it must be; no rejected position is ever published and the prefix cache ends as after a plain run; the counters
add up."""
import os

import pytest
import torch
from PIL import Image

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.config import SpeculativeConfig
from minivlm.engine.spec_decode.ngram import propose, verify
from panels.holder import EXAMPLES_DIR

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
PICTURES = [Image.open(os.path.join(EXAMPLES_DIR, n)) for n in ("three_shapes.png", "two_shapes.png", "red_circle.png")]


def requests():
    return [Request(prompt="Describe the picture.", images=[PICTURES[0]]),
            Request(prompt="What shapes are in the picture?", images=[PICTURES[1]]),
            Request(prompt="Read this back: red circle, blue square, red circle, blue square, red circle."),
            Request(prompt="What color is the shape?", images=[PICTURES[2]])]


def engine(**kw) -> Engine:
    return Engine(EngineConfig(device="cpu", **{"num_blocks": 128, **kw}))


@pytest.fixture(scope="module")
def plain():
    with engine() as e:
        yield e


@pytest.fixture(scope="module")
def reference(plain):
    return plain.generate(requests(), SamplingParams(max_tokens=48, ignore_eos=True, logprobs=2))


def check_same(outs, reference):
    for o, ref in zip(outs, reference):
        assert o.token_ids == ref.token_ids and len(o.token_ids) == 48
        for t, a, b in zip(o.token_ids, o.logprobs, ref.logprobs):
            assert abs(a[t] - b[t]) < 1e-5 and set(a) == set(b)


@pytest.mark.parametrize("settings", [{}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 16}],
                         ids=["whole", "chunked"])
def test_greedy_outputs_and_logprobs_equal_decoding_without_speculation(settings, reference):
    with engine(speculative_config=SPEC, **settings) as e:
        check_same(e.generate(requests(), SamplingParams(max_tokens=48, ignore_eos=True, logprobs=2)), reference)
        stats = e.spec_decode_stats()
        assert stats.num_accepted_tokens > 0 and stats.num_accepted_tokens <= stats.num_draft_tokens


def test_preemption_changes_no_token_and_leaks_no_block(plain, reference):
    prompts = [len(plain.make_sequence(r, SamplingParams(max_tokens=48))) for r in requests()]
    with engine(speculative_config=SPEC, num_blocks=-(-(max(prompts) + 48) // 16) + 1) as e:
        check_same(e.generate(requests(), SamplingParams(max_tokens=48, ignore_eos=True, logprobs=2)), reference)
        snap = e.snapshot()
        assert snap.num_preemptions > 0 and all(b.ref_count == 0 for b in snap.blocks)


def test_max_tokens_and_eos_as_without_speculation(plain):
    for params in (SamplingParams(max_tokens=7, ignore_eos=True), SamplingParams(max_tokens=40)):
        want = [o.token_ids for o in plain.generate(requests(), params)]
        with engine(speculative_config=SPEC) as e:
            got = [o.token_ids for o in e.generate(requests(), params)]
        assert got == want and all(len(t) <= params.max_tokens for t in got)


def test_each_accepted_count_is_what_the_plain_run_says_and_the_counters_add_up(reference):
    with engine(speculative_config=SPEC) as e:
        e.generate(requests(), SamplingParams(max_tokens=48, ignore_eos=True))
        events = e.events()
        stats = e.spec_decode_stats()
    label = {ev.request_id: ev.num_prompt_tokens for ev in events if ev.kind == "arrived"}
    spec = [ev for ev in events if ev.kind == "speculated"]
    assert spec
    done = {rid: 0 for rid in label}  # answer tokens emitted so far, replayed from the events
    for ev in events:
        if ev.kind == "scheduled":
            for r in ev.plan:
                if r["sample"] and "draft" not in r:
                    done[r["request_id"]] += 1
        elif ev.kind == "speculated":
            answer = reference[list(label).index(ev.request_id)].token_ids
            n = done[ev.request_id]  # the step's guesses stand for answer tokens n, n+1, ...
            truth = 0
            while truth < len(ev.draft) and ev.draft[truth] == answer[n + truth]:
                truth += 1
            assert ev.accepted == truth, (ev.request_id, n, ev.draft, answer[n:n + 5])
            done[ev.request_id] += ev.accepted + 1
    assert sum(ev.accepted for ev in spec) == stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(len(ev.draft) for ev in spec) == stats.num_draft_tokens and len(spec) == stats.num_drafts
    assert stats.accepted_per_pos == [sum(ev.accepted > j for ev in spec) for j in range(len(stats.accepted_per_pos))]


def test_no_rejected_position_is_published_and_the_cache_ends_as_after_a_plain_run(plain):
    reqs = requests()
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    plain.reset_prefix_cache()
    want = plain.generate(reqs, params)
    plain_keys = set(plain.core.block_manager.key_to_block)
    with engine(speculative_config=SPEC) as e:
        outs = e.generate(reqs, params)
        events = e.events()
        keys = set(e.core.block_manager.key_to_block)
        rejected = sum(len(ev.draft) - ev.accepted for ev in events if ev.kind == "speculated")
        full = {o.request_id: e.make_sequence(r, params).token_ids + w.token_ids for r, o, w in zip(reqs, outs, want)}
    assert rejected > 0 and keys == plain_keys
    stored = [ev for ev in events if ev.kind == "BlockStored"]
    assert stored
    for ev in stored:  # every block published holds the request's real tokens at a block boundary, never a guess
        tokens, bs = full[ev.request_id], len(ev.token_ids)
        assert any(tokens[i:i + bs] == ev.token_ids for i in range(0, len(tokens) - bs + 1, bs)), ev.request_id


@pytest.mark.slow  # a statistical check over many draws: CI runs it with -m slow
def test_rejection_sampling_keeps_the_target_distribution():
    """The first emitted token of a sampled request with a 2-token draft, drawn 15,000 times, follows the target
    softmax (temperature, top-k, top-p applied) within 4 standard errors on every token, whatever the draft."""
    torch.manual_seed(0)
    logits = torch.randn(3, 12) * 2
    params = SamplingParams(temperature=0.8, top_k=8, top_p=0.95)
    from minivlm.engine.sampling.sampler import filter_top_k_top_p
    target = filter_top_k_top_p(logits[:1] / 0.8, torch.tensor([8]), torch.tensor([0.95])).softmax(-1)[0]
    gen = torch.Generator().manual_seed(1)
    for draft in ([int(target.argmax()), 3], [int(target.argsort()[-4]), 5]):
        n = 15_000
        counts = torch.zeros(12)
        for _ in range(n):
            counts[verify(logits, draft, params, gen)[0]] += 1
        freq = counts / n
        se = (target * (1 - target) / n).sqrt()
        assert ((freq - target).abs() <= 4 * se + 1e-4).all(), (freq, target)


def test_the_proposer_finds_the_longest_recent_ngram_and_never_proposes_a_placeholder():
    cfg = SpeculativeConfig(prompt_lookup_max=3, prompt_lookup_min=1)
    tokens = [5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 2, 5, 6, 7]
    assert propose(tokens, [0] * len(tokens), cfg, 3) == ([2, 2, 5], 9)  # "5 6 7" most recently followed by 2 2 5
    types = [0] * len(tokens)
    types[9] = 1  # an image placeholder right after the most recent match: cut there, try the older one
    assert propose(tokens, types, cfg, 3) == ([8, 9, 1], 3)
    assert propose([1, 2, 3], [0, 0, 0], cfg, 2) == ([], -1)
    assert propose([4, 1, 2, 1, 2], [0] * 5, cfg, 4) == ([1, 2, 1, 2], 3)  # a loop, guessed on past the end
    with pytest.raises(ValueError, match="ngram"):
        SpeculativeConfig.parse({"method": "eagle"})


def test_the_step_through_says_what_was_guessed_accepted_and_given_back():
    from minivlm.views.events import describe, describe_plan
    from panels.i18n import EN, ZH
    from panels.i18n.events import describe_in, plan_in
    with engine(speculative_config=SPEC) as e:
        e.generate(requests()[:1], SamplingParams(max_tokens=40, ignore_eos=True))
        events = e.events()
    spec = [ev for ev in events if ev.kind == "speculated"]
    plans = [ev for ev in events if ev.kind == "scheduled" and any("draft" in r for r in ev.plan)]
    assert spec and plans
    for ev in spec:
        s = describe(ev)
        assert s == describe_in(ev, EN) and f"proposed {len(ev.draft)} token(s) found at token {ev.found_at}" in s
        assert (f"accepted {ev.accepted}" in s) and (("given back" in s) == bool(ev.given_back))
        assert "{" not in describe_in(ev, ZH) and describe_in(ev, ZH) != s
    for ev in plans:
        line = describe_plan(ev)
        assert "guessed token(s) in slots" in line and line.endswith(plan_in(ev, EN))


def test_metrics_serve_the_counters_and_generation_tokens_count_accepted_guesses():
    """/metrics's spec_decode counters are the engine's; vllm:generation_tokens counts every token a speculating
    step emitted (its accepted guesses too), so it equals the answers' length."""
    from prometheus_client import CollectorRegistry, generate_latest

    from minivlm.api.metrics import EngineCollector, RequestCounts
    with engine(speculative_config=SPEC) as e:
        outs = e.generate(requests(), SamplingParams(max_tokens=48, ignore_eos=True))
        stats = e.spec_decode_stats()
        counts = RequestCounts()
        counts.read_events(e, caching=True)
        registry = CollectorRegistry()
        registry.register(EngineCollector(lambda: e, lambda _: "m"))
        text = generate_latest(registry).decode()
    assert counts.counts["generation_tokens"] == sum(len(o.token_ids) for o in outs) == 4 * 48
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("vllm:spec_decode"))
    assert float(lines['vllm:spec_decode_num_accepted_tokens_total{model_name="m"}']) == stats.num_accepted_tokens
    assert float(lines['vllm:spec_decode_num_draft_tokens_total{model_name="m"}']) == stats.num_draft_tokens
    per_pos = [float(lines[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="{p}"}}'])
               for p in range(len(stats.accepted_per_pos))]
    assert sum(per_pos) == stats.num_accepted_tokens <= stats.num_draft_tokens


def test_the_block_map_stars_the_blocks_that_held_guesses_and_says_what_became_of_them():
    from panels.plots import block_map_figure, drafted_blocks
    with engine(speculative_config=SPEC) as e:
        e.generate(requests()[:1], SamplingParams(max_tokens=40, ignore_eos=True))
        events = e.events()
        snap = e.snapshot()
    step = next(ev for ev in events if ev.kind == "speculated" and 0 < ev.accepted < len(ev.draft)).step
    plan = next(ev for ev in events if ev.kind == "scheduled" and ev.step == step).plan
    verdict = next(ev for ev in events if ev.kind == "speculated" and ev.step == step)
    slots = next(r["draft_slots"] for r in plan if "draft" in r)
    drafts = drafted_blocks(events, step, 16)
    assert set(drafts) == {s // 16 for s in slots}
    text = "<br>".join(drafts.values())
    assert text.count("accepted") == verdict.accepted and text.count("rejected") == len(slots) - verdict.accepted
    fig = block_map_figure(snap, drafts=drafts)
    assert [tr for tr in fig.data if tr.name == "guessed tokens this step"][0].text == tuple(drafts.values())


def test_the_status_line_says_speculation_is_on_and_its_method_in_both_languages(plain):
    """#52.4: the header's status line (and the start-up line) names the method and its settings; off, it says
    nothing of it."""
    from panels.holder import status_line
    from panels.i18n import ZH
    assert "speculative" not in status_line(plain) and "推测解码" not in status_line(plain, ZH)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5, "prompt_lookup_min": 2}
    with plain.isolated(speculative_config=spec) as e:
        assert e.config.speculative_config == SpeculativeConfig(**spec)
        assert status_line(e).endswith(" · speculative decoding: ngram (prompt lookup), up to 3 guessed tokens a "
                                       "step, matching the last 2–5 tokens")
        assert status_line(e, ZH).endswith(" · 推测解码：ngram（提示查找），每步最多猜 3 个 token，匹配最近 2–5 个 token")
