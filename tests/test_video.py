"""Video on the Qwen-VL families. Truths: transformers' own video processors (their outputs stored once by
tools/make_video_reference.py in a venv with torchvision, since this one has none), transformers' model classes
(get_rope_index with video_grid_thw / second_per_grid_ts, teacher-forced logits with pixel_values_videos). Key C,
limits, API and VRAM: tests/test_video_serving.py."""
import json
import os

import numpy as np
import pytest
import torch

from minivlm import Request, SamplingParams
from tests.conftest import FAMILIES
from tests.hf_reference import hf_model
from tools.make_video_reference import cases

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "video_reference.npz")
NO_FIXTURE = "tests/fixtures/video_reference.npz is missing (make it with tools/make_video_reference.py in a venv " \
             "with torchvision)"


@pytest.fixture(scope="module")
def reference():
    if not os.path.isfile(FIXTURE):
        pytest.skip(NO_FIXTURE)
    return dict(np.load(FIXTURE))


def request_of(name: str) -> Request:
    return Request(messages=cases()[name][0])


def hf_inputs(engine, seq) -> dict:
    """transformers' model inputs for the engine's own rendering of a prompt (images and videos split again; the
    pixels wait beside the sequence, in engine.core.image_inputs, until it is admitted)."""
    kinds = [im.kind for im in seq.images]
    pixels = engine.core.image_inputs[seq].pixel_values if seq.images else None
    rows = torch.as_tensor(pixels).split([im.pixel_rows for im in seq.images]) if seq.images else []
    video_ids = set(i for i, k in enumerate(kinds) if k == "video")
    types = torch.tensor(seq.token_types)
    for i in video_ids:
        im = seq.images[i]
        span = torch.tensor(seq.token_types[im.start:im.end]) == 1
        types[im.start:im.end][span] = 2
    out = {"input_ids": torch.tensor([seq.token_ids]), "mm_token_type_ids": types[None]}
    if video_ids:
        out["pixel_values_videos"] = torch.cat([rows[i] for i in sorted(video_ids)])
        out["video_grid_thw"] = torch.tensor([seq.images[i].grid_thw for i in sorted(video_ids)])
        out["second_per_grid_ts"] = torch.tensor([seq.images[i].video.second_per_grid for i in sorted(video_ids)])
    if len(video_ids) < len(kinds):
        out["pixel_values"] = torch.cat([r for i, r in enumerate(rows) if i not in video_ids])
        out["image_grid_thw"] = torch.tensor([im.grid_thw for i, im in enumerate(seq.images) if i not in video_ids])
    return out


def teacher_forced(path: str, inputs: dict, generated: list[int]) -> torch.Tensor:
    n = inputs["input_ids"].shape[1]
    kw = {k: torch.as_tensor(v) for k, v in inputs.items()}
    kw["input_ids"] = torch.cat([kw["input_ids"], torch.tensor([generated])], dim=1)
    kw["mm_token_type_ids"] = torch.cat([kw["mm_token_type_ids"], torch.zeros(1, len(generated), dtype=torch.long)], 1)
    kw["attention_mask"] = torch.ones_like(kw["input_ids"])
    if "second_per_grid_ts" in kw and "qwen2_5" not in hf_model(path).config.model_type:
        kw.pop("second_per_grid_ts")
    with torch.no_grad():
        logits = hf_model(path)(**kw).logits[0].float()
    return torch.log_softmax(logits[n - 1:n - 1 + len(generated)], dim=-1)


def assert_close(out, ref, what):
    for i, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        assert abs(lp[tok] - ref[i, tok].item()) < 1e-4, f"{what} token {i}: engine {lp[tok]} vs HF {ref[i, tok]}"


@pytest.mark.parametrize("case", ["frames", "gif", "mixed", "mp4"])
@pytest.mark.parametrize("family", FAMILIES)
def test_processing_equals_transformers_video_processor(family, case, checkpoints, engines, reference):
    """Token ids (placeholders, Qwen3-VL's timestamps), grids, second_per_grid_ts and patches equal the stored output
    of transformers' own processor with the same checkpoint files."""
    with open(os.path.join(checkpoints[family], "video_preprocessor_config.json")) as f:
        assert json.dumps(json.load(f), sort_keys=True) == str(reference[f"{family}/video_preprocessor_config"])
    seq = engines[family].make_sequence(request_of(case), SamplingParams(max_tokens=4))
    ours, ref = hf_inputs(engines[family], seq), {k.split("/")[-1]: v for k, v in reference.items() if k.startswith(f"{family}/{case}/")}
    assert ours["input_ids"][0].tolist() == ref["input_ids"][0].tolist()
    assert ours["mm_token_type_ids"][0].tolist() == ref["mm_token_type_ids"][0].tolist()
    assert ours["video_grid_thw"].tolist() == ref["video_grid_thw"].tolist()
    if "second_per_grid_ts" in ref:
        assert ours["second_per_grid_ts"].tolist() == pytest.approx(ref["second_per_grid_ts"].tolist(), abs=1e-6)
    diff = (ours["pixel_values_videos"] - torch.from_numpy(ref["pixel_values_videos"])).abs().max().item()
    assert diff < 1e-5, f"patches differ from transformers' by {diff}"
    if "pixel_values" in ref:
        assert (ours["pixel_values"] - torch.from_numpy(ref["pixel_values"])).abs().max().item() < 1e-5


@pytest.mark.parametrize("case", ["frames", "mixed", "mp4"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logprobs_equal_transformers_on_its_own_video_inputs(family, case, checkpoints, engines, reference):
    """The engine on the clip vs transformers' model teacher-forced on transformers' processor output (fp32)."""
    engine = engines[family]
    engine.reset_prefix_cache()
    out = engine.generate(request_of(case), SamplingParams(max_tokens=6, ignore_eos=True, logprobs=1))
    ref = {k.split("/")[-1]: v for k, v in reference.items() if k.startswith(f"{family}/{case}/")}
    assert_close(out, teacher_forced(checkpoints[family], ref, out.token_ids), f"{family}/{case}")


@pytest.mark.parametrize("family", FAMILIES)
def test_positions_equal_get_rope_index(family, engines, checkpoints):
    """M-RoPE positions and rope delta of video prompts equal transformers' get_rope_index (video_grid_thw, and
    second_per_grid_ts for Qwen2.5-VL, where t moves in units of seconds x tokens_per_second)."""
    model = hf_model(checkpoints[family]).model
    for name in ("frames", "gif", "mixed"):
        seq = engines[family].make_sequence(request_of(name), SamplingParams(max_tokens=4))
        kw = hf_inputs(engines[family], seq)
        extra = {"second_per_grid_ts": kw["second_per_grid_ts"]} if family == "qwen2_5_vl" else {}
        pos, delta = model.get_rope_index(kw["input_ids"], kw["mm_token_type_ids"], kw.get("image_grid_thw"),
                                          kw["video_grid_thw"], **extra)
        assert torch.equal(seq.prompt_positions, pos[:, 0]), f"{family}/{name}"
        assert seq.rope_delta == int(delta[0, 0])
        if family == "qwen2_5_vl":  # the time axis really moves: frame pairs apart by seconds x tokens_per_second
            video = next(im for im in seq.images if im.kind == "video")
            t = seq.prompt_positions[0, video.start:video.end].unique()
            assert len(t) == video.grid_thw[0] and (t[1] - t[0]).item() == int(video.video.t_scale)


@pytest.mark.parametrize("family", FAMILIES)
def test_logprobs_equal_transformers_with_sampled_gif(family, checkpoints, engines):
    """A GIF sampled at 2 fps: the engine vs transformers' model on the engine's own patches (the sampler and patches
    are compared to transformers' processor in the test above)."""
    engine = engines[family]
    request = request_of("gif")
    out = engine.generate(request, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=1))
    seq = engine.make_sequence(request, SamplingParams(max_tokens=4))
    assert [im.video.indices for im in seq.images] == [[0, 5, 10, 15] if family != "qwen3_vl" else [0, 6, 13, 19]]
    assert_close(out, teacher_forced(checkpoints[family], hf_inputs(engines[family], seq), out.token_ids), family)


@pytest.mark.parametrize("family", FAMILIES)
def test_anatomy_of_a_video_equals_get_rope_index(family, engines, checkpoints):
    """Anatomy's per-token positions for a video prompt (image + two videos across turns) are transformers'
    get_rope_index; each video token knows its frame pair, and the video's facts (sampled frames, timestamps)."""
    engine = engines[family]
    request = request_of("mixed")
    anatomy = engine.anatomy(request)
    seq = engine.make_sequence(request, SamplingParams(max_tokens=1))
    kw = hf_inputs(engines[family], seq)
    extra = {"second_per_grid_ts": kw["second_per_grid_ts"]} if family == "qwen2_5_vl" else {}
    pos, delta = hf_model(checkpoints[family]).model.get_rope_index(
        kw["input_ids"], kw["mm_token_type_ids"], kw.get("image_grid_thw"), kw["video_grid_thw"], **extra)
    assert [t.position for t in anatomy.tokens] == [tuple(p) for p in pos[:, 0].T.tolist()]
    assert anatomy.rope_delta == int(delta[0, 0])
    assert [im.kind for im in anatomy.images] == ["image", "video", "video"]
    video = anatomy.images[1]
    assert video.original_size == (56, 56) and video.video.indices == list(range(6))
    frames = [t.frame for t in anatomy.tokens[video.start:video.end] if t.type == "image"]
    per_pair = video.grid_thw[1] * video.grid_thw[2] // 4
    assert frames == [j // per_pair for j in range(video.num_tokens)] and max(frames) == video.grid_thw[0] - 1
    if family == "qwen3_vl":
        assert video.video.timestamps == pytest.approx([0.5 / 3, 2.5 / 3, 4.5 / 3])
        assert "<0.2 seconds>" in "".join(t.text for t in anatomy.tokens[max(0, video.start - 30):video.end])


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_chunked_prefill_and_async_vision_leave_video_answers_unchanged(family, engines):
    """A video whose tokens straddle 8-token prefill chunks (and the tower on its own thread) gives the same tokens
    and logprobs as one whole prefill."""
    engine = engines[family]
    params = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=2)
    with engine.isolated(num_blocks=64) as plain:
        whole = plain.generate(request_of("mixed"), params)
    with engine.isolated(num_blocks=64, enable_chunked_prefill=True, max_num_batched_tokens=8,
                         async_vision=True) as chunked:
        out = chunked.generate(request_of("mixed"), params)
    assert out.token_ids == whole.token_ids
    assert all(abs(a[t] - b[t]) < 1e-5 for a, b in zip(out.logprobs, whole.logprobs) for t in a.keys() & b.keys())


@pytest.mark.parametrize("family", FAMILIES)
def test_live_transformers_video_processor(family, checkpoints, engines):
    """Where torchvision is installed, transformers' own video processors run here and now, and minivlm's tokens,
    grids and patches equal theirs (the stored reference above stands in for them where it is not)."""
    pytest.importorskip("torchvision", reason="transformers' Qwen-VL video processors import torchvision, which this "
                                              "venv lacks; test_processing_equals_transformers_video_processor checks "
                                              "against their stored output instead")
    from tools.make_video_reference import reference as live_reference
    live = live_reference(checkpoints[family], family)
    for case in ("frames", "gif", "mixed", "mp4"):
        seq = engines[family].make_sequence(request_of(case), SamplingParams(max_tokens=4))
        ours = hf_inputs(engines[family], seq)
        assert ours["input_ids"][0].tolist() == live[f"{family}/{case}/input_ids"][0].tolist()
        assert ours["video_grid_thw"].tolist() == live[f"{family}/{case}/video_grid_thw"].tolist()
        theirs = torch.from_numpy(live[f"{family}/{case}/pixel_values_videos"])
        assert (ours["pixel_values_videos"] - theirs).abs().max().item() < 1e-5
