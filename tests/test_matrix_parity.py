"""The rest of the model matrix — SmolVLM2, Idefics3, InternVL (Qwen3 and Qwen2 decoders), text-only Qwen2 and
Qwen3 — on the same paged KV: the engine's logprobs equal HF transformers' teacher-forced logprobs (fp32) on
random checkpoints saved by transformers in the published layout, alone and batched, with images of several sizes
and aspect ratios (so several tile counts), and preemption or chunked prefill change no token."""
import pytest
from PIL import Image

from minivlm import Engine, EngineConfig, Request, SamplingParams
from tests.conftest import MATRIX
from tests.test_parity import check_against_hf, scene

TILED = [name for name, fam, _ in MATRIX if fam in ("smolvlm", "idefics3", "internvl")]
TEXT = [name for name, fam, _ in MATRIX if fam in ("qwen2", "qwen3")]


def image_requests():
    """Sizes chosen for different tilings: SmolVLM 2x2, 2x1, 1x2 tiles (+ global); InternVL 1, 3+1, 4+1 crops."""
    return [
        Request(prompt="What color is the shape?", images=[scene(100, 80, (220, 30, 30))]),
        Request(prompt="Describe the image.", images=[scene(200, 60, (40, 70, 220))]),
        Request(prompt="Hello, how are you?"),
        Request(prompt="How many shapes are there?", images=[scene(50, 150, (30, 170, 60)), scene(256, 64, (240, 210, 30))]),
        Request(messages=[{"role": "user", "content": [{"type": "image", "image": scene(90, 90, (140, 50, 180))},
                                                       {"type": "text", "text": "What shape is it?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "square"}]},
                          {"role": "user", "content": [{"type": "text", "text": "What color is the square?"}]}]),
    ]


def text_requests():
    return [
        Request(prompt="What color is the shape?"),
        Request(messages=[{"role": "system", "content": "You answer briefly."},
                          {"role": "user", "content": "Hello, how are you?"}]),
        Request(messages=[{"role": "user", "content": "What shape is it?"}, {"role": "assistant", "content": "square"},
                          {"role": "user", "content": "What color is the square?"}]),
    ]


def requests_for(name):
    return image_requests() if name in TILED else text_requests()


@pytest.mark.parametrize("name", [n for n, _, _ in MATRIX])
def test_single_requests_match_hf(name, matrix_checkpoints, matrix_engines):
    engine = matrix_engines[name]
    engine.reset_prefix_cache()
    for request in requests_for(name)[:2]:
        out = engine.generate(request, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=1))
        assert len(out.token_ids) == 8
        check_against_hf(matrix_checkpoints[name], name, request, out)


@pytest.mark.parametrize("name", [n for n, _, _ in MATRIX])
def test_batched_requests_match_hf(name, matrix_checkpoints, matrix_engines):
    """Several tile counts, a text-only request, multi-image and multi-turn in one running batch."""
    engine = matrix_engines[name]
    engine.reset_prefix_cache()
    reqs = requests_for(name)
    outs = engine.generate(reqs, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=2))
    for request, out in zip(reqs, outs):
        check_against_hf(matrix_checkpoints[name], name, request, out)


@pytest.mark.parametrize("name", TILED)
def test_tile_counts_differ_across_the_requests(name, matrix_engines):
    """The parity requests really cover several tilings (else the tests above would prove less)."""
    engine = matrix_engines[name]
    tilings = {(im.tiles, im.pixel_rows) for r in image_requests() for im in
               engine.make_sequence(r, SamplingParams(max_tokens=1)).images}
    assert len(tilings) >= 3, tilings


@pytest.mark.parametrize("name", ["smolvlm", "internvl", "qwen3"])
def test_preemption_and_chunked_prefill_change_no_token(name, matrix_checkpoints, matrix_engines):
    reqs = requests_for(name)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    reference = [o.token_ids for o in matrix_engines[name].generate(reqs, params)]
    # a pool that holds every prompt but not their answers: decoding must preempt
    prompts = [len(matrix_engines[name].make_sequence(r, params)) for r in reqs]
    fits = sum(-(-(n + 1) // 16) for n in prompts) + 1
    small = EngineConfig(model=matrix_checkpoints[name], device="cpu", dtype="float32", num_blocks=fits,
                         max_model_len=512, cache_strategy="none")
    chunked = EngineConfig(model=matrix_checkpoints[name], device="cpu", dtype="float32", num_blocks=256,
                           max_model_len=1024, enable_chunked_prefill=True, max_num_batched_tokens=37)
    for config in (small, chunked):
        with Engine(config, share_model_with=matrix_engines[name]) as engine:
            assert [o.token_ids for o in engine.generate(reqs, params)] == reference
            if config is small:
                assert any(e.kind == "preempted" for e in engine.events()), "the small pool never preempted"


@pytest.mark.parametrize("name", ["smolvlm", "internvl", "qwen3"])
def test_a_repeated_request_is_served_from_the_cache(name, matrix_checkpoints, matrix_engines):
    engine = matrix_engines[name]
    engine.reset_prefix_cache()
    request = requests_for(name)[0 if name in TILED else 2]  # prompts of more than one block
    params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=1)
    first, second = engine.generate(request, params), engine.generate(request, params)
    bs = engine.config.block_size
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == (first.num_prompt_tokens - 1) // bs * bs > 0
    assert second.token_ids == first.token_ids
    assert not any(h.false_hit for h in second.cache_hits)
    check_against_hf(matrix_checkpoints[name], name, request, second)


def test_a_text_model_refuses_images(matrix_engines):
    with pytest.raises(ValueError, match="text-only model: it takes no images"):
        matrix_engines["qwen3"].generate(Request(prompt="What color?", images=[Image.new("RGB", (32, 32))]),
                                         SamplingParams(max_tokens=1))


@pytest.mark.parametrize("name", ["smolvlm", "internvl"])
def test_replay_of_a_tiled_run_equals_the_snapshot_at_every_step(name, matrix_checkpoints):
    """The event log describes tiled images as their runs of placeholders, so replay rebuilds the same block kinds
    (image / mixed: markers between tiles) and tables as the engine's own snapshot, step by step (step-through)."""
    from minivlm.views.events import replay
    from tests.test_events import check_replay_every_step, workload
    mismatches = []
    # 8-token blocks, a pool two of the workload's tiled prompts fill: their answers then preempt
    with Engine(EngineConfig(model=matrix_checkpoints[name], device="cpu", num_blocks=32, block_size=8,
                             max_model_len=512)) as engine:
        check_replay_every_step(engine, mismatches)
        workload(engine)
        events = engine.events()
        final, snap = replay(events, engine.num_blocks, engine.config.block_size), engine.snapshot()
    assert not mismatches, mismatches[:5]
    assert final.blocks == snap.blocks
    assert {"preempted", "BlockRemoved"} <= {e.kind for e in events}
    assert {"image", "mixed"} <= {b.kind for b in snap.blocks if b.cached}
