"""The prefix cache over tiles: key C holds every setting that shapes a tiled image's tokens and KV, so the same
picture under another tiling never reuses a block holding its image tokens; B sees only pixels and is fooled;
each family's knobs are accepted and an unknown one is refused; unsupported architectures say why."""
import json
import os

import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams
from tests.test_parity import scene

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=1)
PICTURE = scene(160, 120, (220, 30, 30))
# pairs of tilings of one picture whose first tile starts with the same token ids (2x2 vs 3x3 tiles; 4+1 crops vs
# one): only the pixels under those ids differ. (Splitting on vs off changes the first marker token, so there even
# key A tells them apart.)
TILINGS = {"smolvlm": ({}, {"size": {"longest_edge": 192}}),
           "internvl": ({"max_patches": 6}, {"max_patches": 1}),
           "idefics3": ({}, {"size": {"longest_edge": 192}})}


def image_blocks(seq, bs):
    """Logical indices of the full blocks that hold any of seq's image placeholder tokens."""
    return {i for i in range(len(seq) // bs) if any(seq.token_types[i * bs:(i + 1) * bs])}


@pytest.mark.parametrize("name", list(TILINGS))
@pytest.mark.parametrize("strategy", ["B", "C"])
def test_same_picture_other_tiling(name, strategy, matrix_engines):
    """Under C no image block of the second request is a hit; under B the blocks whose token ids are unchanged
    (the start of the image: the same marker and placeholder ids) are reused although their KV differs."""
    one, other = TILINGS[name]
    with matrix_engines[name].isolated(cache_strategy=strategy, num_blocks=128) as engine:
        first = Request(prompt="Describe the image.", images=[PICTURE], mm_processor_kwargs=one or None)
        second = Request(prompt="Describe the image.", images=[PICTURE], mm_processor_kwargs=other)
        seqs = [engine.make_sequence(r, PARAMS) for r in (first, second)]
        assert seqs[0].images[0].pixel_rows != seqs[1].images[0].pixel_rows  # the tilings differ
        engine.generate(first, PARAMS)
        out = engine.generate(second, PARAMS)
    bs = engine.config.block_size
    hit_image_blocks = {h.logical_index for h in out.cache_hits} & image_blocks(seqs[1], bs)
    if strategy == "C":
        assert not hit_image_blocks and not any(h.false_hit for h in out.cache_hits)
    else:
        assert hit_image_blocks, "B should be fooled: same pixels, same leading token ids"
        assert all(h.false_hit for h in out.cache_hits if h.logical_index in hit_image_blocks)


@pytest.mark.parametrize("name", list(TILINGS))
def test_the_tiling_settings_enter_key_c(name, matrix_engines):
    engine = matrix_engines[name]
    one, other = TILINGS[name]
    a, b = (engine.make_sequence(Request(prompt="Hi", images=[PICTURE], mm_processor_kwargs=kw or None), PARAMS)
            for kw in (one, other))
    assert a.images[0].settings != b.images[0].settings
    assert a.images[0].vision_key("m", "f32") != b.images[0].vision_key("m", "f32")  # no vision-cache reuse either


@pytest.mark.parametrize("name, knobs", [
    ("smolvlm", {"do_image_splitting": False, "size": {"longest_edge": 96}, "max_image_size": {"longest_edge": 64}}),
    ("internvl", {"max_patches": 2, "min_patches": 1, "crop_to_patches": False}),
])
def test_each_familys_own_knobs_are_accepted(name, knobs, matrix_engines):
    seq = matrix_engines[name].make_sequence(Request(prompt="Hi", images=[PICTURE], mm_processor_kwargs=knobs), PARAMS)
    assert seq.images[0].pixel_rows == 1  # no splitting / no cropping: one tile


@pytest.mark.parametrize("name, knobs, message", [
    ("smolvlm", {"max_pixels": 4096}, r"unsupported mm_processor_kwargs \['max_pixels'\] for SmolVLM2; allowed: "
                                      r"do_image_splitting, max_image_size, size"),
    ("internvl", {"do_image_splitting": True}, r"allowed: max_patches, min_patches, crop_to_patches"),
    ("internvl", {"max_patches": 0}, r"'max_patches' must be a positive int, got 0"),
    ("internvl", {"min_patches": 5, "max_patches": 2}, r"min_patches <= max_patches"),
    ("smolvlm", {"do_image_splitting": "yes"}, r"'do_image_splitting' must be true or false"),
    ("smolvlm", {"max_image_size": 32}, r"max_image_size must be 64 for this checkpoint"),
])
def test_bad_knobs_are_refused_with_a_message(name, knobs, message, matrix_engines):
    engine = matrix_engines[name]
    with pytest.raises(ValueError, match=message):
        engine.generate(Request(prompt="Hi", images=[PICTURE], mm_processor_kwargs=knobs), PARAMS)
    assert engine.generate(Request(prompt="Hi", images=[PICTURE]), PARAMS).token_ids  # still serving


@pytest.mark.parametrize("model_type, why", [("qwen3_5_moe", "mixture-of-experts"),
                                             ("gemma4_assistant", "draft model"), ("llava", "minivlm runs")])
def test_unsupported_architectures_are_refused_saying_why(tmp_path, model_type, why):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(ValueError, match=f"unsupported architecture '{model_type}'.*{why}"):
        Engine(EngineConfig(model=str(tmp_path), device="cpu"))


@pytest.mark.parametrize("name, repo", [("smolvlm", "HuggingFaceTB/SmolVLM2-256M-Video-Instruct"),
                                        ("internvl", "OpenGVLab/InternVL3_5-1B-HF"), ("qwen3", "Qwen/Qwen3-0.6B")])
def test_a_hub_id_fetches_what_the_family_needs(name, repo, matrix_checkpoints, monkeypatch, tmp_path):
    """The download boundary (huggingface_hub.snapshot_download) copies only the files matching the loader's
    allow_patterns, as the hub would: that set must be enough to load each family and answer like the local dir."""
    import fnmatch
    import shutil

    import huggingface_hub

    def snapshot_download(repo_id, allow_patterns, **kw):
        out = tmp_path / repo_id.replace("/", "--")
        out.mkdir()
        for f in os.listdir(matrix_checkpoints[name]):
            if any(fnmatch.fnmatch(f, p) for p in allow_patterns):
                shutil.copy(os.path.join(matrix_checkpoints[name], f), out / f)
        return str(out)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    request = Request(prompt="Hi", images=[PICTURE]) if name != "qwen3" else Request(prompt="Hi")
    with Engine(EngineConfig(model=repo, device="cpu", dtype="float32", num_blocks=64)) as hub, \
            Engine(EngineConfig(model=matrix_checkpoints[name], device="cpu", dtype="float32", num_blocks=64)) as local:
        assert hub.model_type == local.model_type
        assert hub.generate(request, PARAMS).token_ids == local.generate(request, PARAMS).token_ids


def test_sliding_window_layers_are_refused(matrix_checkpoints, tmp_path):
    import shutil
    path = shutil.copytree(matrix_checkpoints["qwen2"], tmp_path / "sliding")
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(use_sliding_window=True, sliding_window=8, max_window_layers=0,
               layer_types=["sliding_attention"] * cfg["num_hidden_layers"])
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="sliding-window attention layers are not supported"):
        Engine(EngineConfig(model=str(path), device="cpu", num_blocks=8))


def test_each_processor_reads_its_own_settings_from_the_checkpoint(matrix_engines):
    """image_seq_len / image_seq_length are named __init__ fields: from_pretrained would silently default them to
    169 / 256; tiling defaults come from the saved image processor (the test checkpoints differ from both)."""
    smol, intern = matrix_engines["smolvlm"].processor, matrix_engines["internvl"].processor
    assert smol.image_seq_len == 16 and smol.image_processor.max_image_size["longest_edge"] == 64
    assert intern.image_seq_length == 16 and intern.image_processor.max_patches == 6
    assert type(smol.image_processor).__name__.endswith("Pil")  # no torchvision-backed processor
