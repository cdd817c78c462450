"""The encoder cache (#39 item 4): the runner owns each image's vision-tower output, kept by its vision key (per cache
salt) and sized in embeddings; the scheduler's book (EncoderCacheManager) decides what a step encodes and frees. The
truths: hits, misses and frees against hand-computed sequences of requests (the book alone, then the engine with its
tower calls counted); the plan logged is the plan executed, a fault included (a request that read K/V nobody wrote
is rewound by update and the next logged plan recomputes it); a Sequence holds no pixels, embeddings or vision jobs."""
import pytest
import torch

from minivlm import Request, SamplingParams
from minivlm.engine.encoder.encoder_cache import EncoderCacheManager, embedding_bytes, encoder_cache_size
from minivlm.experiments.mm_cache import BLUE, GREEN, Q, RED, shape_image
from tests.faults import inject

PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)


def test_the_book_counts_hits_and_misses_and_frees_the_least_recently_released():
    m = EncoderCacheManager(size=200)  # two outputs of 100 embeddings each
    assert m.take(1, ("A",), [100]) == (0,) and m.end_step() == ()  # r1: A is a miss, encoded in its step
    assert m.take(2, ("A",), [100]) == () and m.end_step() == ()  # r2: a hit on A, which r1 still uses
    assert m.take(3, ("B",), [100]) == (0,)  # r3: a miss on B
    assert m.take(4, ("B", "B"), [100, 100]) == (0, 1)  # r4, same step: two hits on B, still in its job's todo
    assert m.end_step() == () and (m.hits, m.misses) == (3, 2) and m.stats()["in_use"] == 200
    for r in (1, 2, 3, 4):
        m.release(r)  # A is released first, so it goes first
    assert list(m.unused) == ["A", "B"] and m.stats()["in_use"] == 0 and m.used == 200
    assert m.take(5, ("A|salt",), [100]) == (0,) and m.end_step() == ("A",)  # another salt: a miss; it evicts A
    assert m.take(6, ("B",), [100]) == () and m.take(7, ("A",), [100]) == (0,)  # B cached: a hit; A: a miss again
    assert m.end_step() == () and m.used == 300  # nothing cached is left to free: in use may exceed the size
    m.release(5)  # A|salt is released while the others still use more than the size: freed at once
    m.release(6)
    m.release(7)
    assert m.end_step() == ("A|salt",) and list(m.unused) == ["B", "A"]
    assert m.take(8, ("C",), [100]) == (0,)  # r8: a miss that evicts B ...
    m.release(8)  # ... and fails before the runner stored C: the core reports C lost
    m.lost(["C"])
    assert "C" not in m.rows and m.used == 100 and m.end_step() == ("B",)
    m.reset()
    assert m.end_step() == ("A",) and m.used == 0
    assert (m.hits, m.misses) == (4, 5)


def test_vision_cache_bytes_is_converted_to_this_model_s_embeddings(engines):
    engine = engines["qwen3_vl"]
    row = embedding_bytes(engine.model)  # hidden x 4 bytes x (1 + deepstack features)
    deep = len(engine.model.hf_config.vision_config.deepstack_visual_indexes)
    assert row == engine.model.text_config.hidden_size * 4 * (1 + deep)
    assert encoder_cache_size(engine.config, engine.model) == 8192
    with engine.isolated(vision_cache_bytes=row * 100 + 5, num_blocks=32) as small:
        assert small.encoder_cache_stats()["size"] == 100
    with pytest.raises(ValueError, match="not both"):
        engine.isolated(vision_cache_bytes=1, encoder_cache_size=1)


def test_hits_misses_and_frees_of_a_hand_computed_sequence_of_requests(engines, monkeypatch):
    """Strategy none (no prefix hit skips an image), a cache of two images' outputs, one request at a time:
    A miss, A hit, B miss, A under another salt miss (evicts A), A miss (evicts B), B miss (evicts the salted A); then
    two requests of C in one step: one miss and one hit, one tower call (and it evicts A)."""
    base = engines["qwen3_vl"]
    image = {"A": shape_image(RED), "B": shape_image(BLUE), "C": shape_image(GREEN)}
    n = base.make_sequence(Request(prompt=Q, images=[image["A"]]), PARAMS).images[0].num_tokens
    with base.isolated(cache_strategy="none", num_blocks=64, encoder_cache_size=2 * n) as engine:
        calls, frees, real = [], [], engine.model.vision.encode
        monkeypatch.setattr(engine.model.vision, "encode", lambda pixels, grids: calls.append(len(grids)) or
                            real(pixels, grids))
        engine.core.after_step = lambda core: frees.extend(core.last_plan.free_encoder_keys)
        key = {name: engine.make_sequence(Request(prompt=Q, images=[img]), PARAMS).vision_keys[0]
               for name, img in image.items()}
        key["A|s"] = engine.make_sequence(Request(prompt=Q, images=[image["A"]], cache_salt="s"), PARAMS).vision_keys[0]
        seen = []
        for name, salt in [("A", None), ("A", None), ("B", None), ("A", "s"), ("A", None), ("B", None)]:
            engine.generate(Request(prompt=Q, images=[image[name]], cache_salt=salt), PARAMS)
            s = engine.encoder_cache_stats()
            seen.append((s["hits"], s["misses"]))
        assert seen == [(0, 1), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]
        assert frees == [key["A"], key["B"], key["A|s"]]
        engine.generate([Request(prompt=Q, images=[image["C"]], request_id=f"c{i}") for i in range(2)], PARAMS)
        stats = engine.encoder_cache_stats()
    assert (stats["hits"], stats["misses"]) == (2, 6) and calls == [1] * 6  # one tower call per miss, one image each
    assert frees == [key["A"], key["B"], key["A|s"], key["A"]]
    assert stats["entries"] == 2 and stats["used"] == 2 * n and stats["in_use"] == 0


def record_execution(monkeypatch, core) -> list:
    """(step, stage, the items the runner got) for every forward and encode_images call, recorded before it runs."""
    got = []
    for stage, name in (("model run", "forward"), ("vision encode", "encode_images")):
        real = getattr(core.runner, name)

        def recorder(items, *args, _real=real, _stage=stage):
            got.append((core.step_count, _stage, items.to_dict() if _stage == "model run" else
                        [(j.request_id, j.keys, j.todo) for j in items]))
            return _real(items, *args)
        monkeypatch.setattr(core.runner, name, recorder)
    return got


def assert_ran_what_was_logged(got, plans, events):
    """Every forward ran the logged plan of its step (or some of its items, word for word), every encode the plan's
    jobs; each logged plan carried exactly the plan object of its step."""
    logged = {e.step: e.plan for e in events if e.kind == "scheduled"}
    for step, plan in plans.items():
        assert logged[step] == plan.to_dict()
    for step, stage, items in got:
        if stage == "model run":
            assert items and all(item in logged[step] for item in items), (step, items, logged[step])
        else:
            jobs = [(j.request_id, j.keys, j.todo) for j in plans[step].encodes]
            assert items and all(job in jobs for job in items), (step, items, jobs)


def test_the_plan_logged_is_the_plan_executed(checkpoints, monkeypatch):
    """Chunked prefill with preemptions, prefix hits and images: the runner never runs anything the log lacks."""
    from tests.test_plan import chunked_engine, workload
    with chunked_engine(checkpoints["qwen3_vl"]) as engine:
        core, plans = engine.core, {}
        got = record_execution(monkeypatch, core)
        core.after_step = lambda c: plans.__setitem__(c.step_count, c.last_plan) \
            if c.last_plan is not None and c.last_plan.step == c.step_count else None
        workload(engine)
        events = engine.events()
    assert {"model run", "vision encode"} <= {stage for _, stage, _ in got} and "preempted" in {e.kind for e in events}
    assert_ran_what_was_logged(got, plans, events)


@pytest.mark.parametrize("stage", ["vision encode", "model run"])
def test_a_request_that_read_unwritten_kv_is_rewound_and_the_next_logged_plan_recomputes_it(checkpoints, monkeypatch,
                                                                                            stage):
    """Two equal prompts in one step: the second hits the blocks the first publishes as it is planned. The first
    fails before writing them: the second's forward runs as planned (it read K/V nobody wrote), samples nothing, and
    update rewinds it to the first such block; the next step's logged plan computes it from there. Every forward
    ran a logged plan, and the second's answer is the cold one."""
    from minivlm import Engine, EngineConfig
    params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=3)
    request = lambda rid: Request(prompt=Q, images=[shape_image(RED)], request_id=rid)  # noqa: E731
    config = EngineConfig(model=checkpoints["qwen3_vl"], device="cpu", dtype="float32", num_blocks=64, block_size=8,
                          max_model_len=512)
    with Engine(config) as cold:
        want = cold.generate(request("alone"), params)
    with Engine(config) as engine:
        core = engine.core
        inject(monkeypatch, engine, stage, lambda rid: rid == "first")
        got = record_execution(monkeypatch, core)
        new, plans, outputs, tokens = [engine.make_sequence(request(rid), params) for rid in ("first", "second")], {}, {}, []
        while new or core.scheduler.has_work():
            res = core.step(new)
            new = []
            plans[core.step_count] = core.last_plan
            outputs.update({s.request_id: ev.output for s, ev in res.events if ev.finished})
            tokens += [(core.step_count, s.request_id) for s, ev in res.events if ev.token_ids]
        events = engine.events()
        assert all(b.ref_count == 0 for b in core.block_manager.blocks) and not core.runner.inputs
    assert_ran_what_was_logged(got, plans, events)
    [first_step] = [s for s, p in plans.items() if any(r.request_id == "second" and r.admitted for r in p)]
    second = next(r for r in plans[first_step] if r.request_id == "second")
    assert second.hits and second.sample  # planned on the first's blocks, to sample after its prompt
    assert (first_step, "second") not in tokens  # its token of that step was read from unwritten K/V: not emitted
    again = next(r for r in plans[first_step + 1] if r.request_id == "second")
    assert again.start == 0 and again.end == second.end  # rewound to the first block the first request published
    assert outputs["second"].token_ids == want.token_ids
    for a, b in zip(outputs["second"].logprobs, want.logprobs):
        assert a.keys() == b.keys() and max(abs(a[t] - b[t]) for t in a) < 1e-4


@pytest.mark.parametrize("async_vision", [False, True], ids=["in-step", "async-vision"])
def test_a_sequence_holds_no_pixels_embeddings_or_vision_jobs(engines, async_vision):
    """Made, waiting, running or finished: a request's only tensor is its positions; its pixels wait beside it for
    admission, then stay in the runner until its images are taken; a finished request holds no encoder output."""
    forbidden = {"pixel_values", "pixel_mask", "image_embeds", "deepstack", "vision_job", "vision_ready"}
    with engines["qwen3_vl"].isolated(num_blocks=64, async_vision=async_vision) as engine:
        seen = []

        def check(core):
            for seq in core.live.values():
                assert not forbidden & set(dir(seq))
                assert [k for k, v in vars(seq).items() if isinstance(v, torch.Tensor)] == ["prompt_positions"]
                seen.append((seq.seq_id in core.runner.inputs, core.scheduler.encoder.took(seq.seq_id)))
        seq = engine.make_sequence(Request(prompt=Q, images=[shape_image(RED)]), PARAMS)
        assert engine.core.image_inputs[seq].pixel_values is not None and not forbidden & set(dir(seq))
        engine.core.after_step = check
        reqs = [Request(prompt=f"{Q} {i}", images=[shape_image(BLUE, size=(96 + 16 * i, 96))]) for i in range(3)]
        outs = engine.generate(reqs, PARAMS)
        assert all(len(o.token_ids) == 3 for o in outs)
        assert not engine.core.runner.inputs and not engine.core.runner.pending
        assert engine.encoder_cache_stats()["in_use"] == 0 and engine.encoder_cache_stats()["misses"] == 3
    assert all(not (holds and took) for holds, took in seen)  # the pixels go once the images are taken
