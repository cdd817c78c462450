"""Engine behaviour: preemption, prefix-cache reuse, many callers at once, clear errors."""
import threading

import pytest
from PIL import Image

from minivlm import Engine, EngineConfig, Request, SamplingParams


def image(w, h, color):
    img = Image.new("RGB", (w, h), (235, 235, 235))
    img.paste(color, (w // 3, h // 3, 2 * w // 3, 2 * h // 3))
    return img


def mixed_requests():
    return [Request(prompt="What color is the shape?", images=[image(100 + 20 * i, 80, (200, 30 * i, 30))])
            for i in range(4)] + [Request(prompt="Hello, how are you?")]


def test_preemption_changes_no_token(checkpoints):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    roomy = Engine(EngineConfig(model=checkpoints["qwen2_5_vl"], num_blocks=256, cache_strategy="none"))
    tight = Engine(EngineConfig(model=checkpoints["qwen2_5_vl"], num_blocks=9, block_size=8, cache_strategy="none"))
    expected = [o.token_ids for o in roomy.generate(mixed_requests(), params)]
    got = [o.token_ids for o in tight.generate(mixed_requests(), params)]
    snap = tight.snapshot()
    assert snap.num_preemptions > 0, "the pool was meant to be too small for all requests at once"
    assert got == expected
    assert all(b.ref_count == 0 for b in snap.blocks) and not snap.block_tables
    roomy.close(), tight.close()


def test_repeated_request_is_served_from_prefix_cache(engines):
    engine = engines["qwen3_vl"]
    engine.reset_prefix_cache()
    req = Request(prompt="What color is the shape? Describe the image.", images=[image(120, 90, (40, 70, 220))])
    params = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=0)
    first = engine.generate(req, params)
    second = engine.generate(req, params)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens > 0 and second.num_cached_tokens % engine.config.block_size == 0
    assert all(not h.false_hit for h in second.cache_hits)
    assert second.token_ids == first.token_ids
    for tok, a, b in zip(first.token_ids, first.logprobs, second.logprobs):
        assert abs(a[tok] - b[tok]) < 1e-4  # the cached KV gives the cold run's logprobs


def test_two_threads_stream_in_one_batch(engines):
    engine = engines["qwen2_vl"]
    reqs = [Request(prompt="What shape is it?", images=[image(90, 90, (30, 170, 60))]), Request(prompt="Hello!")]
    params = SamplingParams(max_tokens=150, ignore_eos=True)  # long enough that the two runs overlap
    alone = [engine.generate(r, params).text for r in reqs]
    results, snaps, start = {}, [], threading.Barrier(2)

    def run(i):
        start.wait()
        text = ""
        for ev in engine.stream(reqs[i], params):
            text += ev.delta
            snaps.append(ev.snapshot)
        results[i] = (text, ev.text)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    assert results[0] == (alone[0], alone[0]) and results[1] == (alone[1], alone[1])
    assert any(len(s.running) == 2 for s in snaps), "the two streams never shared a decode batch"


def test_stream_events_carry_snapshots(engines):
    engine = engines["qwen3_vl"]
    events = list(engine.stream(Request(prompt="Hi", images=[image(64, 64, (0, 0, 200))]),
                                SamplingParams(max_tokens=5, ignore_eos=True)))
    assert len(events) == 5 and events[-1].finished and events[-1].output.finish_reason == "length"
    snap = events[0].snapshot
    assert snap.block_tables and all(b.ref_count >= 1 for b in snap.blocks if b.owners)
    assert {b.kind for b in snap.blocks if b.owners} <= {"text", "image", "mixed"}


def test_stop_strings_and_seeded_sampling(engines):
    engine = engines["qwen2_5_vl"]
    req = Request(prompt="Describe the image.", images=[image(80, 80, (250, 140, 20))])
    a = engine.generate(req, SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=7, ignore_eos=True))
    b = engine.generate(req, SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=7, ignore_eos=True))
    assert a.token_ids == b.token_ids
    assert len(a.text) > 3, "16 sampled tokens decode to more than 3 characters"
    stop = a.text[2:4]
    c = engine.generate(req, SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=7,
                                            ignore_eos=True, stop=[stop]))
    assert c.finish_reason == "stop" and stop not in c.text and a.text.startswith(c.text)


@pytest.mark.parametrize("make, message", [
    (lambda: SamplingParams(max_tokens=0), "max_tokens"),
    (lambda: SamplingParams(temperature=-1), "temperature"),
    (lambda: SamplingParams(temperature=float("nan")), "temperature"),
    (lambda: SamplingParams(top_p=0), "top_p"),
    (lambda: SamplingParams(top_p=1.5), "top_p"),
    (lambda: EngineConfig(block_size=0), "block_size"),
    (lambda: EngineConfig(cache_strategy="D"), "cache_strategy"),
    (lambda: EngineConfig(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (lambda: EngineConfig(device="tpu"), "device"),
])
def test_bad_values_are_clear_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("request_, message", [
    (lambda: Request(prompt=""), "empty request"),
    (lambda: Request(prompt="hi", images=[12345]), "PIL.Image, encoded bytes or a file path"),
    (lambda: Request(prompt="hi", images=[b"not an image at all"]), "not a readable image"),
    (lambda: Request(prompt="word " * 2000), "max_model_len"),
])
def test_bad_requests_are_clear_errors_and_engine_keeps_serving(engines, request_, message):
    engine = engines["qwen3_vl"]
    with pytest.raises(ValueError, match=message):
        engine.generate(request_(), SamplingParams(max_tokens=4))
    assert engine.generate(Request(prompt="Hello"), SamplingParams(max_tokens=2)).finish_reason in ("stop", "length")


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="unsupported architecture 'llama'.*qwen2_vl"):
        Engine(EngineConfig(model=str(tmp_path), num_blocks=8))


def test_incremental_snapshots_equal_full_rebuilds(checkpoints):
    with Engine(EngineConfig(model=checkpoints["qwen3_vl"], num_blocks=24, block_size=8)) as engine:
        def compare():
            core = engine.core
            with engine.loop.lock:  # both views of the same moment
                incremental = engine.snapshot()
                full = core.snapshots.build(list(core.scheduler.running), list(core.scheduler.waiting),
                                            core.step_count, core.scheduler.num_preemptions, full=True)
            assert incremental.blocks == full.blocks and incremental.block_tables == full.block_tables
        params = SamplingParams(max_tokens=12, ignore_eos=True)
        for _ in engine.stream(mixed_requests()[0], params):
            compare()
        gens = [engine.stream(r, params) for r in mixed_requests()]  # preemptions and sharing under pressure
        for events in zip(*gens):
            compare()
        compare()


def test_num_blocks_comes_from_the_budget_calculator(checkpoints):
    from minivlm.budget import estimate
    config = EngineConfig(model=checkpoints["qwen2_5_vl"], max_model_len=512, max_num_seqs=256,
                          cpu_memory_budget_bytes=560 * 2**20)  # small enough that the budget, not the cap, decides
    with Engine(config) as engine:
        est = estimate(engine.hf_config, dtype="float32", kv_dtype="float32", max_model_len=512, num_seqs=256,
                       block_size=16, max_num_batched_tokens=config.max_num_batched_tokens,
                       device_memory_bytes=560 * 2**20, weights_bytes=engine.model.weights_bytes(), gpu_memory_utilization=1.0)
        report = engine.memory_report()
        assert 0 < engine.num_blocks == est.num_blocks < 256 * 512 // 16
        assert report.kv_cache_bytes == est.num_blocks * 16 * est.kv_bytes_per_token == engine.core.pool.kv_cache.nbytes
        assert report.kv_bytes_per_token == est.kv_bytes_per_token
    after = engine.memory_report()  # closed: the pool is gone, the report still answers
    assert after.kv_cache_bytes == 0 and after.weights_bytes == report.weights_bytes


def test_an_override_given_with_a_config_is_applied(checkpoints):
    """#25 defect 2: Engine(config, num_blocks=8) builds an 8-block pool (it used to build config's silently)."""
    config = EngineConfig(model=checkpoints["qwen2_vl"], device="cpu", num_blocks=64)
    with Engine(config, num_blocks=8) as engine:
        assert engine.num_blocks == 8 and engine.config.num_blocks == 8 and config.num_blocks == 64
    with pytest.raises(TypeError, match=r"unknown EngineConfig field\(s\) \['num_blokcs'\]"):
        Engine(config, num_blokcs=8)


def test_the_attention_backend_is_said_as_it_is(checkpoints):
    """#25 defect 3: the flash-attn path needs CUDA, fp16/bf16 and blocks of a multiple of 256; else it is SDPA over
    gathered blocks, and the engine says which (the app's status line shows it). #27: fp32 on the CPU decodes in place
    with the compiled kernel where a C compiler is found, and says why not where it is not."""
    from types import SimpleNamespace

    import torch
    from minivlm.model.backends import flash
    from minivlm.model.backends.cpu_kernels import paged_cpu
    with Engine(EngineConfig(model=checkpoints["qwen2_vl"], device="cpu", num_blocks=8)) as engine:
        if paged_cpu.KERNELS.get() is not None:
            assert engine.attention_backend.startswith("in-place paged decode")
        else:
            assert engine.attention_backend == f"SDPA over gathered blocks (in-place kernel: {paged_cpu.KERNELS.error})"
    cuda = SimpleNamespace(device="cuda", dtype=torch.bfloat16)  # the rule itself, on any machine

    def said(block_size):
        config = SimpleNamespace(block_size=block_size)
        return flash.FlashAttention.serves(cuda, config) or flash.FlashAttention.make(cuda, config, None)
    if flash.flash_attn_with_kvcache is not None:
        assert "multiple of 256" in said(16) and said(256).describe() == "flash-attn paged kernels"
    else:
        assert said(256) == " (flash-attn not installed)"


SERVING = {"plain": {}, "async vision": {"async_vision": True, "enable_chunked_prefill": True},  # a vision thread
           "KV events": {"kv_events": {"enable_kv_cache_events": True, "endpoint": "inproc://kv-frozen"}}}  # a sender


@pytest.mark.parametrize("serving", SERVING)
def test_a_serving_engine_is_out_of_the_cycle_collectors_sight(checkpoints, serving):
    """What exists when an engine starts lives as long as it does: frozen out of the cyclic collector, whose full
    collections would otherwise walk every module, tensor and tokenizer object (a stall of every stream). Frozen
    objects are never collected as cycles, so a closed engine must be freed by reference counting alone: with the
    collector off, nothing of it is left once the caller drops it."""
    import gc
    import weakref
    engine = Engine(EngineConfig(model=checkpoints["qwen2_5_vl"], num_blocks=32, **SERVING[serving]))
    tracked = {id(o) for o in gc.get_objects()}
    assert gc.get_freeze_count() > 0
    assert id(engine.model.decoder) not in tracked and id(engine.model.decoder.layers[0]) not in tracked
    out = engine.generate(Request(prompt="What is this?", images=[image(64, 48, (200, 30, 30))]),
                          SamplingParams(max_tokens=4, ignore_eos=True))
    assert any(o is out for o in gc.get_objects())  # what serving makes stays collectable
    tower_linear = next(m for m in engine.model.vision.module.modules() if type(m).__name__ == "FastLinear")
    gone = [weakref.ref(x) for x in (engine, engine.core, engine.loop, engine.model.decoder, engine.core.pool,
                                     tower_linear)]  # a tower's linear layers slice their own rows (tower_boundaries)
    del tower_linear
    gc.disable()
    try:
        engine.close()
        del engine
        assert [ref() for ref in gone] == [None] * len(gone)
    finally:
        gc.enable()
