"""Qwen3.5 (recurrent state in 3 of 4 layers) and Gemma 3 (sliding windows, images attending both ways) served on
KV-cache groups: the engine's logprobs equal HF transformers' teacher-forced ones (fp32) on random checkpoints saved
by transformers with the real processor classes, alone and batched; chunked prefill (across an image span) and
preemption change no token; the prefix cache serves a repeated request and turn 2 of a chat with a new image; a
decoding Gemma request holds at most ceil(window / block) + 2 sliding blocks; nothing is leaked."""
import math

import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams
from tests.test_parity import check_against_hf, scene

FAMILIES = ["qwen3_5", "gemma3"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from tools.make_checkpoint_gemma3 import make_gemma3_checkpoint
    from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
    root = tmp_path_factory.mktemp("hybrid")
    return {"qwen3_5": make_qwen3_5_checkpoint(str(root / "qwen3_5"), seed=3),
            "gemma3": make_gemma3_checkpoint(str(root / "gemma3"), seed=4)}


def engine(path, **kw) -> Engine:
    return Engine(EngineConfig(model=path, device="cpu", dtype="float32", max_model_len=1024,
                               **{"num_blocks": 128, **kw}))


@pytest.fixture(scope="module")
def engines(checkpoints):
    return {f: engine(p) for f, p in checkpoints.items()}


def chat(*turns):
    """messages from (text, image or None) user turns and assistant strings."""
    out = []
    for t in turns:
        if isinstance(t, str):
            out.append({"role": "assistant", "content": [{"type": "text", "text": t}]})
        else:
            text, image = t
            content = ([{"type": "image", "image": image}] if image is not None else []) + [{"type": "text", "text": text}]
            out.append({"role": "user", "content": content})
    return out


LONG = ("Look closely at the picture and tell me, in as much detail as you can, what shapes you see, what colour "
        "each of them is, where each one sits, and whether any two of them overlap or touch each other. ")


def requests():
    """Two image sizes, a text-only chat, a prompt longer than the test checkpoints' sliding window (24 tokens)."""
    return [
        Request(messages=chat(("What colour is the shape?", scene(100, 80, (220, 30, 30))))),
        Request(messages=chat((LONG, scene(60, 120, (40, 70, 220))))),
        Request(messages=chat(("Hello, how are you?", None), "fine", ("What is a square?", None))),
    ]


def leaks(e: Engine) -> dict:
    """What the groups still hold with no request in the engine (cached-but-free blocks and checkpoints are free)."""
    snap = e.snapshot()
    out = {}
    for g in snap.groups:
        held = g.size - g.free - (len(g.checkpoints) if g.kind == "recurrent" else 0)
        if held or g.block_tables:
            out[g.name] = (held, g.block_tables)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_single_and_batched_requests_match_hf(family, checkpoints, engines):
    e = engines[family]
    e.reset_prefix_cache()
    reqs = requests()
    for r in reqs[:2]:
        check_against_hf(checkpoints[family], family, r, e.generate(r, SamplingParams(max_tokens=6, ignore_eos=True,
                                                                                      logprobs=1)))
    outs = e.generate(reqs, SamplingParams(max_tokens=5, ignore_eos=True, logprobs=2))
    for r, out in zip(reqs, outs):
        check_against_hf(checkpoints[family], family, r, out)
    assert leaks(e) == {}


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_and_preemption_change_no_token(family, checkpoints, engines):
    reqs = requests()
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    reference = [o.token_ids for o in engines[family].generate(reqs, params)]
    # chunks of 16 tokens: Gemma's image spans (16 tokens, between boi/eoi) are never split, the recurrent state
    # goes from chunk to chunk in its slot
    chunked = engine(checkpoints[family], enable_chunked_prefill=True, max_num_batched_tokens=16)
    assert [o.token_ids for o in chunked.generate(reqs, params)] == reference
    assert leaks(chunked) == {}
    # a pool that holds every prompt but not every answer: decoding must preempt (and recompute, or resume from a
    # checkpoint)
    lens = [len(engines[family].make_sequence(r, params)) for r in reqs]
    small = engine(checkpoints[family], num_blocks=sum(math.ceil(n / 16) for n in lens) + 1)
    assert [o.token_ids for o in small.generate(reqs, params)] == reference
    assert small.snapshot().num_preemptions > 0
    assert leaks(small) == {}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_repeated_request_and_turn_two_with_a_new_image_hit_the_cache(family, engines):
    e = engines[family]
    e.reset_prefix_cache()
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    turn1 = Request(messages=chat((LONG, scene(100, 80, (220, 30, 30)))))
    first = e.generate(turn1, params)
    again = e.generate(Request(messages=turn1.messages), params)
    assert again.token_ids == first.token_ids and again.num_cached_tokens >= first.num_prompt_tokens // 2
    turn2 = Request(messages=chat((LONG, scene(100, 80, (220, 30, 30))), first.text,
                                  ("And this one?", scene(80, 100, (30, 160, 60)))))
    second = e.generate(turn2, params)
    assert second.num_cached_tokens >= first.num_prompt_tokens // 2, (second.num_cached_tokens, first.num_prompt_tokens)
    e.reset_prefix_cache()
    assert e.generate(Request(messages=turn2.messages), params).token_ids == second.token_ids  # same tokens uncached


def test_a_decoding_gemma_request_holds_at_most_the_window_in_sliding_blocks(checkpoints):
    e = engine(checkpoints["gemma3"])
    window = next(g.window for g in e.snapshot().groups if g.kind == "sliding_window")
    bound, worst = math.ceil(window / 16) + 2, []

    def watch(core):
        g = next(g for g in core.snapshot().groups if g.kind == "sliding_window")
        worst.append(max((sum(b is not None for b in t) for t in g.block_tables.values()), default=0))
    e.core.after_step = watch
    out = e.generate(Request(messages=chat((LONG, None))), SamplingParams(max_tokens=80, ignore_eos=True))
    assert out.num_prompt_tokens + 80 > 4 * window  # long enough for the window to move many times
    assert 0 < max(worst[1:]) <= bound, (max(worst), bound)


@pytest.mark.parametrize("family", FAMILIES)
def test_ten_blocks_still_run_a_64_token_request(family, checkpoints):
    """The pool contract (docs/API.md): num_blocks pins the full-attention group; the others are sized to fit."""
    e = engine(checkpoints[family], num_blocks=10)
    out = e.generate(Request(prompt="Tell me about squares."), SamplingParams(max_tokens=64, ignore_eos=True))
    assert len(out.token_ids) == 64 and leaks(e) == {}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_step_through_says_why_a_block_left_the_window_or_a_state_was_saved(family, engines):
    """Every event of a hybrid run reads as a sentence, the same in the page's English as the engine's, and in
    Chinese with no field left unfilled; the group events say what happened."""
    from minivlm.views.events import describe
    from panels.i18n import EN, ZH
    from panels.i18n.events import describe_in
    e = engines[family]
    e.reset_prefix_cache()
    since = e.snapshot().last_event_seq
    e.generate(Request(messages=chat((LONG, None))), SamplingParams(max_tokens=40, ignore_eos=True))
    events = e.events(since)
    sentences = [describe(ev) for ev in events]
    assert all(describe_in(ev, EN) == s for ev, s in zip(events, sentences))
    assert not any("{" in describe_in(ev, ZH) for ev in events)
    wanted = "window moved on" if family == "gemma3" else "recurrent state after"
    assert any(wanted in s for s in sentences), sentences[:20]


def test_generation_config_fills_only_what_a_request_leaves_unset(checkpoints, tmp_path):
    """A published checkpoint's generation_config.json (do_sample, temperature, top_k, top_p) gives the API's
    defaults: a request without temperature samples with them, temperature=0 stays greedy."""
    import json
    import shutil

    import openai

    import app as app_module
    from panels.holder import EngineHolder
    from tests.app_server import free_port
    path = str(tmp_path / "qwen3_5")
    shutil.copytree(checkpoints["qwen3_5"], path)
    with open(f"{path}/generation_config.json") as f:
        gen = json.load(f)
    gen.update(do_sample=True, temperature=0.6, top_k=20, top_p=0.95)
    with open(f"{path}/generation_config.json", "w") as f:
        json.dump(gen, f)
    holder = EngineHolder(EngineConfig(model=path, device="cpu", dtype="float32", num_blocks=64))
    holder.load()
    port = free_port()
    demo = app_module.serve(holder, port=port, block=False)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "Tell me about squares."}]

        def text(**kw):
            r = client.chat.completions.create(model=path, messages=messages, max_tokens=12, **kw)
            return r.choices[0].message.content
        e, request = holder.engine, Request(messages=messages)
        greedy = e.generate(request, SamplingParams(max_tokens=12)).text
        sampled = e.generate(request, SamplingParams(max_tokens=12, temperature=0.6, top_k=20, top_p=0.95,
                                                     seed=7)).text
        assert text(temperature=0) == greedy
        assert text(seed=7) == sampled != greedy
    finally:
        demo.close()
        holder.engine.close()


@pytest.mark.parametrize("strategy", ["C", "none"])
def test_blocks_leaving_the_window_are_said_cached_only_where_a_lookup_finds_them(checkpoints, strategy):
    """A sliding-window block given back as the window moves is 'cached' exactly when a later prefix lookup finds
    it (its key is the one indexed); without prefix caching none is, and the sentence says which."""
    from minivlm.views.events import describe
    e = engine(checkpoints["gemma3"], cache_strategy=strategy)
    since = e.snapshot().last_event_seq
    e.generate(Request(messages=chat((LONG, None))), SamplingParams(max_tokens=40, ignore_eos=True))
    left = [ev for ev in e.events(since) if ev.kind == "freed" and ev.fields.get("window")]
    assert left
    cached = [b for ev in left for b in ev.fields["cached"]]
    assert bool(cached) == (strategy != "none")
    for ev in left:
        assert set(ev.fields["cached"]) <= set(ev.fields["block_ids"])
        said = describe(ev)
        assert ("not cached" in said or "the rest not" in said) == (ev.fields["cached"] != ev.fields["block_ids"])
