"""Chunked prefill: a prompt longer than the step's token budget is computed over several steps, mixed with
the running requests' decode tokens. The truth is the unchunked engine: the same tokens (greedy) and
logprobs within 1e-4, whatever the chunk size, with images split across chunks, prefix-cache hits and
preemption; block-manager invariants, replay == snapshot and partial block fills hold after every step."""
import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.views.events import replay
from minivlm.experiments.mm_cache import BLUE, GREEN, RED, shape_image
from tests.test_block_manager import check_invariants

BS = 8
PARAMS = SamplingParams(max_tokens=10, ignore_eos=True, logprobs=3)


def engine(path, chunk: int | None, **kw) -> Engine:
    kw = {"num_blocks": 160, "cache_strategy": "C", **kw}
    chunked = {"enable_chunked_prefill": True, "max_num_batched_tokens": chunk} if chunk else {}
    return Engine(EngineConfig(model=path, block_size=BS, dtype="float32", device="cpu", max_model_len=1024,
                               **chunked, **kw))


def requests(n: int = 6) -> list[Request]:
    """Images of different sizes (9 to 64 image tokens) at different offsets, and a text-only prompt."""
    reqs = [Request(prompt=f"Describe scene {i} in detail.", images=[shape_image((RED, BLUE, GREEN)[i % 3],
            size=(96 + 32 * i, 224 - 16 * i))], request_id=f"r{i}") for i in range(n - 1)]
    return reqs + [Request(prompt="Count from one to twenty, slowly and carefully, please.", request_id="text")]


def watch(eng: Engine, log: list):
    """After every step: block-manager invariants, replay == snapshot, and every block of a request that is
    part-way through its prefill shows exactly the tokens computed so far (full, partial, then empty)."""
    def check(core):
        s = core.scheduler
        live = list(s.running) + [q for q in s.waiting if core.block_manager.table(q)]
        check_invariants(core.block_manager, live)
        snap = core.snapshot()
        rebuilt = replay(core.events.since(0), core.num_blocks, BS)
        assert (rebuilt.blocks, rebuilt.block_tables, rebuilt.running) == (snap.blocks, snap.block_tables, snap.running)
        for seq in s.running:
            fills = [snap.blocks[b].num_tokens for b in core.block_manager.table(seq)]
            expected = [max(0, min(BS, seq.num_computed - j * BS)) for j in range(len(core.block_manager.table(seq)))]
            assert fills == expected, (seq.request_id, fills, expected)
            if seq.num_computed < seq.num_prompt_tokens:
                log.append((core.step_count, seq.request_id, seq.num_computed))
    eng.core.after_step = check


def assert_same(expected, outs):
    for a, b in zip(expected, outs):
        assert a.token_ids == b.token_ids, a.request_id
        worst = max(abs(a.logprobs[i][t] - b.logprobs[i][t]) for i, t in enumerate(a.token_ids))
        assert worst <= 1e-4, (a.request_id, worst)


@pytest.fixture(scope="module")
def path(checkpoints):
    return checkpoints["qwen3_vl"]


@pytest.fixture(scope="module")
def unchunked(path):
    with engine(path, None) as eng:
        return eng.generate(requests(), PARAMS)


@pytest.mark.parametrize("chunk", [BS, 3 * BS, 37])
def test_chunked_equals_unchunked_with_images_split_across_chunks(path, unchunked, chunk):
    partial = []
    with engine(path, chunk) as eng:
        watch(eng, partial)
        outs = eng.generate(requests(), PARAMS)
        events = eng.events()
        spans = {e.request_id: e.image_spans for e in events if e.kind == "arrived"}
    assert_same(unchunked, outs)
    scheduled = [e for e in events if e.kind == "scheduled"]
    assert all(e.num_tokens <= chunk for e in scheduled) and {"mixed"} <= {e.step_kind for e in scheduled}
    # a chunk boundary falls strictly inside an image: its embeddings were sliced over steps
    inside = [(rid, c) for _, rid, c in partial for start, n in spans[rid] if start < c < start + n]
    assert inside and len({rid for _, rid, _ in partial}) >= 3


def test_mixed_steps_carry_per_request_token_counts(path):
    with engine(path, 3 * BS) as eng:
        outs = eng.generate(requests(3), PARAMS)
        events = eng.events()
    mixed = [e for e in events if e.kind == "scheduled" and e.step_kind == "mixed"]
    assert mixed and all(sum(e.num_scheduled_tokens.values()) == e.num_tokens for e in mixed)
    assert all(1 in e.num_scheduled_tokens.values() for e in mixed)  # a decode beside a chunk
    assert any(max(e.num_scheduled_tokens.values()) > 1 for e in mixed)
    for out in outs:  # every prompt token computed once, then one token per decode step
        total = sum(e.num_scheduled_tokens.get(out.request_id, 0) for e in events if e.kind == "scheduled")
        assert total == out.num_prompt_tokens + len(out.token_ids) - 1


def test_prefix_cache_hits_skip_the_cached_part(path, unchunked):
    with engine(path, 37) as eng:
        eng.generate(requests()[:2], SamplingParams(max_tokens=1))
        first = len(eng.events())
        outs = eng.generate(requests(), PARAMS)
        events = eng.events(since=first)
    assert_same(unchunked, outs)
    for out in outs[:2]:
        assert out.num_cached_tokens >= BS
        computed = sum(e.num_scheduled_tokens.get(out.request_id, 0) for e in events if e.kind == "scheduled")
        assert computed == out.num_prompt_tokens - out.num_cached_tokens + len(out.token_ids) - 1


@pytest.mark.parametrize("strategy", ["none", "C"])
def test_preempting_a_partly_prefilled_request_recomputes_it(path, strategy):
    """Two text streams decode while a 448x448-image request (271 tokens) is prefilled 8 tokens a step in a
    pool with a block to spare: the streams' next blocks preempt it (the newest) part-way through its prefill."""
    reqs = [Request(prompt="Count from one to twenty, slowly.", request_id="s0"),
            Request(prompt="Name three colours, please.", request_id="s1"),
            Request(prompt="Describe.", images=[shape_image(RED, size=(448, 448))], request_id="img")]
    params = SamplingParams(max_tokens=40, ignore_eos=True, logprobs=2)
    with engine(path, None, cache_strategy=strategy) as eng:
        expected = eng.generate(reqs, params)
    need = sum(-(-len(eng.make_sequence(r, params)) // BS) for r in reqs)
    partial = []
    with engine(path, BS, cache_strategy=strategy, num_blocks=need + 1) as eng:
        watch(eng, partial)
        outs = eng.generate(reqs, params)
        events = eng.events()
    assert_same(expected, outs)
    victims = [e for e in events if e.kind == "preempted" and e.request_id == "img"]
    assert victims, "the image request was never preempted"
    partly = {(step, rid) for step, rid, computed in partial if computed > 0}
    assert any((v.step - 1, "img") in partly for v in victims), "preempted only before or after its prefill"


def test_many_requests_at_once(path):
    reqs = requests(12)
    with engine(path, None, max_num_seqs=12) as eng:
        expected = eng.generate(reqs, PARAMS)
    with engine(path, 2 * BS + 3, max_num_seqs=12) as eng:
        watch(eng, [])
        assert_same(expected, eng.generate(reqs, PARAMS))


def test_a_stream_keeps_decoding_while_a_long_prefill_is_chunked(path):
    """Steps, not time: while a 448x448-image prompt (271 tokens) is prefilled, the running stream gains one
    token every step with chunking; without it the whole prefill takes a step in which the stream waits."""
    long = Request(prompt="Describe.", images=[shape_image(BLUE, size=(448, 448))], request_id="long")
    stream = Request(prompt="Count from one to twenty.", request_id="stream")
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    for chunk in (3 * BS, None):
        with engine(path, chunk) as eng, eng.loop.lock:
            core = eng.core
            s = eng.make_sequence(stream, params)
            core.step([s])
            for _ in range(3):
                core.step([])
            x = eng.make_sequence(long, params)
            stalls = steps = 0
            new = [x]
            while x.num_output_tokens == 0:
                before = s.num_output_tokens
                core.step(new)
                new, steps = [], steps + 1
                stalls += s.num_output_tokens == before
        if chunk:
            assert steps >= 271 // (3 * BS) and stalls == 0
        else:
            assert steps == 1 and stalls == 1


def test_config_accepts_a_budget_below_max_model_len_only_when_chunking():
    with pytest.raises(ValueError, match="enable_chunked_prefill"):
        EngineConfig(max_model_len=4096, max_num_batched_tokens=256)
    assert EngineConfig(max_model_len=4096, max_num_batched_tokens=256, enable_chunked_prefill=True)
    assert EngineConfig(enable_chunked_prefill=True).max_num_batched_tokens == 512
    with pytest.raises(ValueError, match="True or False"):
        EngineConfig(enable_chunked_prefill="yes")


@pytest.mark.parametrize("stage", ["vision encode", "model run", "sampling"])
def test_a_fault_part_way_through_a_chunked_prefill_fails_only_that_request(path, unchunked, stage, monkeypatch):
    """r1 faults once it has computed some chunks (model run), or at its image (vision encode) or first token
    (sampling); its unwritten blocks are unpublished, a twin of it that may have hit them recomputes, and every
    other request gives the unchunked tokens. Invariants and replay hold after every step."""
    from tests.faults import inject
    reqs = requests() + [Request(prompt="Describe scene 1 in detail.", images=[shape_image(BLUE, size=(128, 208))],
                                 request_id="twin")]
    with engine(path, 13) as eng, eng.loop.lock:
        watch(eng, [])
        seqs = [eng.make_sequence(r, PARAMS) for r in reqs]
        r1 = seqs[1]
        inject(monkeypatch, eng, stage, lambda rid: rid == "r1" and (stage != "model run" or r1.num_computed > 0))
        failed, new = [], seqs
        while new or eng.core.scheduler.has_work():
            failed += [s.request_id for s, _ in eng.core.step(new).failed]
            new = []
        assert all(b.ref_count == 0 for b in eng.core.block_manager.blocks)
    assert failed == ["r1"]
    by_id = {o.request_id: o.token_ids for o in unchunked}
    assert all(s.output_ids == by_id[s.request_id] for s in seqs if s.request_id not in ("r1", "twin"))
    assert seqs[-1].output_ids == by_id["r1"]
