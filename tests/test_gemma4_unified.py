"""Gemma 4 12B (gemma4_unified: no vision encoder) served against independent truths: transformers' own image
processor (its outputs stored by tools/make_gemma4_unified_reference.py in a venv with torchvision, since this one
has none), transformers' Gemma4UnifiedForConditionalGeneration teacher-forced on the random checkpoint
(tools/make_checkpoint_gemma4_unified.py: the 12B's 5:1 pattern, keys as values on full layers, the last 4 layers
sharing K/V, images both ways), its processor's own token count, and a model transformers builds on the meta device
for the calculator."""
import os
from contextlib import nullcontext

import numpy as np
import pytest
import torch

from minivlm import Request
from minivlm.refusals import Refused
from tests.gemma4_requests import BLOCK, TEXT, TWO, WIDE, ask, bf16_gaps, engine, gap_to_hf, greedy, scene
from tools.make_checkpoint_gemma4_unified import SLIDING_WINDOW, make_gemma4_unified_checkpoint
from tools.make_gemma4_unified_reference import BUDGETS, SIZES, outputs

TOL = 1e-5  # the measured gap: at most 1e-6 (fp32, the requests below)
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "gemma4_unified_reference.npz")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return make_gemma4_unified_checkpoint(str(tmp_path_factory.mktemp("gemma4_unified") / "ckpt"), seed=5)


@pytest.fixture(scope="module")
def served(path):
    with engine(path) as e:
        yield e


def test_the_image_processor_equals_transformers_stored_output():
    """minivlm's plain-torch processor on 11 image sizes x 3 budgets: the soft-token count, every patch position and
    the pixels (the first merged patch, the sha256 of all rows) of transformers' Gemma4UnifiedImageProcessor."""
    from minivlm.inputs.patches_gemma4_unified import Gemma4UnifiedImageProcessorTorch
    ref = np.load(FIXTURE)
    ours = outputs(Gemma4UnifiedImageProcessorTorch())
    assert len(ours) == 5 * len(SIZES) * len(BUDGETS) and set(ours) <= set(ref.files)
    for key, value in ours.items():
        assert np.array_equal(value, ref[key]), key


def test_image_requests_single_batched_and_from_the_prefix_cache_equal_hf(path, served):
    """One image request (60 soft tokens, more than the 24-token window: they see each other whole on every layer,
    as HF's forward masks them), then a batch of two images, the same and text only, then the first again from the
    prefix cache: tokens and top-5 logprobs = HF fp32's."""
    with nullcontext(served) as e:  # the module's engine
        one = e.generate(WIDE, greedy(8))
        outs = e.generate([TWO, WIDE, TEXT], greedy())
        again = e.generate(WIDE, greedy(8))
    assert one.num_prompt_tokens > SLIDING_WINDOW + 60
    for request, out in ((WIDE, one), (TWO, outs[0]), (WIDE, outs[1]), (TEXT, outs[2]), (WIDE, again)):
        assert gap_to_hf(path, request, out) <= TOL
    assert again.num_cached_tokens > one.num_prompt_tokens // 2 and again.token_ids == one.token_ids



def test_turn_two_with_a_new_image_reuses_every_full_block_it_shares_and_equals_hf(path, served):
    """A chat's second turn (turn 1, its answer, a new image and question): its hit is every full block of the longest
    token prefix it shares with what turn 1 computed (turn 1's image began before the window, but the hit ends past
    it, never inside), and its answer equals HF's."""
    first = WIDE.to_messages()
    with nullcontext(served) as e:  # the module's engine
        one = e.generate(WIDE, greedy())
        new = [{"type": "image", "image": scene(90, 60, (40, 70, 220))}, {"type": "text", "text": "And this one?"}]
        two = Request(messages=first + [{"role": "assistant", "content": one.text}, {"role": "user", "content": new}])
        before, after = e.anatomy(WIDE).tokens, e.anatomy(two).tokens
        out = e.generate(two, greedy())
    computed = [t.token_id for t in before] + one.token_ids[:-1]  # the last answer token's K/V were never written
    shared = next((i for i, (a, b) in enumerate(zip(computed, [t.token_id for t in after])) if a != b),
                  min(len(computed), len(after)))
    assert shared >= one.num_prompt_tokens  # turn 1 whole (a random answer's text may tokenize anew)
    assert out.num_cached_tokens == shared // BLOCK * BLOCK
    assert gap_to_hf(path, two, out) <= TOL

def test_sixteen_token_chunks_equal_hf(path):
    """Chunked prefill, 16 tokens a step: a chunk never ends inside an image, so the 60-token image runs whole in a
    chunk after cached text (its queries reach back to the image's first token, the text's to the window)."""
    with engine(path, enable_chunked_prefill=True, max_num_batched_tokens=16) as e:
        out = e.generate(WIDE, greedy())
    assert gap_to_hf(path, WIDE, out) <= TOL


def test_a_hit_never_ends_inside_an_image_that_began_before_its_window(path):
    """The sliding group's blocks from 7 on are evicted after a first run: the longest hit it could serve would end
    inside the image (block 7, token 56), whose first token lies before that point's window; the rest of the image
    would then need blocks given back, so the hit stops where the image's start is still in the window (3 blocks), and
    the answer equals HF's."""
    with engine(path) as e:
        e.generate(WIDE, greedy(2))
        a = e.anatomy(WIDE)
        sliding = e.core.block_manager.sliding
        for block in a.blocks[7:]:
            sliding.key_to_block.pop(block.keys[e.config.cache_strategy], None)
        out = e.generate(WIDE, greedy())
    image = a.images[0]
    assert image.start < 3 * 8 < 7 * 8 < image.end and out.num_cached_tokens == 3 * 8
    assert gap_to_hf(path, WIDE, out) <= TOL


@pytest.mark.slow
def test_a_ten_block_pool_preempts_and_still_equals_hf(path):
    """An image request and a text one fit 10 blocks of 16 at admission, not once each has decoded 30 tokens: the
    newest is preempted, recomputed, and both equal HF (30 fp32 decode steps: measured max |Δ| 1.2e-5, bound 1e-4,
    the issue's; the same without preemption)."""
    from minivlm import Engine, EngineConfig
    a = ask(scene(60, 60, (220, 30, 30)), text="Colour?")
    b = Request(messages=[{"role": "user", "content": "Hello, how are you? The quick brown fox jumps."}])
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", block_size=16, num_blocks=10,
                             max_model_len=160)) as e:
        outs = e.generate([a, b], greedy(30))
        kinds = [ev.kind for ev in e.events()]
    assert "preempted" in kinds
    for request, out in zip((a, b), outs):
        assert gap_to_hf(path, request, out) <= 1e-4


@pytest.mark.slow
def test_bf16_errs_as_hf_bf16_does(path):
    """In bf16 the engine's top-5 logprobs differ from HF fp32's by what HF bf16's differ (measured: ratio 0.82-1.04
    on these three requests; bound 1.15, tests/test_bf16_drift.py's margin)."""
    for request in (WIDE, TWO, TEXT):
        ours, theirs = bf16_gaps(path, request)
        assert ours <= 1.15 * theirs, (ours, theirs)


def test_hf_sees_an_image_whole_past_the_window(path):
    """The reference itself: HF's logits change when it is not told where the image is (so both-ways attention, past
    the window, is really exercised by the test above)."""
    from tests.hf_reference import hf_model, hf_processor
    inputs = hf_processor(path).apply_chat_template(WIDE.to_messages(), tokenize=True, return_dict=True,
                                                    add_generation_prompt=True, return_tensors="pt")
    with torch.no_grad():
        told = hf_model(path)(**inputs).logits
        inputs.pop("mm_token_type_ids")
        causal = hf_model(path)(**inputs).logits
    assert (told - causal).abs().max() > 1e-3


def test_key_c_holds_the_budget_and_patch_grid_and_the_token_count_is_hfs(path, served):
    """Each image's key-C material holds its soft-token budget and its patch grid (rows, cols, patches, from the
    processor's positions); the same image under another budget shares block 0's tokens but not its key C; the token
    counts are those HF's processor computes for the image sizes (_get_num_multimodal_tokens)."""
    from tests.hf_reference import hf_processor
    with nullcontext(served) as e:  # the module's engine
        small = e.anatomy(ask(scene(200, 130, (220, 30, 30))))
        big = e.anatomy(ask(scene(200, 130, (220, 30, 30)), mm_processor_kwargs={"max_soft_tokens": 140}))
    for anatomy, budget in ((small, 70), (big, 140)):
        im = anatomy.images[0]
        hf = hf_processor(path)._get_num_multimodal_tokens(image_sizes=[(130, 200)], max_soft_tokens=budget)
        rows, cols = im.resized_size[1] // 48, im.resized_size[0] // 48
        assert im.num_tokens == hf.num_image_tokens[0] == rows * cols
        assert ("max_soft_tokens", budget) in im.settings and ("patch_grid", rows, cols, rows * cols) in im.settings
        block = anatomy.blocks[im.start // anatomy.block_size]  # the block the image starts in: its key C holds both
        assert im.settings in [x[3] for x in block.key_inputs["C"] if len(x) == 5]
    assert small.blocks[0].keys["A"] == big.blocks[0].keys["A"] and small.blocks[0].keys["C"] != big.blocks[0].keys["C"]


def test_the_anatomy_says_there_is_no_encoder(served):
    """No tower: the anatomy says so, and each soft token is one 48 x 48-px merged patch (16-px patches, 3 x 3)."""
    with nullcontext(served) as e:  # the module's engine
        a = e.anatomy(ask(scene(200, 130, (220, 30, 30))))
        tower = e.model.vision
    assert a.encoder is False and any("no vision encoder" in n for n in a.notes)
    im = a.images[0]
    assert (im.patch_size, im.merge_size) == (16, 3) and im.num_patches == 9 * im.num_tokens
    assert not tower.has_encoder and sorted(n for n, _ in tower.module.embed_vision.named_children()) == \
        ["multimodal_embedder", "patch_dense", "patch_ln1", "patch_ln2", "pos_norm"]


def test_audio_input_is_refused_by_name(served):
    """The 12B's audio (raw waveform frames) is not served: refused before anything is queued, naming audio."""
    with nullcontext(served) as e:  # the module's engine
        request = Request(messages=[{"role": "user", "content": [{"type": "audio", "audio": "speech.wav"},
                                                                 {"type": "text", "text": "What is said?"}]}])
        with pytest.raises(Refused, match="audio input is not supported") as refused:
            e.generate(request, greedy(1))
    assert refused.value.reason == "takes_no_audio"


def test_the_calculator_counts_the_patch_embedder_and_no_tower(path, served):
    """The VRAM calculator's vision part is the patch embedder alone (no blocks), equal to the module transformers
    builds and to the engine's loaded bytes; its weights are the engine's (fp32, the audio embedder not loaded); its
    KV groups are the engine's pools, the shared layers at 0 bytes and the full layers' one KV head (keys as values)."""
    from transformers import AutoModelForImageTextToText

    from minivlm.budget import estimate, hf_config, model_shape, vision_params
    from minivlm.budget.kv_groups import SHARED, layer_groups, size_groups
    from minivlm.budget.params import audio_params
    config = hf_config(path)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    s, report = model_shape(config), served.memory_report()
    parts = vision_params(s)
    assert parts["vision_blocks"] == 0 and s.vision_kind == "gemma4_patches"
    assert sum(parts.values()) == sum(p.numel() for p in model.model.embed_vision.parameters())
    assert report.vision_weights_bytes == 4 * sum(parts.values()) == served.model.vision.num_bytes()
    est = estimate(config, dtype="float32", kv_dtype="float32", max_model_len=512, block_size=8,
                   device_memory_bytes=2 ** 40, weights_bytes=report.weights_bytes)
    assert est.predicted_weights_bytes == report.weights_bytes
    assert est.num_parameters - sum(audio_params(s).values()) == report.weights_bytes // 4
    c = served.config
    sizes = size_groups(layer_groups(path), "float32", None, c.block_size, c.max_num_seqs,
                        c.max_num_batched_tokens or c.max_model_len, c.enable_chunked_prefill, c.max_model_len,
                        num_blocks=report.num_blocks)
    assert {g["kind"]: (g["size"], g["bytes"]) for g in report.groups if g["bytes"]} == \
        {g.shape.kind: (g.blocks, g.bytes) for g in sizes.groups if g.bytes}
    assert report.kv_cache_bytes == sizes.total_bytes and sizes.group(SHARED).bytes == 0
    full = next(g for g in report.groups if g["kind"] == "full_attention")
    assert full["layers"] == [5] and full["bytes"] == 2 * full["size"] * c.block_size * 1 * 20 * 4


def test_the_cli_writes_the_published_layout(tmp_path):
    """`python -m tools.make_checkpoint_matrix gemma4_unified OUT`: transformers' config (the 12B's 5:1 pattern, keys
    as values, the last 4 layers shared, images both ways, an audio embedder), the embedder under the names the
    release uses (vision_embedder.*, embed_vision.embedding_projection), the shared layers' unread k_proj / v_proj /
    k_norm present and random, the image processor under transformers' class name."""
    import json

    from safetensors import safe_open

    from tools.make_checkpoint_matrix import main
    out = main(["gemma4_unified", str(tmp_path / "cli"), "--seed", "1"])
    config = json.loads((tmp_path / "cli" / "config.json").read_text())
    text = config["text_config"]
    assert config["model_type"] == "gemma4_unified" and "vision_config" in config and "audio_config" in config
    assert text["num_kv_shared_layers"] == 4 and text["attention_k_eq_v"] and text["layer_types"][5] == "full_attention"
    saved = json.loads((tmp_path / "cli" / "processor_config.json").read_text())
    assert saved["processor_class"] == "Gemma4UnifiedProcessor"
    assert saved["image_processor"]["image_processor_type"] == "Gemma4UnifiedImageProcessor"
    with safe_open(f"{out}/model.safetensors", "pt") as f:
        assert "model.vision_embedder.patch_dense.weight" in f.keys()
        assert "model.embed_vision.embedding_projection.weight" in f.keys()
        for i in range(8, 12):
            for name in ("k_proj", "v_proj", "k_norm"):
                assert f.get_tensor(f"model.language_model.layers.{i}.self_attn.{name}.weight").std() > 0.1
