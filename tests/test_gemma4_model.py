"""Gemma 4 (minivlm/model/gemma4.py, vision_gemma4.py) served by the engine against transformers'
Gemma4ForConditionalGeneration on the same random checkpoint (tools/make_checkpoint_gemma4.py: ten layers, the last
four reading earlier layers' K/V, sliding head 12 / full head 20, per-layer embeddings, a 24-token window that every
prompt outgrows), fp32. Each engine output's tokens and top-5 logprobs are checked against HF's teacher-forced
log-probabilities over the prompt HF's own processor renders (tests/hf_reference.py): max |Δ| <= 1e-4, single and
batched, with images, on a prefix-cache repeat, with 16-token chunks, in a 10-block pool that preempts."""
from contextlib import nullcontext

import pytest
import torch
from PIL import Image

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.refusals import Refused
from tests.hf_reference import teacher_forced_logprobs
from tools.make_checkpoint_gemma4 import SLIDING_WINDOW, make_gemma4_checkpoint

TOL = 1e-4
BLOCK = 8
QUESTION = "Describe the image. What color is the shape? What shape is it? How many shapes are there?"


def scene(w, h, color):
    img = Image.new("RGB", (w, h), (230, 230, 230))
    img.paste(color, (w // 4, h // 4, w // 2, h // 2))
    return img


def ask(*images, text=QUESTION, **kw) -> Request:
    return Request(messages=[{"role": "user", "content": [*({"type": "image", "image": im} for im in images),
                                                          {"type": "text", "text": text}]}], **kw)


WIDE = ask(scene(200, 130, (220, 30, 30)))                                  # 60 soft tokens
TWO = ask(scene(90, 60, (40, 70, 220)), scene(48, 160, (30, 200, 60)), text=QUESTION + " Where is it?")
TEXT = Request(messages=[{"role": "user", "content": "Hello, how are you? The quick brown fox jumps over the lazy "
                                                     "dog. " * 3}])


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return make_gemma4_checkpoint(str(tmp_path_factory.mktemp("gemma4") / "ckpt"), seed=5)


@pytest.fixture(scope="module")
def served(path):
    """One engine of the default settings for the module's tests (each test a fresh one where it sets others)."""
    with engine(path) as e:
        yield e


def engine(path, **kw) -> Engine:
    return Engine(EngineConfig(model=path, device="cpu", dtype=kw.pop("dtype", "float32"), block_size=BLOCK,
                               num_blocks=kw.pop("num_blocks", 96), max_model_len=kw.pop("max_model_len", 512), **kw))


def greedy(n: int = 6) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=5)


def gap_to_hf(path, request, out) -> float:
    """The engine's tokens must be HF's argmax at each position; returns max |Δ| over each step's top-5 logprobs."""
    ref = teacher_forced_logprobs(path, request, out.token_ids)
    assert ref.argmax(-1).tolist() == out.token_ids
    assert all(len(d) >= 5 for d in out.logprobs)
    return max(abs(ref[i, t].item() - lp) for i, d in enumerate(out.logprobs) for t, lp in d.items())


def test_an_image_request_equals_hf(path, served):
    with nullcontext(served) as e:  # the module's engine
        out = e.generate(WIDE, greedy(8))
    assert out.num_prompt_tokens > SLIDING_WINDOW + 60  # the window slid past the image
    assert gap_to_hf(path, WIDE, out) <= TOL


def test_a_batch_and_its_prefix_cache_repeat_equal_hf(path, served):
    """Three requests in one batch (two images of other sizes, text only), then the image one again: served from
    the prefix cache (sliding and full blocks), the same answer."""
    with nullcontext(served) as e:  # the module's engine
        outs = e.generate([WIDE, TWO, TEXT], greedy())
        again = e.generate(WIDE, greedy())
    for request, out in zip((WIDE, TWO, TEXT), outs):
        assert gap_to_hf(path, request, out) <= TOL
    assert again.num_cached_tokens >= (outs[0].num_prompt_tokens // BLOCK - 1) * BLOCK
    assert again.token_ids == outs[0].token_ids and gap_to_hf(path, WIDE, again) <= TOL


def test_turn_two_with_a_new_image_reuses_every_full_block_it_shares_and_equals_hf(path, served):
    """A chat's second turn (turn 1, its answer, a new image and question): its hit is every full block of the
    longest token prefix it shares with what turn 1 computed (the sliding window before it still cached), and its
    answer equals HF's."""
    first = WIDE.to_messages()
    with nullcontext(served) as e:  # the module's engine
        one = e.generate(WIDE, greedy())
        new = [{"type": "image", "image": scene(90, 60, (40, 70, 220))}, {"type": "text", "text": "And this one?"}]
        two = Request(messages=first + [{"role": "assistant", "content": one.text}, {"role": "user", "content": new}])
        before = e.anatomy(WIDE).tokens
        after = e.anatomy(two).tokens
        out = e.generate(two, greedy())
    computed = [t.token_id for t in before] + one.token_ids[:-1]  # the last answer token's K/V were never written
    shared = next((i for i, (a, b) in enumerate(zip(computed, [t.token_id for t in after])) if a != b),
                  min(len(computed), len(after)))
    assert shared >= one.num_prompt_tokens  # turn 1 whole (a random answer's text may tokenize anew)
    assert out.num_cached_tokens == shared // BLOCK * BLOCK
    assert gap_to_hf(path, two, out) <= TOL


def test_the_cli_writes_the_published_layout(tmp_path):
    """`python -m tools.make_checkpoint_matrix gemma4 OUT`: transformers' config (E2B's pattern: sliding and full
    layers, the last 4 shared, per-layer embeddings, an audio tower), the processor it saved, and the shared layers'
    unread k_proj / v_proj / k_norm present and random."""
    import json

    from safetensors import safe_open

    from tools.make_checkpoint_matrix import main
    out = main(["gemma4", str(tmp_path / "cli"), "--seed", "1"])
    config = json.loads((tmp_path / "cli" / "config.json").read_text())
    text = config["text_config"]
    assert config["model_type"] == "gemma4" and config["audio_config"]["model_type"] == "gemma4_audio"
    assert text["num_kv_shared_layers"] == 4 and text["hidden_size_per_layer_input"] and text["use_double_wide_mlp"]
    assert "processor_class" in json.loads((tmp_path / "cli" / "processor_config.json").read_text())
    with safe_open(f"{out}/model.safetensors", "pt") as f:
        for i in range(6, 10):
            for name in ("k_proj", "v_proj", "k_norm"):
                weight = f.get_tensor(f"model.language_model.layers.{i}.self_attn.{name}.weight")
                assert weight.std() > 0.1


def test_the_shared_layers_read_their_sources_and_the_checkpoints_kv_weights_are_unread(path, served):
    """Layers 6-9 compute no K/V: 6-8 read layer 5 (the last sliding layer before them), 9 reads layer 4 (the last
    full one); the k_proj / v_proj / k_norm the checkpoint carries for them (random) load nowhere."""
    from safetensors import safe_open
    with nullcontext(served) as e:  # the module's engine
        decoder = e.model.decoder
        assert decoder.sources == [0, 1, 2, 3, 4, 5, 5, 5, 5, 4]
        assert [s.head_dim for s in decoder.layer_specs[:6]] == [12, 12, 12, 12, 20, 12]
        assert [(s.kind, s.source) for s in decoder.layer_specs[6:]] == [("kv_shared", 5)] * 3 + [("kv_shared", 4)]
        for i in range(6, 10):
            attn = decoder.layers[i].self_attn
            assert attn.qkv_proj.out_features == 4 * attn.head_dim and not hasattr(attn, "k_norm")
    with safe_open(f"{path}/model.safetensors", "pt") as f:
        assert "model.language_model.layers.9.self_attn.k_proj.weight" in f.keys()


def test_the_shared_layers_allocate_nothing_and_read_their_sources_groups(path, served):
    """memory_report: the kv_shared group holds layers 6-9, 0 bytes, reading layers 5 and 4 (groups 1 and 0); the
    pool is exactly the non-shared layers' K/V at each one's own head size (transformers' per-layer config and
    kv_sharing_modes, not the engine's); the snapshot shows the group with no tables."""
    from transformers import AutoConfig
    text = AutoConfig.from_pretrained(path).text_config
    own = [i for i, mode in enumerate(text.kv_sharing_modes) if mode != "reuse"]
    expected = sum(2 * 96 * BLOCK * text.per_layer_config[i].num_key_value_heads * text.per_layer_config[i].head_dim
                   * 4 for i in own)
    with nullcontext(served) as e:  # the module's engine
        report = e.memory_report()
        e.generate(TEXT, greedy(2))
        snap = {g.kind: g for g in e.snapshot().groups}
    groups = {g["kind"]: g for g in report.groups}
    assert groups["kv_shared"]["bytes"] == 0 and groups["kv_shared"]["layers"] == [6, 7, 8, 9]
    assert groups["kv_shared"]["reads"] == {6: 5, 7: 5, 8: 5, 9: 4} and groups["kv_shared"]["reads_groups"] == [0, 1]
    assert report.kv_cache_bytes == expected and groups["full_attention"]["layers"] == [4]
    assert snap["kv_shared"].reads == {6: 5, 7: 5, 8: 5, 9: 4} and snap["kv_shared"].block_tables == {}


def test_the_kv_tab_and_status_line_show_the_shared_layers_reading_their_sources(path, served):
    """The status line's groups and the KV tab's group view, live and replayed step by step from the event log (the
    kv_shared parts of the plans own no table), say which layer each shared layer reads, at 0 blocks."""
    from panels.group_replay import group_frame, live_frame
    from panels.group_views import groups_html
    from panels.holder import groups_part
    with nullcontext(served) as e:  # the module's engine
        since = len(e.events())
        e.generate(TEXT, greedy(3))
        snap, events = e.snapshot(), e.events()[since:]
        line = groups_part(e.memory_report().groups, 4)
    assert "KV-shared (layers 6–9, each reads: 6–8 → 5, 9 → 4): 0 blocks (0 MiB)" in line
    for frame in (live_frame(snap, events), group_frame(events, snap.groups, snap, BLOCK)):
        view = groups_html(frame, BLOCK, "now")
        assert "no blocks of its own" in view and "(layer → source: 6–8 → 5, 9 → 4)" in view


def test_the_anatomy_tab_draws_an_image_under_each_budget(served):
    """The Anatomy tab's size slider picks the soft-token budget: its second stop asks for 140, and the drawn request
    has the tokens HF's processor gives that budget (as test_a_soft_token_budget... checks against it)."""
    import panels.anatomy as tab
    with nullcontext(served) as e:  # the module's engine
        assert tab.knob(e)[:4] == (0, 4, 1, 0) and "max_soft_tokens" in tab.knob(e)[4]
        kwargs = tab.pixels_kwargs(e, 1)
        image = scene(200, 130, (220, 30, 30))
        text = tab.render(e, Request(prompt="Colour?", images=[image], mm_processor_kwargs=kwargs), [image])[0]
        tokens = e.anatomy(Request(prompt="Colour?", images=[image], mm_processor_kwargs=kwargs)).images[0].num_tokens
    assert kwargs == {"max_soft_tokens": 140} and f"200×130 px → {tokens} tokens" in text and tokens > 70


@pytest.mark.slow
def test_sixteen_token_chunks_equal_hf(path):
    with engine(path, enable_chunked_prefill=True, max_num_batched_tokens=16) as e:
        outs = e.generate([WIDE, TWO], greedy())
    for request, out in zip((WIDE, TWO), outs):
        assert gap_to_hf(path, request, out) <= TOL


@pytest.mark.slow
def test_a_ten_block_pool_preempts_and_still_equals_hf(path):
    """An image request (6 blocks of 16) and a text one (2) fit 10 blocks at admission, not once each has decoded
    30 tokens: the newest is preempted, recomputed, and both equal HF."""
    a = ask(scene(60, 60, (220, 30, 30)), text="Colour?")
    b = Request(messages=[{"role": "user", "content": "Hello, how are you? The quick brown fox jumps."}])
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", block_size=16, num_blocks=10,
                             max_model_len=160)) as e:
        outs = e.generate([a, b], greedy(30))
        kinds = [ev.kind for ev in e.events()]
    assert "preempted" in kinds
    for request, out in zip((a, b), outs):
        assert gap_to_hf(path, request, out) <= TOL


@pytest.mark.slow
def test_images_attending_both_ways_on_sliding_layers_equal_hf_in_16_token_chunks(tmp_path):
    """use_bidirectional_attention='vision' (the larger Gemma 4s): an image's tokens see each other both ways on the
    sliding layers only (full layers stay causal); in 16-token chunks no chunk ends inside the image. HF's own
    logits change when it is not told where the image is, so the both-ways mask is really exercised."""
    from tests.hf_reference import hf_model, hf_processor
    bidir = make_gemma4_checkpoint(str(tmp_path / "bidir"), seed=7, use_bidirectional_attention="vision")
    with engine(bidir, enable_chunked_prefill=True, max_num_batched_tokens=16) as e:
        out = e.generate(WIDE, greedy())
    assert gap_to_hf(bidir, WIDE, out) <= TOL
    inputs = hf_processor(bidir).apply_chat_template(WIDE.to_messages(), tokenize=True, return_dict=True,
                                                     add_generation_prompt=True, return_tensors="pt")
    with torch.no_grad():
        told = hf_model(bidir)(**inputs).logits
        inputs.pop("mm_token_type_ids")
        causal = hf_model(bidir)(**inputs).logits
    assert (told - causal).abs().max() > 1e-3


@pytest.mark.slow
def test_bf16_errs_as_hf_bf16_does(path):
    """In bf16 the engine's top-5 logprobs differ from HF fp32's by what HF bf16's differ (measured: ratio 0.90-1.00
    on these three requests; bound 1.15, tests/test_bf16_drift.py's margin)."""
    for request in (WIDE, TWO, TEXT):
        with engine(path, dtype="bfloat16") as e:
            out = e.generate(request, greedy(8))
        fp32 = teacher_forced_logprobs(path, request, out.token_ids, torch.float32)
        bf16 = teacher_forced_logprobs(path, request, out.token_ids, torch.bfloat16)
        pairs = [(i, t, lp) for i, d in enumerate(out.logprobs) for t, lp in d.items()]
        ours = max(abs(lp - fp32[i, t].item()) for i, t, lp in pairs)
        theirs = max(abs(bf16[i, t].item() - fp32[i, t].item()) for i, t, _ in pairs)
        assert ours <= 1.15 * theirs, (ours, theirs)


@pytest.mark.slow
def test_full_layers_whose_keys_are_their_values_equal_hf(tmp_path):
    """attention_k_eq_v (the larger Gemma 4s): full layers project K once and use it as V too, with their own KV head
    count (num_global_key_value_heads 1 here); the full group's pool is sized by it."""
    keqv = make_gemma4_checkpoint(str(tmp_path / "keqv"), seed=3, attention_k_eq_v=True, num_global_key_value_heads=1)
    with engine(keqv) as e:
        out = e.generate(WIDE, greedy())
        full = e.memory_report().groups[0]
    assert gap_to_hf(keqv, WIDE, out) <= TOL
    assert full["kind"] == "full_attention" and full["bytes"] == 2 * 96 * BLOCK * 1 * 20 * 4


def test_a_sliding_group_holds_only_its_window(path, served):
    """Once a long text request's prompt is computed (that step's chunk: the whole prompt), its sliding-window table
    holds at most ceil((window - 1 + 1) / block) + 1 blocks while it decodes; the full group every block of its
    tokens."""
    with nullcontext(served) as e:  # the module's engine
        e.reset_prefix_cache()  # its prompt computed whole, not a hit of an earlier test's
        e.pause()
        e.submit(TEXT, greedy(4))
        held = []
        for _ in range(6):
            e.step()
            snap = e.snapshot()
            groups = {g.kind: g for g in snap.groups}
            for rid, table in groups["sliding_window"].block_tables.items():
                held.append((sum(b is not None for b in table), len(groups["full_attention"].block_tables[rid])))
        e.resume()
    limit = -(-SLIDING_WINDOW // BLOCK) + 1
    assert len(held) > 2 and held[0][0] == held[0][1] > limit  # the prefill step: the whole prompt
    assert all(live <= limit < full for live, full in held[1:])


def test_a_soft_token_budget_is_a_knob_and_in_key_c(path, served):
    """max_soft_tokens (one of 70, 140, 280, 560, 1120) changes the image's token count exactly as HF's processor
    counts it, and enters the prefix key: the same image under another budget is no prefix hit."""
    with nullcontext(served) as e:  # the module's engine
        small = e.anatomy(ask(scene(200, 130, (220, 30, 30))))
        big = e.anatomy(ask(scene(200, 130, (220, 30, 30)), mm_processor_kwargs={"max_soft_tokens": 140}))
        with pytest.raises(Refused, match=r"max_soft_tokens' must be one of 70, 140, 280, 560, 1120, got 100"):
            e.generate(ask(scene(20, 20, (1, 2, 3)), mm_processor_kwargs={"max_soft_tokens": 100}), greedy(1))
    from tests.hf_reference import hf_processor
    for anatomy, budget in ((small, 70), (big, 140)):  # HF's processor: its patches, their grid, its token count
        out = hf_processor(path)(text=["<|image|>"], images=[scene(200, 130, (220, 30, 30))], max_soft_tokens=budget,
                                 return_tensors="pt")
        real = out["image_position_ids"][0][(out["image_position_ids"][0] >= 0).all(-1)]
        im = anatomy.images[0]
        hf_tokens = int((out["input_ids"][0] == hf_processor(path).image_token_id).sum())
        assert im.num_tokens == hf_tokens == sum(t.type == "image" for t in anatomy.tokens)
        assert im.num_patches == len(real) and im.grid_thw[1:] == (real[:, 1].max() + 1, real[:, 0].max() + 1)
    assert small.images[0].num_tokens != big.images[0].num_tokens
    # block 0 (<bos>, the turn, <|image>, the first soft tokens) has the same tokens under both budgets: only its
    # key C, which holds the budget, tells them apart
    assert small.blocks[0].keys["A"] == big.blocks[0].keys["A"] and small.blocks[0].keys["C"] != big.blocks[0].keys["C"]


def test_audio_input_is_refused_by_name(path, served):
    """E2B / E4B carry an audio tower, which minivlm does not load: an audio item (HF's or OpenAI's form) is refused
    before anything is queued, naming audio; the engine keeps serving."""
    with nullcontext(served) as e:  # the module's engine
        openai = {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}
        for item in ({"type": "audio", "audio": "speech.wav"}, openai):
            request = Request(messages=[{"role": "user", "content": [item, {"type": "text", "text": "What is said?"}]}])
            with pytest.raises(Refused, match="audio input is not supported") as refused:
                e.generate(request, greedy(1))
            assert refused.value.reason == "takes_no_audio" and refused.value.param == "messages"
        assert len(e.generate(TEXT, greedy(2)).token_ids) == 2


def test_unsupported_settings_are_refused_by_name():
    from transformers import Gemma4TextConfig

    from minivlm.model.gemma4 import Gemma4Decoder
    moe = Gemma4TextConfig(num_hidden_layers=2, enable_moe_block=True, num_experts=4, top_k_experts=2,
                           moe_intermediate_size=8, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ValueError, match=r"enable_moe_block=True, num_experts=4 \(a mixture-of-experts block"):
        Gemma4Decoder("gemma4", moe, True)
    both = Gemma4TextConfig(num_hidden_layers=2, use_bidirectional_attention="all",
                            layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ValueError, match="use_bidirectional_attention='all'"):
        Gemma4Decoder("gemma4", both, True)


@pytest.mark.parametrize("model_type,words", [
    ("gemma4_unified", "encoder-free embedder"), ("gemma4_assistant", "speculative-decoding draft model")])
def test_gemma4_12b_and_the_drafter_are_refused_by_name_at_load(tmp_path, model_type, words):
    import json

    from minivlm.loader import read_model_type
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(ValueError, match=f"unsupported architecture '{model_type}': .*{words}"):
        read_model_type(str(tmp_path))


@pytest.mark.slow
def test_hf_agrees_the_window_matters(path):
    """A sanity check on the reference itself: HF's logits for the long text prompt change if the sliding window is
    widened past it (so a decoder that ignored the window would fail the tests above)."""
    from transformers import Gemma4ForConditionalGeneration
    wide = Gemma4ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([[2] + list(range(10, 80))])
    with torch.no_grad():
        narrow_logits = wide(input_ids=ids).logits
        for layer in wide.model.language_model.layers:
            if layer.self_attn.sliding_window:
                layer.self_attn.sliding_window = 10_000
        wide.config.text_config.sliding_window = 10_000
        wide_logits = wide(input_ids=ids).logits
    assert (narrow_logits - wide_logits).abs().max() > 1e-3
