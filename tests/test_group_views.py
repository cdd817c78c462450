"""The app's views of a hybrid model's KV-cache groups (#41 item 4), on random Qwen3.5 and Gemma 3 checkpoints saved by
transformers: the status line says what each group holds (layers as HF's config types them, sizes as the engine
allocated them); the KV tab's group frames, replayed from the event log, equal the engine's own snapshots at every
step (with preemption and chunked prefill); the drawn tables hold the exact block and slot ids the sliding-window rule
(a query at p sees p - window + 1 .. p) and the free queues give; the decision log says the group events; Anatomy
draws Gemma 3's views as its processor cuts them; the inspector's hybrid preset fools key A only."""
import html
import re

import numpy as np
import pytest
from PIL import Image, ImageDraw

from minivlm import Engine, EngineConfig, Request, SamplingParams, load_image
from minivlm.inputs.prompt import build_prompt
from minivlm.views.cache_study import max_logprob_diff
from minivlm.views.events import replay

from panels import anatomy, inspector_hybrid
from panels.anatomy_fixed import views
from panels.cache_inspector import ROUNDING, _example, results_table, run_pair
from panels.decisions import decision_log, run_line
from panels.group_replay import group_frame
from panels.group_views import frame_for, groups_html
from panels.holder import layer_ranges, status_line
from panels.i18n import ZH
from panels.kv_blocks import demo_requests
from panels.kv_run import Run

FAMILIES = ["qwen3_5", "gemma3"]
SEQS = 4


@pytest.fixture(scope="module")
def hybrid_checkpoints(tmp_path_factory):
    from tools.make_checkpoint_gemma3 import make_gemma3_checkpoint
    from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
    root = tmp_path_factory.mktemp("hybrid_views")
    return {"qwen3_5": make_qwen3_5_checkpoint(str(root / "qwen3_5"), seed=5),
            "gemma3": make_gemma3_checkpoint(str(root / "gemma3"), seed=6)}


def make(path, **kw) -> Engine:
    return Engine(EngineConfig(model=path, device="cpu", dtype="float32", max_model_len=1024,
                               **{"num_blocks": 32, "max_num_seqs": SEQS, **kw}))


@pytest.fixture(scope="module")
def engines(hybrid_checkpoints):
    made = {f: make(p) for f, p in hybrid_checkpoints.items()}
    yield made
    for e in made.values():
        e.close()


def layers_of(engine, *types) -> list[int]:
    """Decoder layers of the given HF layer types (text_config.layer_types, as transformers builds the model)."""
    return [i for i, kind in enumerate(engine.hf_config.text_config.layer_types) if kind in types]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_status_line_says_what_each_group_holds(family, engines):
    e = engines[family]
    line, rep = status_line(e), e.memory_report()
    mib = {g["kind"]: f"{g['bytes'] / 2**20:,.1f}" for g in rep.groups}
    full = layers_of(e, "full_attention")
    assert f"KV-cache groups: full attention (layer{'s' if len(full) > 1 else ''} {layer_ranges(full)}): 32 blocks " \
           f"({mib['full_attention']} MiB)" in line
    if family == "qwen3_5":  # one running slot per request + 2 x max_num_seqs checkpoints (EngineConfig's default)
        recurrent = layer_ranges(layers_of(e, "linear_attention"))
        assert f"recurrent state (layers {recurrent}): {3 * SEQS} slots = {SEQS} running + {2 * SEQS} checkpoints " \
               f"({mib['recurrent']} MiB)" in line
    else:
        window = e.hf_config.text_config.sliding_window
        sliding = e.memory_report().groups[1]["size"]
        assert f"sliding window (layers {layer_ranges(layers_of(e, 'sliding_attention'))}, window {window}): " \
               f"{sliding} blocks ({mib['sliding_window']} MiB)" in line
    assert "KV 缓存组：全注意力" in status_line(e, ZH)


def test_a_dense_models_status_line_has_no_groups(engine):
    line = status_line(engine)
    assert "KV-cache groups" not in line and re.search(r"\(\d[\d.,]* MiB\) · maximum concurrency", line)
    assert layer_ranges([0, 1, 2, 4, 5, 6, 9]) == "0–2, 4–6, 9" and layer_ranges([3, 4]) == "3, 4"


@pytest.mark.parametrize("family, kw", [("qwen3_5", {}), ("gemma3", {}), ("qwen3_5", {"num_blocks": 12}),
                                        ("gemma3", {"num_blocks": 12, "enable_chunked_prefill": True,
                                                    "max_num_batched_tokens": 32})])
def test_replayed_groups_equal_the_engines_snapshots(family, kw, hybrid_checkpoints):
    """Every step of a run (with preemption: 12 blocks; chunked prefill), replayed from the events alone, shows the
    tables, free counts and checkpoints the engine's own snapshot showed then; and the tables the runner kept from the
    plans' per-group deltas are every attention group's own (0 where a block left the window)."""
    with make(hybrid_checkpoints[family], **kw) as e:
        e.generate(demo_requests(1, None), SamplingParams(max_tokens=20, ignore_eos=True))  # cached blocks, checkpoints
        base = e.snapshot()
        kept = []

        def check(core):
            managers = core.block_manager.managers
            for seq in core.scheduler.running:
                tables = core.runner.batch[seq.seq_id].tables
                kept.append([t for t, m in zip(tables, managers) if m.kind != "recurrent"] ==
                            [[0 if b is None else b for b in m.table(seq)] for m in managers if m.kind != "recurrent"])
        e.core.after_step = check
        snaps = {}
        for ev in e.stream_many(demo_requests(6, None), SamplingParams(max_tokens=40, ignore_eos=True), snapshots=True):
            if ev.snapshot is not None:
                snaps[ev.snapshot.step] = ev.snapshot
        events = e.events(base.last_event_seq)
        for step, snap in snaps.items():
            full = replay(events, e.num_blocks, e.config.block_size, until_step=step, base=base)
            frame = group_frame(events, base.groups, full, e.config.block_size, base)
            assert [(g.name, g.block_tables, g.checkpoints, g.free) for g in frame.groups] == \
                   [(g.name, g.block_tables, g.checkpoints, g.free) for g in snap.groups], step
        assert len(snaps) > 30 and len(kept) > 30 and all(kept)
        if "num_blocks" in kw:
            assert snaps[max(snaps)].num_preemptions > base.num_preemptions


def cells(page: str, group: str) -> dict:
    """The drawn tables of one group: {request: [(logical, block or '', state)]}, or for the recurrent group
    {slot: (state, holder, key, or the last slot of a run of free ones)}."""
    part = re.search(rf"data-group='{group}'.*?(?=<div class='kvg-group'|</div></div>$)", page, re.S).group(0)
    if group == "sliding_window":
        rows = {}
        for rid, row in re.findall(r"data-request='([^']+)'[^>]*>(.*?)</div>", part, re.S):
            rows[rid] = [(int(i), b, s) for i, b, s in
                         re.findall(r"data-logical='(\d+)' data-block='(\d*)' data-state='(\w+)'", row)]
        return rows
    return {int(slot): (state, html.unescape(who)) for slot, state, who in
            re.findall(r"data-slot='(\d+)' data-state='(\w+)'(?: data-(?:holder|key|last)='([^']*)')?", part)}


def test_the_sliding_table_drawn_holds_the_windows_exact_blocks(hybrid_checkpoints):
    """One request on a fresh Gemma 3 pool, stepped through: after the step that computed token p, its sliding
    table is None for the blocks before block (p - window + 1) // 16 (they left the window) and the blocks 0, 1, 2, ...
    in the order the free queue gives them after; the full group keeps every block."""
    with make(hybrid_checkpoints["gemma3"]) as e:
        window, bs = e.hf_config.text_config.sliding_window, e.config.block_size
        run = Run(e, owned=False)
        req = Request(prompt="Hello there, please count slowly from one to twenty for me.")
        prompt = len(e.anatomy(req).tokens)
        e.pause()
        handle = e.submit(req, SamplingParams(max_tokens=40, ignore_eos=True))
        seen = 0
        for k in range(39):  # the 40th step finishes it
            e.step()
            start, last = (0, prompt - 1) if k == 0 else (prompt - 1 + k,) * 2  # the tokens this step computed
            first = max(0, start - window + 1) // bs
            expected = [None] * first + list(range(first, last // bs + 1))
            frame = group_frame(run.all_events(), run.base.groups, run.frame(run.all_events(), e.snapshot().step),
                                bs, run.base)
            assert frame.groups[1].block_tables == {req.request_id: expected}, k
            drawn = cells(groups_html(frame, bs, "live"), "sliding_window")[req.request_id]
            assert drawn == [(i, "" if b is None else str(b), "left" if b is None else "held")
                             for i, b in enumerate(expected)]
            seen += expected.count(None)
        e.resume()
        handle.close()
        assert seen > 0 and "✕" in groups_html(frame, bs, "live")


def test_the_recurrent_slots_drawn_are_the_free_queues_and_a_resume_says_its_checkpoint(hybrid_checkpoints):
    """Qwen3.5, 2 requests at most and 4 checkpoints: request 1 runs in slot 0 and its state at the prompt's last
    block boundary is saved in slot 1 (a prompt whose generation prompt lies in its last block and whose end is no
    boundary: one save point, engine/kv_cache/recurrent.py); the same prompt again resumes from slot 1 and runs in
    slot 2 (slot 0 went back to the end of the free queue)."""
    with make(hybrid_checkpoints["qwen3_5"], max_num_seqs=2, state_checkpoints=4) as e:
        bs = e.config.block_size
        for words in range(1, 40):
            req = Request(prompt="Hello there, please count slowly from one to twenty, then tell me a long story."
                          + " again" * words)
            rendered = build_prompt(e.model.family, e.processor, req.to_messages(), None, 4)
            prompt, tail = len(rendered.token_ids), rendered.generation_tokens
            if prompt % bs and (prompt - max(tail, 1)) // bs == (prompt - 1) // bs:
                break
        assert len(e.anatomy(req).tokens) == prompt
        boundary = (prompt - 1) // bs * bs
        tokens = max(1, 15 - prompt % bs)  # its decode reaches no block boundary: no decode checkpoint
        run = Run(e, owned=False)
        shown = []
        for _ in range(2):
            for ev in e.stream(Request(prompt=req.prompt), SamplingParams(max_tokens=tokens, ignore_eos=True)):
                events = run.all_events()
                frame = group_frame(events, run.base.groups, run.frame(events, ev.snapshot.step), bs, run.base)
                shown.append((ev.request_id, frame, groups_html(frame, bs, "live")))
        first, second = shown[0][0], shown[-1][0]
        slots = cells(shown[0][2], "recurrent")
        assert slots == {0: ("running", first), 1: ("checkpoint", slots[1][1]), 2: ("free", "5")}  # 2-5 free
        assert f"the state after {boundary} tokens (end of logical block {boundary // bs - 1}" in shown[0][2]
        resumed = next(s for s in shown if s[0] == second)  # its first step: admitted from the checkpoint
        assert cells(resumed[2], "recurrent")[2] == ("running", second) and resumed[1].resumed == {second: 1}
        assert f"{second} holds slot 2, resumed from the checkpoint in slot 1" in resumed[2]
        assert list(e.snapshot().groups[1].checkpoints.values()) == [1]  # one checkpoint, shared by both


@pytest.mark.parametrize("family", FAMILIES)
def test_the_decision_log_says_the_group_events(family, engines):
    e = engines[family]
    run = Run(e, owned=False)
    e.generate(demo_requests(2, None), SamplingParams(max_tokens=40, ignore_eos=True))
    events = [ev for ev in run.all_events() if ev.seq > run.start_seq]
    log, line = decision_log(events, max_steps=200), run_line(events)
    if family == "gemma3":
        left = sum(len(ev.block_ids) for ev in events if ev.kind == "freed" and ev.fields.get("window"))
        assert "-token window moved on" in log and "filled sliding-window blocks" in log
        assert f"{left} sliding-window blocks left the window" in line and left > 0
        stored = [ev for ev in events if ev.kind == "BlockStored" and not ev.fields.get("group")]
        assert f"{len([b for ev in stored for b in ev.block_ids])} stored" in line  # the full group's alone
    else:
        saved = [ev for ev in events if ev.kind == "state_saved"]
        assert saved and all(f"recurrent state after {ev.token} tokens saved in slot {ev.slot}" in log for ev in saved)
        assert f"{len(saved)} recurrent states checkpointed" in line
    assert "KV 缓存组" in run_line(events, ZH)


def wide_scene() -> Image.Image:
    img = Image.new("RGB", (640, 256), (235, 235, 230))
    draw = ImageDraw.Draw(img)
    draw.ellipse((30, 40, 210, 220), fill=(220, 30, 30))
    draw.rectangle((420, 50, 610, 210), fill=(40, 70, 220))
    return img


def test_anatomy_draws_gemma3s_views_as_its_processor_cuts_them(engines):
    """Off: one 16-token view; on (a 640×256 image): the whole image and 2 crops, each the pixels the tower gets
    (HF's pixel_values, un-normalised) up to resampling, each image token in its view's 4×4 grid."""
    e = engines["gemma3"]
    ip = e.processor.image_processor
    img = wide_scene()
    for pan, n_views in ((0, 1), (1, 3)):
        kw = anatomy.pixels_kwargs(e, pan)
        req = Request(prompt="What is in the picture?", images=[img], mm_processor_kwargs=kw)
        summary, grid, strip, positions, keys = anatomy.render(e, req, [img])
        a = e.anatomy(req)
        info = a.images[0]
        assert info.num_tokens == n_views * e.hf_config.mm_tokens_per_image and a.images_as == "fixed"
        assert f"{n_views} view" in grid.layout.title.text and len(positions.data) == 1
        drawn = views(ip, img, info)
        hf = e.processor(text=e.processor.apply_chat_template(req.to_messages(), add_generation_prompt=True),
                         images=[img], return_tensors="np", **kw)["pixel_values"]
        assert len(drawn) == len(hf) == n_views
        for view, pixels in zip(drawn, hf):
            tower = ((pixels.transpose(1, 2, 0) * 0.5 + 0.5) * 255).clip(0, 255)
            assert np.abs(view.astype(float) - tower).mean() < 12  # the same picture, resampled apart
        tiles = sorted({(t.tile, t.grid_row, t.grid_col) for t in a.tokens if t.type == "image"})
        assert tiles == [(v, r, c) for v in range(n_views) for r in range(4) for c in range(4)]
        assert "Error" not in summary


def test_anatomy_draws_qwen3_5s_patches(engines):
    e = engines["qwen3_5"]
    img = load_image(_example("red_circle.png"))[0]
    req = Request(prompt="What color is the shape?", images=[img], mm_processor_kwargs=anatomy.pixels_kwargs(e, 65536))
    summary, grid, strip, rope, keys = anatomy.render(e, req, [img])
    info = e.anatomy(req).images[0]
    t, h, w = info.grid_thw
    assert info.num_tokens == t * h * w // 4 and len(grid.data[1].x) == info.num_tokens and len(rope.data) == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_the_inspectors_hybrid_preset_fools_key_a_only(family, engines):
    """The served engine is hybrid: the preset runs on it; A hits the prompt's blocks (false), which on a hybrid
    model also restores the recurrent state / the window's blocks, and the answer's logprobs move; B and C miss."""
    e = engines[family]
    engine, made = inspector_hybrid.hybrid_engine(e)
    assert engine is e and not made
    _, first, second, question = inspector_hybrid.PRESET
    out, cold = run_pair(e, ((_example(first), question, None), (_example(second), question, None)), 6)
    a = out["A"][0]
    assert a.num_cached_tokens > 0 and all(h.false_hit for h in a.cache_hits)
    assert max_logprob_diff(a, cold) > ROUNDING
    assert not out["B"][0].cache_hits and not out["C"][0].cache_hits
    assert results_table(out, cold).iloc[0, -1] == "the reused KV was not this request's"
    word = "the recurrent state at token" if family == "qwen3_5" else "the sliding-window blocks before token"
    said = inspector_hybrid.note(e, made, out)
    assert f"Under **A** request 2 hit {len(a.cache_hits)} blocks ({len(a.cache_hits)} false, " \
           f"{a.num_cached_tokens} tokens): their K/V and {word} {a.num_cached_tokens} were computed" in said


def test_the_hybrid_preset_on_a_dense_model_runs_a_random_qwen3_5(engine):
    hybrid, made = inspector_hybrid.hybrid_engine(engine)
    assert made and hybrid.model_type == "qwen3_5" and inspector_hybrid.group_kinds(hybrid) == \
        ["full_attention", "recurrent"]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_shared_visitor_before_a_run_sees_the_groups_as_counts(family, engines):
    """A shared deployment's visitor (no run of their own yet): how many blocks / slots are held, never by whom."""
    e = engines[family]
    e.pause()
    handle = e.submit(demo_requests(1, None)[0], SamplingParams(max_tokens=8, ignore_eos=True))
    try:
        e.step()
        frame = frame_for(None, e, None, totals_only=True)
        page = groups_html(frame, e.config.block_size, "live")
        group = e.snapshot().groups[1]
        said = f"{len(group.block_tables)} running" if family == "qwen3_5" else \
            f"{len({b for t in group.block_tables.values() for b in t if b is not None})} held"
        assert said in page and not said.startswith("0") and "kvg-cell" not in page and \
            handle.request_id not in page
    finally:
        e.resume()
        handle.close()
