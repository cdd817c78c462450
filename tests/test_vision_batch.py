"""The vision tower runs once a step over every new image of the step's requests (minivlm/engine/execution/runner.py): the
truth is each request run alone, one tower call per request. Same tokens, logprobs within 1e-4, in the Qwen-VL
families (grids, DeepStack features) and the tiled ones (SmolVLM, InternVL); an image two requests share goes
through the tower once; a step over MAX_TOWER_ROWS pixel rows splits into calls under it."""
import pytest

from minivlm import Request, SamplingParams
from minivlm.engine.execution import runner as runner_module
from minivlm.experiments.mm_cache import BLUE, GREEN, RED, shape_image

PARAMS = SamplingParams(max_tokens=5, ignore_eos=True, logprobs=1)


def requests() -> list[Request]:
    """Four requests, five images of four sizes; the last request repeats the first one's picture."""
    red, blue, green = shape_image(RED, size=(96, 64)), shape_image(BLUE, size=(64, 128)), shape_image(GREEN)
    return [Request(prompt="What color is the shape?", images=[red], request_id="a"),
            Request(prompt="Compare the two pictures.", images=[blue, shape_image(GREEN, size=(128, 96))],
                    request_id="b"),
            Request(prompt="Describe it.", images=[green], request_id="c"),
            Request(prompt="And this one?", images=[red], request_id="d")]


def tower_calls(engine, monkeypatch) -> list[int]:
    """Records the pixel rows of each tower call."""
    calls, vision = [], engine.model.vision
    real = vision.encode
    monkeypatch.setattr(vision, "encode", lambda pixels, layout: calls.append(pixels.shape[0]) or real(pixels, layout))
    return calls


def run_alone_then_together(engine, monkeypatch):
    engine.reset_prefix_cache()
    alone = [engine.generate(r, PARAMS) for r in requests() if not engine.reset_prefix_cache()]
    engine.reset_prefix_cache()
    calls = tower_calls(engine, monkeypatch)
    together = engine.generate(requests(), PARAMS)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids, a.request_id
        worst = max(abs(a.logprobs[i][t] - b.logprobs[i][t]) for i, t in enumerate(a.token_ids))
        assert worst <= 1e-4, (a.request_id, worst)
    return calls


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_one_tower_call_for_the_whole_step(family, engines, monkeypatch):
    engine = engines[family]
    calls = run_alone_then_together(engine, monkeypatch)
    rows = [im.pixel_rows for r in requests()[:3] for im in engine.make_sequence(r, PARAMS).images]
    assert calls == [sum(rows)]  # one call, four distinct images: the repeated picture once


@pytest.mark.parametrize("name", ["smolvlm", "internvl"])
def test_tiled_families_batch_their_tiles_too(name, matrix_engines, monkeypatch):
    calls = run_alone_then_together(matrix_engines[name], monkeypatch)
    assert len(calls) == 1


def test_a_step_over_the_row_limit_splits_into_calls_under_it(engines, monkeypatch):
    engine = engines["qwen2_vl"]
    sizes = [im.pixel_rows for r in requests()[:3] for im in engine.make_sequence(r, PARAMS).images]
    monkeypatch.setattr(runner_module, "MAX_TOWER_ROWS", max(sizes) + 1)
    calls = run_alone_then_together(engine, monkeypatch)
    assert len(calls) > 1 and sum(calls) == sum(sizes) and max(calls) <= max(sizes) + 1
