"""A checkpoint's video processor is read where and as transformers 5.23 reads it (issue #40, item 1), in each layout
a real checkpoint has: "nested" (processor_config.json's "video_processor", what v5's ProcessorMixin.save_pretrained
writes, no separate file), "file" (video_preprocessor_config.json) and "published" (only the image processor's
preprocessor_config.json, as the published Qwen2-VL / Qwen2.5-VL ship). The checkpoints come from
tools/make_checkpoint.py, their JSON written by transformers (its image processor's save_pretrained, its video
processors' to_dict). Truths: transformers' own resolver (BaseVideoProcessor.get_video_processor_dict) and its own
video processor classes built from the checkpoint (from_pretrained), its own smart_resize for the token counts,
and, where torchvision is installed, its real processors on checkpoints saved by the real save_pretrained."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.inputs.video_patches import SAVED_VIDEO_PROCESSOR, saved_video_processor, video_settings
from tests.conftest import FAMILIES
from tools.make_checkpoint import VIDEO_LAYOUTS, make_random_checkpoint, save_video_processor, video_processor_config
from tools.video_clips import moving_square

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLISHED = dict(min_pixels=3136, max_pixels=12845056)  # Qwen2.5-VL's preprocessor_config.json on the hub
QUESTION = "What happens in this video? Describe the motion."  # 28 tokens in the test tokenizer
FRAMES = moving_square(8, 160, 120)  # the issue's video: 8 frames of 160 x 120, given as frames (not sampled)
SOURCE = {"nested": "processor_config.json", "file": "video_preprocessor_config.json",
          "published": "preprocessor_config.json"}


def video_request(frames=FRAMES, question=QUESTION) -> Request:
    return Request(messages=[{"role": "user", "content": [{"type": "video", "video": frames, "fps": 2},
                                                          {"type": "text", "text": question}]}])


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """(family, layout) -> a random checkpoint with its video processor in that layout (published: the hub's pixel
    range in the image processor, which is then the video's too)."""
    root = tmp_path_factory.mktemp("layouts")
    return {(fam, layout): make_random_checkpoint(fam, str(root / f"{fam}-{layout}"), seed=i, video_layout=layout,
                                                  **(PUBLISHED if layout == "published" else {}))
            for i, fam in enumerate(FAMILIES) for layout in VIDEO_LAYOUTS}


# transformers' Qwen2VLVideoProcessor module imports torchvision at its top, for its resize only; where torchvision is
# missing a stand-in module lets the class load in a child process (nothing here resizes), so its own __init__ (size,
# min_pixels / max_pixels) and from_pretrained (which file) decide the settings. Qwen3VLVideoProcessor needs no help.
TRUTH = r"""
import importlib.util, json, sys, types
import transformers
if importlib.util.find_spec("torchvision") is None:
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2",
                 "torchvision.transforms.v2.functional"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["torchvision.transforms.v2"].functional = sys.modules["torchvision.transforms.v2.functional"]
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
out = {}
for key, (path, family) in json.loads(sys.argv[1]).items():
    cls = Qwen3VLVideoProcessor if family == "qwen3_vl" else Qwen2VLVideoProcessor
    try:
        v = cls.from_pretrained(path)
    except OSError:  # none of the three files: transformers refuses; the class defaults are the engine's
        v = cls()
    out[key] = {"min_pixels": v.size.shortest_edge, "max_pixels": v.size.longest_edge, "patch_size": v.patch_size,
                "temporal_patch_size": v.temporal_patch_size, "merge_size": v.merge_size,
                "min_frames": v.min_frames, "max_frames": v.max_frames, "fps": v.fps,
                "image_mean": list(v.image_mean), "image_std": list(v.image_std), "rescale_factor": v.rescale_factor}
print(json.dumps(out))
"""


def transformers_settings(dirs: dict) -> dict:
    """key -> the settings transformers' own video processor class reads from (path, family), in a child process."""
    run = subprocess.run([sys.executable, "-c", TRUTH, json.dumps(dirs)], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def ours(path: str, family: str) -> dict:
    s = video_settings(path, family)
    return {"min_pixels": s.min_pixels, "max_pixels": s.max_pixels, "patch_size": s.patch_size,
            "temporal_patch_size": s.temporal_patch_size, "merge_size": s.merge_size, "min_frames": s.min_frames,
            "max_frames": s.max_frames, "fps": s.fps, "image_mean": list(s.image_mean),
            "image_std": list(s.image_std), "rescale_factor": s.rescale_factor}


def assert_same_settings(got: dict, truth: dict, family: str, what: str):
    truth = dict(truth)
    if family != "qwen3_vl" and truth["fps"] is None:  # Qwen2VLVideoProcessor has no rate of its own (it samples
        truth["fps"] = 2.0                             # nothing unless asked); the engine samples files at 2 fps
    assert got == truth, f"{what}: engine {got} vs transformers {truth}"


def layered(root, family: str) -> dict:
    """Checkpoints holding several of the three places at once, each with its own pixel range (nested 6..600,
    file 7..601, image processor 5..700 in units of 28 x 28), and one holding none (its processor_config.json has an
    image processor but no video processor): the first found in transformers' order must win."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil
    unit = 28 * 28

    def video(lo, hi):
        return video_processor_config(family) | {"size": {"shortest_edge": unit * lo, "longest_edge": unit * hi}}

    def image_processor(path):
        Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=unit * 5,
                                 max_pixels=unit * 700).save_pretrained(path)

    at = lambda name: os.path.join(root, f"{family}-{name}")
    every = make_random_checkpoint(family, at("all-three"), video_layout="nested")
    save_video_processor(every, family, layout="nested", config=video(6, 600))
    save_video_processor(every, family, layout="file", config=video(7, 601))
    image_processor(every)
    two = make_random_checkpoint(family, at("file-and-image"), video_layout="published")
    save_video_processor(two, family, layout="file", config=video(7, 601))
    image_processor(two)
    none = make_random_checkpoint(family, at("none"), video_layout="file")
    os.remove(os.path.join(none, "video_preprocessor_config.json"))
    return {"all three": every, "file and image": two, "none": none}


def test_settings_equal_transformers_in_every_layout(layouts, tmp_path):
    """Every layout, several places at once and none at all: the file the engine reads is the one transformers'
    resolver returns, and the settings equal those of transformers' own class loaded from the checkpoint."""
    from transformers.video_processing_utils import BaseVideoProcessor
    dirs = {f"{fam}/{layout}": (path, fam) for (fam, layout), path in layouts.items()}
    for fam in FAMILIES:
        dirs.update({f"{fam}/{name}": (path, fam) for name, path in layered(str(tmp_path), fam).items()})
    truth = transformers_settings(dirs)
    for key, (path, fam) in dirs.items():
        found, source = saved_video_processor(path)
        if key.endswith("/none"):
            assert (found, source) == ({}, None)
        else:
            assert found == BaseVideoProcessor.get_video_processor_dict(path)[0], key
        layout = key.split("/")[1]
        if layout in SOURCE:
            assert source == SOURCE[layout], key
        assert_same_settings(ours(path, fam), truth[key], fam, key)
    # the places were really told apart: each case has its own pixel range
    assert video_settings(dirs["qwen2_5_vl/all three"][0], "qwen2_5_vl").min_pixels == 28 * 28 * 6
    assert video_settings(dirs["qwen2_5_vl/file and image"][0], "qwen2_5_vl").min_pixels == 28 * 28 * 7
    assert video_settings(dirs["qwen2_5_vl/published"][0], "qwen2_5_vl").max_pixels == PUBLISHED["max_pixels"]
    assert video_settings(dirs["qwen2_5_vl/none"][0], "qwen2_5_vl").min_pixels == 128 * 28 * 28
    assert SAVED_VIDEO_PROCESSOR == tuple(SOURCE.values())


def test_min_max_pixels_override_size_on_qwen2_only(tmp_path):
    """A saved video processor with both `size` and top-level min_pixels / max_pixels (as transformers 4.x wrote
    them; written here by transformers' BaseVideoProcessor): Qwen2VLVideoProcessor's __init__ takes min_pixels /
    max_pixels, Qwen3VLVideoProcessor's keeps `size`."""
    from transformers.video_processing_utils import BaseVideoProcessor
    dirs = {}
    for fam in FAMILIES:
        path = make_random_checkpoint(fam, str(tmp_path / fam))
        config = {k: v for k, v in video_processor_config(fam).items() if k != "video_processor_type"}
        saved = BaseVideoProcessor(**config, min_pixels=28 * 28 * 3, max_pixels=28 * 28 * 9)
        saved.to_json_file(os.path.join(path, "video_preprocessor_config.json"))
        dirs[fam] = (path, fam)
    truth = transformers_settings(dirs)
    for fam, (path, _) in dirs.items():
        assert_same_settings(ours(path, fam), truth[fam], fam, fam)
        size = video_processor_config(fam)["size"]
        want = ((28 * 28 * 3, 28 * 28 * 9) if fam != "qwen3_vl" else (size["shortest_edge"], size["longest_edge"]))
        assert (truth[fam]["min_pixels"], truth[fam]["max_pixels"]) == want


def test_size_of_min_max_pixels_alone_is_read_as_that_range(tmp_path):
    """`size` = {min_pixels, max_pixels} without top-level keys (as transformers 4.49 saved it; written here by
    BaseVideoProcessor): transformers 5.23 refuses every video of it (no shortest_edge / longest_edge), the engine
    reads the range it states (docs/VIDEO.md says so)."""
    from transformers.video_processing_utils import BaseVideoProcessor
    for fam in FAMILIES:
        path = make_random_checkpoint(fam, str(tmp_path / fam))
        config = {k: v for k, v in video_processor_config(fam).items() if k not in ("video_processor_type", "size")}
        BaseVideoProcessor(**config, size={"min_pixels": 28 * 28 * 3, "max_pixels": 28 * 28 * 9}).to_json_file(
            os.path.join(path, "video_preprocessor_config.json"))
        s = video_settings(path, fam)
        assert (s.min_pixels, s.max_pixels) == (28 * 28 * 3, 28 * 28 * 9), fam


def expected_video(family: str, settings: dict, frames: int, height: int, width: int) -> tuple[tuple, int]:
    """(grid_thw, video tokens) by transformers' own smart_resize (per frame for Qwen2/2.5-VL, per video for
    Qwen3-VL), then pairs of frames, patch x patch, 2x2 merged."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as per_frame
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as per_video
    p, m, t = settings["patch_size"], settings["merge_size"], settings["temporal_patch_size"]
    lo, hi = settings["min_pixels"], settings["max_pixels"]
    if family == "qwen3_vl":
        h, w = per_video(frames, height, width, temporal_factor=t, factor=p * m, min_pixels=lo, max_pixels=hi)
    else:
        h, w = per_frame(height, width, factor=p * m, min_pixels=lo, max_pixels=hi)
    grid = (-(-frames // t), h // p, w // p)
    return grid, grid[0] * grid[1] * grid[2] // m ** 2


@pytest.fixture(scope="module")
def layout_engines(layouts):
    engines = {key: Engine(EngineConfig(model=path, num_blocks=128, dtype="float32", device="cpu",
                                        max_model_len=1024)) for key, path in layouts.items()}
    yield engines
    for e in engines.values():
        e.close()


@pytest.mark.parametrize("layout", list(VIDEO_LAYOUTS))
@pytest.mark.parametrize("family", FAMILIES)
def test_engine_answers_a_video_in_each_layout(family, layout, layouts, layout_engines):
    """An engine on each layout answers the issue's video request; its grid and video tokens are transformers'
    smart_resize of the layout's own pixel range (the nested and file layouts' tiny budget, the published one's
    3136..12845056), and only the video tokens differ between layouts."""
    engine = layout_engines[(family, layout)]
    size = video_processor_config(family)["size"]
    pixels = PUBLISHED if layout == "published" else {"min_pixels": size["shortest_edge"],
                                                      "max_pixels": size["longest_edge"]}
    grid, tokens = expected_video(family, {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, **pixels},
                                  8, 120, 160)
    seq = engine.make_sequence(video_request(), SamplingParams(max_tokens=3))
    video = [im for im in seq.images if im.kind == "video"]
    assert [tuple(v.grid_thw) for v in video] == [grid]
    video_pad = engine.processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert seq.token_ids.count(video_pad) == tokens
    text_tokens = {"qwen3_vl": 92}.get(family, 40)  # the template, the question and (Qwen3-VL) 4 timestamps
    assert len(seq.token_ids) == text_tokens + tokens
    out = engine.generate(video_request(), SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out.token_ids) == 3 and out.num_prompt_tokens == text_tokens + tokens


@pytest.mark.parametrize("family,total,grid", [("qwen2_5_vl", 136, (4, 8, 12)), ("qwen3_vl", 140, (4, 6, 8))])
def test_issue_figures(family, total, grid, tmp_path):
    """Issue #40's measurement on a checkpoint in v5's save_pretrained layout: 8 frames of 160 x 120 make 136 prompt
    tokens on Qwen2.5-VL and 140 on Qwen3-VL, as transformers makes them (the engine made 600 and 172: it ignored the
    nested video processor and upscaled to its class default of 100,352 pixels per frame, or took Qwen3-VL's 16-px
    patches). The issue names neither its question nor its video processor's pixel range; a 28-token question and
    the range 3136..100352 give all four of its figures (before the fix too: 600 and 172). The arithmetic, from the
    published smart_resize: Qwen2.5-VL per frame, 120 x 160 -> round to multiples of 28 = 112 x 168 (18,816 px,
    within range) -> 8 x 12 patches -> 24 tokens per pair x 4 pairs = 96, + 40 = 136; Qwen3-VL per video,
    8 x 112 x 168 = 150,528 > 100,352 -> beta = sqrt(8 x 19,200 / 100,352) = 1.237 -> floor(97.0 / 28) x 28 = 84 by
    floor(129.3 / 28) x 28 = 112 -> 6 x 8 patches -> 12 tokens per pair x 4 = 48, + 92 (4 timestamps) = 140."""
    path = make_random_checkpoint(family, str(tmp_path / family), video_layout="nested")
    config = video_processor_config(family)
    config["size"] = {"shortest_edge": 3136, "longest_edge": 100352}
    save_video_processor(path, family, layout="nested", config=config)
    settings = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 3136,
                "max_pixels": 100352}
    assert expected_video(family, settings, 8, 120, 160) == (grid, grid[0] * grid[1] * grid[2] // 4)
    with Engine(EngineConfig(model=path, num_blocks=64, dtype="float32", device="cpu", max_model_len=1024)) as e:
        seq = e.make_sequence(video_request(), SamplingParams(max_tokens=2))
        assert len(seq.token_ids) == total
        assert [tuple(im.grid_thw) for im in seq.images] == [grid]
        from minivlm.budget.video_tokens import video_plan  # the VRAM calculator reads the same settings
        plan = video_plan(path, seconds=4, fps=2, width=160, height=120, source_fps=2)
        assert plan.vision_tokens == grid[0] * grid[1] * grid[2] // 4


# --- where torchvision is installed (a GPU machine has it): transformers' real processors, real save_pretrained ---

def real_processor(path: str, family: str):
    """transformers' own processor of a checkpoint (its video processor found by its own from_pretrained)."""
    from tools.make_video_reference import hf_processor
    return hf_processor(path, family)


def save_with_transformers(path: str, family: str, layout: str, video_kwargs: dict):
    """Re-save a checkpoint's processor with transformers' real classes: "nested" by ProcessorMixin.save_pretrained
    with its real video processor (v5 writes processor_config.json with "video_processor", no separate file),
    "published" by the image processor's own save_pretrained alone."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_5_vl import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil, Qwen2VLProcessor, Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl import Qwen3VLProcessor, Qwen3VLVideoProcessor
    tokenizer = AutoTokenizer.from_pretrained(path)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
    for name in SAVED_VIDEO_PROCESSOR:
        if os.path.isfile(os.path.join(path, name)):
            os.remove(os.path.join(path, name))
    if layout == "published":
        image_processor.save_pretrained(path)
        return
    cls = {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor}[family]
    video = (Qwen3VLVideoProcessor if family == "qwen3_vl" else Qwen2VLVideoProcessor)(**video_kwargs)
    cls(image_processor, tokenizer, video, chat_template=tokenizer.chat_template).save_pretrained(path)
    assert not os.path.isfile(os.path.join(path, "video_preprocessor_config.json"))


@pytest.mark.parametrize("layout", ["nested", "published"])
@pytest.mark.parametrize("family", FAMILIES)
def test_live_transformers_on_real_saved_checkpoints(family, layout, tmp_path):
    """On checkpoints saved by transformers' real save_pretrained, the engine's token ids, grids and patches equal
    transformers' real processor's, and its logprobs equal transformers' model teacher-forced on them."""
    pytest.importorskip("torchvision", reason="transformers' Qwen2-VL video processor and the processors' video slot "
                                              "import torchvision, which this venv lacks; the layout tests above "
                                              "check the settings, grids and token counts without it")
    from tests.test_video import hf_inputs, teacher_forced
    from tools.make_video_reference import template_messages
    path = make_random_checkpoint(family, str(tmp_path / family), patch_size=14, **PUBLISHED)
    video_kwargs = {"patch_size": 14, "size": {"shortest_edge": 3136, "longest_edge": 100352},
                    "cap_pixels_per_frame": False, **({"fps": 2.0} if family != "qwen3_vl" else {})}
    save_with_transformers(path, family, layout, video_kwargs)
    processor = real_processor(path, family)
    request = video_request()
    text = processor.apply_chat_template(template_messages(request.messages), tokenize=False,
                                         add_generation_prompt=True)
    frames = np.stack([np.asarray(f) for f in FRAMES])
    theirs = processor(text=[text], videos=[frames], return_tensors="pt", do_sample_frames=False,
                       video_metadata=[{"fps": 2.0, "total_num_frames": 8, "frames_indices": list(range(8))}])
    with Engine(EngineConfig(model=path, num_blocks=128, dtype="float32", device="cpu", max_model_len=2048)) as e:
        seq = e.make_sequence(request, SamplingParams(max_tokens=4))
        mine = hf_inputs(e, seq)
        assert mine["input_ids"][0].tolist() == theirs["input_ids"][0].tolist()
        assert mine["video_grid_thw"].tolist() == theirs["video_grid_thw"].tolist()
        assert (mine["pixel_values_videos"] - theirs["pixel_values_videos"]).abs().max().item() < 1e-5
        out = e.generate(request, SamplingParams(max_tokens=4, ignore_eos=True, logprobs=1))
    ref = {k: v for k, v in theirs.items() if k in ("input_ids", "mm_token_type_ids", "pixel_values_videos",
                                                    "video_grid_thw", "second_per_grid_ts")}
    got = teacher_forced(path, ref, out.token_ids)
    for i, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        assert abs(lp[tok] - got[i, tok].item()) < 1e-4, f"{family}/{layout} token {i}"
    # the issue's figures from transformers itself (nested: 3136..100352; published: 3136..12845056 per frame, or
    # per video on Qwen3-VL, where the 8 frames stay 112 x 168)
    assert len(theirs["input_ids"][0]) == {("qwen3_vl", "nested"): 140, ("qwen3_vl", "published"): 188}.get(
        (family, layout), 136)
