"""Gemma 4 served (tests/gemma4_requests.py's random checkpoint), what is not a logit: the checkpoint tool's layout,
the shared layers' zero bytes in memory_report and the KV tab, the sliding group's window, the soft-token budget as a
knob, in key C and on the Anatomy tab (HF's processor's counts), and what is refused by name (audio, experts, the
drafter)."""
from contextlib import nullcontext

import pytest

from minivlm import Request
from minivlm.refusals import Refused
from tests.gemma4_requests import BLOCK, TEXT, ask, greedy, path, scene, served  # noqa: F401
from tools.make_checkpoint_gemma4 import SLIDING_WINDOW


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


@pytest.mark.parametrize("model_type,words", [("gemma4_assistant", "speculative-decoding draft model")])
def test_the_drafter_is_refused_by_name_at_load(tmp_path, model_type, words):  # the 12B runs: test_gemma4_unified.py
    import json

    from minivlm.loader import read_model_type
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(ValueError, match=f"unsupported architecture '{model_type}': .*{words}"):
        read_model_type(str(tmp_path))
