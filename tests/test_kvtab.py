"""The KV tab's timeline, decision log and counters, against a real engine run with sharing and preemption: each
is checked against what the engine itself reported (its per-step snapshots and its outputs), not against the
events they were derived from."""
import pytest

from minivlm import Engine, EngineConfig, SamplingParams
from minivlm.views.events import by_step, replay

from panels.decisions import decision_log, run_counters, run_line
from panels.kv_blocks import demo_requests
from panels.kv_run import Run, view
from panels.timeline import STATE_COLORS, STATES, request_states, timeline_figure

N = 8


@pytest.fixture(scope="module")
def recorded(engine):
    """One run: (events, base snapshot, {step: snapshot the engine sent}, {request: (finish step, Output)})."""
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    engine.generate(demo_requests(1, None), params)  # cached prompt blocks: equal prompts then hit them
    base = engine.snapshot()
    snaps, finished = {}, {}
    for ev in engine.stream_many(demo_requests(N, None), params, snapshots=True):
        if ev.snapshot is not None:
            snaps[ev.snapshot.step] = ev.snapshot
        if ev.finished:
            finished[ev.request_id] = (max(snaps), ev.output)
    return engine.events(since=base.last_event_seq), base, snaps, finished


def test_states_follow_the_engines_snapshots(recorded):
    events, base, snaps, finished = recorded
    states = request_states(events)
    assert set(states) == set(finished) and len(states) == N
    for step, snap in snaps.items():
        for rid in snap.running:
            assert states[rid][step] in ("prefill", "decode", "idle"), (rid, step)
        for rid in snap.waiting:
            assert states[rid][step] in ("waiting", "preempted"), (rid, step)
    for rid, (step, output) in finished.items():
        assert states[rid][step] == "finished" and max(states[rid]) == step
        ran = sum(s in ("prefill", "decode") for s in states[rid].values()) + 1  # the finishing step ran too
        assert ran >= len(output.token_ids)  # each run step samples one token (a preempted request's recompute more)
    preempted = sum(s == "preempted" for per in states.values() for s in per.values())
    assert preempted == snaps[max(snaps)].num_preemptions - base.num_preemptions > 0


def test_timeline_cells_and_hit_marks(recorded):
    events, _, _, finished = recorded
    fig = timeline_figure(events, selected_step=max(by_step(events)))
    heat = fig.data[0]
    states = request_states(events)
    assert list(heat.y) == sorted(states, key=lambda r: int(r.rsplit("-", 1)[1]))
    for row, rid in zip(heat.z, heat.y):
        for x, v in zip(heat.x, row):
            if v is None:
                assert x not in states[rid]
            else:
                assert STATES[v] == states[rid][x]
                assert heat.colorscale[2 * v][1] == STATE_COLORS[STATES[v]]
    stars = next(t for t in fig.data if t.name == "cache hit")
    hit_requests = {rid for rid, (_, out) in finished.items() if out.num_cached_tokens > 0}
    assert set(stars.y) == hit_requests != set()  # requests the outputs say reused cached blocks
    assert len(fig.layout.shapes) == 1  # the selected step's line



def test_timeline_marks_every_preemption_and_ticks_whole_steps(recorded):
    """#24 item 13: each preemption the engine counted is a marker of fixed pixel size on its cell (seen even when a
    long run's steps are 1-2 px wide); the step axis ticks whole steps only, at most ~12, on a 2-step run as on
    the whole one."""
    events, base, snaps, _ = recorded
    fig = timeline_figure(events)
    mark = next(t for t in fig.data if t.name == "preempted")
    assert len(mark.x) == snaps[max(snaps)].num_preemptions - base.num_preemptions > 0  # the engine's own count
    states = request_states(events)
    assert all(states[r][s] == "preempted" for s, r in zip(mark.x, mark.y)) and mark.marker.size >= 8
    first_two = sorted(by_step(events))[:2]
    for shown in ([e for e in events if e.step in first_two], events):
        axis = timeline_figure(shown).layout.xaxis
        lo, hi = axis.range
        assert axis.tickformat == "d" and axis.dtick >= 1 and float(axis.dtick).is_integer() and axis.tick0 == 0
        assert (hi - lo) / axis.dtick <= 13

def test_decision_log_and_counters(recorded):
    events, base, snaps, finished = recorded
    steps = sorted(by_step(events))
    log = decision_log(events, max_steps=len(steps))
    heads = [line for line in log.splitlines() if line.startswith("- **step ")]
    assert [int(line.split("**step ")[1].split("**")[0]) for line in heads] == steps[::-1]
    preemptions = [e for e in events if e.kind == "preempted"]
    for ev in preemptions:  # the victim, named with the reason, under its own step
        line = f"    - {ev.request_id} preempted: {ev.reason}"
        assert line in log and log.index(line) > log.index(f"- **step {ev.step}** ·")
    for ev in (e for e in events if e.kind == "BlockStored"):
        assert f"{ev.block_ids[0]}" in log and f"{ev.block_hashes[0][:8]}…" in log
    assert sum(line.startswith("- **step") for line in decision_log(events, until_step=steps[4]).splitlines()) == 5
    assert decision_log(events, max_steps=3).splitlines()[-1].startswith(f"- _… {len(steps) - 3} earlier")
    c = run_counters(events)
    assert c["arrived"] == c["finished"] == N
    assert c["preempted"] == snaps[max(snaps)].num_preemptions - base.num_preemptions
    blocks_hit = sum(len(out.cache_hits) for _, out in finished.values())
    assert c["blocks reused"] >= blocks_hit > 0  # a recomputed request looks its prefix up again
    assert "This run" in run_line(events) and f"{c['preempted']} preemptions" in run_line(events)


def test_run_view_replays_the_steps_the_engine_showed(engine):
    run = Run(engine, owned=False)
    assert run.base is not None  # the engine is idle between tests
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    snaps = {}
    for ev in engine.stream_many(demo_requests(6, None), params, snapshots=True):
        if ev.snapshot is not None:
            snaps[ev.snapshot.step] = ev.snapshot
    events = run.all_events()
    first = run.frame(events, run.start_step)
    assert first.step == run.start_step and not first.running and not first.waiting  # before the first arrival
    for step, snap in snaps.items():
        frame = run.frame(events, step)
        assert frame.block_tables == snap.block_tables and \
            [(b.ref_count, b.num_tokens) for b in frame.blocks] == [(b.ref_count, b.num_tokens) for b in snap.blocks]
    fig, table, summary, timeline, log, _ = view(run, engine, min(snaps))
    assert f"**step {min(snaps)}** · **replay** (live is at step {engine.snapshot().step}" in summary
    assert "This run" in summary
    assert "Engine lifetime" in summary
    assert sum(line.startswith("- **step") for line in log.splitlines()) == min(snaps) - run.start_step


def test_a_run_fetches_its_events_incrementally_and_equal_to_the_log(engine):
    """The log packs its events, so a run keeps what it fetched and reads only what is new at each poll: the result
    equals one read of the whole log, and after the ring dropped events it is what the ring still holds."""
    run = Run(engine, owned=False)
    sizes = []
    for _ in engine.stream_many(demo_requests(4, None), SamplingParams(max_tokens=12, ignore_eos=True)):
        sizes.append(len(run.all_events()))  # a poll while the run goes on
    fetched = run.all_events()
    assert sizes == sorted(sizes) and 0 < sizes[0] < len(fetched)
    assert [e.to_dict() for e in fetched] == [e.to_dict() for e in engine.events(run.base.last_event_seq)]
    with engine.isolated(event_log_size=40) as small:
        run = Run(small, owned=False)
        small.generate(demo_requests(1, None), SamplingParams(max_tokens=2))
        assert run.all_events()[0].seq == run.base.last_event_seq + 1
        small.generate(demo_requests(3, None), SamplingParams(max_tokens=20, ignore_eos=True))  # > 40 events
        assert [e.seq for e in run.all_events()] == [e.seq for e in small.events()] and small.events_dropped
        with pytest.raises(ValueError, match="events were dropped"):
            run.frame(run.all_events(), small.snapshot().step)


def test_shared_step_through_pauses_only_an_isolated_engine(checkpoints, monkeypatch):
    """On a shared deployment a session's Pause/Step/launch act on its own engine; requests launched while paused
    all finish; a paused engine nobody looks at resumes by itself."""
    import time
    import panels.kv_run as kv
    from panels.holder import EngineHolder
    holder = EngineHolder(EngineConfig(model=checkpoints["qwen3_vl"], device="cpu", dtype="float32", num_blocks=200,
                                       max_model_len=512), shared=True)
    served = holder.get()
    runs = kv.Runs(holder)
    run = runs.current("teacher")
    run.pause()
    assert run.engine is not served and run.engine.num_blocks == kv.SHARED_LAUNCH_BLOCKS
    assert run.engine.loop.is_paused() and not served.loop.is_paused()
    assert served.generate(demo_requests(1, None), SamplingParams(max_tokens=2))[0].token_ids  # others served
    run.launch(demo_requests(3, holder.salt("teacher")), SamplingParams(max_tokens=6, ignore_eos=True))
    while not run.engine.has_unfinished():
        time.sleep(0.05)
    for _ in range(3):
        run.engine.step()
    assert run.engine.snapshot().step == run.start_step + 3 and runs.current("teacher") is run  # still busy
    monkeypatch.setattr(kv, "PAUSE_TIMEOUT_S", 0.5)
    run.touched = time.monotonic() - 1  # the page went away: the watchdog resumes within its 1 s check
    deadline = time.monotonic() + 30
    while run.busy() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not run.engine.loop.is_paused()
    counts = run_counters([e for e in run.all_events() if e.seq > run.start_seq])
    assert counts["arrived"] == counts["finished"] == 3 and not run.errors  # pausing lost nothing
    again = runs.current("teacher")  # a new run keeps the session's isolated engine (and its cache)
    assert again is not run and again.engine is run.engine and again.base is not None
    holder.get().close()
    run.engine.close()


def test_chunked_prefill_steps_show_chunks_and_decodes(checkpoints):
    """With chunked prefill a long prompt is computed in chunks while the others decode in the same (mixed) step:
    the timeline shows each request's own part, and the counters count mixed steps."""
    config = EngineConfig(model=checkpoints["qwen3_vl"], device="cpu", dtype="float32", num_blocks=120,
                          max_model_len=512, enable_chunked_prefill=True, max_num_batched_tokens=40)
    with Engine(config) as engine:
        list(engine.stream_many(demo_requests(3, None), SamplingParams(max_tokens=12, ignore_eos=True),
                                snapshots=False))
        events = engine.events()
    mixed = [e for e in events if e.kind == "scheduled" and e.step_kind == "mixed"]
    assert mixed, "a 40-token budget must chunk ~80-token prompts next to decodes"
    states = request_states(events)
    for ev in mixed:
        for rid, n in ev.num_scheduled_tokens.items():
            assert states[rid][ev.step] in (("prefill",) if n > 1 else ("decode", "finished")), (rid, ev.step, n)
    c = run_counters(events)
    assert c["mixed steps"] == len(mixed) and f", {len(mixed)} mixed)" in run_line(events)


# the README's step-through lesson quotes these decisions of the shipped model's run (16 blocks, six requests)
LESSON = [(1, "prefill 3 request(s), 225 token(s)"), (1, "req-2 got blocks 10, 11, 12, 13, 14, 15"),
          (6, "req-2 finished (stop)"), (7, "req-3 reused 3 cached block(s) (48 tokens)"),
          (7, "req-3 got blocks 15, 14"), (7, "prefill 2 request(s), 50 token(s)"),
          (10, "req-5 reused 2 cached block(s) (32 tokens)"),
          (11, "req-5 preempted: req-0 needs a block for its next token; none is free; preempting the newest running "
               "request, req-5, releasing its 6 blocks (6 become free); its 83 tokens will be recomputed"),
          (17, "req-5 reused 4 cached block(s) (64 tokens)"), (17, "prefill 1 request(s), 19 token(s)")]


# the same lesson in Chinese (docs/zh-CN/LESSON.md): the same decisions in the Chinese decision log's words, and
# the same facts about step 6 and the run line
LESSONS = {"README.md": ("en", "the five full ones turn blue-grey", "turns light grey (plain free)"),
           "docs/zh-CN/LESSON.md": ("zh-CN", "五个满块变成蓝灰色", "变成浅灰色（普通空闲）")}


@pytest.mark.parametrize("doc", sorted(LESSONS, reverse=True))
def test_readme_step_through_lesson_is_what_the_engine_decides(doc):
    """The lesson's numbers come from this run (in a fresh app its requests are req-0 ... req-5) and the README
    says them (and docs/zh-CN/LESSON.md says them in the Chinese page's words)."""
    import os
    import re
    from minivlm.views.events import describe
    from panels.i18n.events import describe_in
    lang, blue_grey, light_grey = LESSONS[doc]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, doc), encoding="utf-8") as f:
        readme = " ".join(f.read().split())
        readme = re.sub(r"(?<=[\u3000-\u9fff\uff00-\uffef]) (?=[\u3000-\u9fff\uff00-\uffef])", "", readme) \
            if lang != "en" else readme  # a Chinese line break is no space
    config = EngineConfig(model=os.path.join(root, "assets", "tiny-qwen-vl"), device="cpu", num_blocks=16)
    with Engine(config) as engine:
        outs = engine.generate(demo_requests(6, None), SamplingParams(max_tokens=48))
        events = engine.events(0)
    names = {o.request_id: f"req-{i}" for i, o in enumerate(outs)}  # ids count up across the process's engines
    rename = lambda text: re.sub(r"\breq-\d+\b", lambda m: names[m.group()], text)  # noqa: E731
    said = {(ev.step, rename(describe(ev))): rename(describe_in(ev, lang)) for ev in events}
    for step, text in LESSON:
        assert (step, text) in said, (step, text)
        assert said[step, text] in readme, said[step, text]
    assert [o.finish_reason for o in outs] == ["stop"] * 6 and 14 <= len(outs[0].token_ids) <= 20  # no forced EOS
    # step 6: req-2's six blocks are free, the five full ones still cached (blue-grey), the partial one plain free
    req2 = next(o.request_id for o in outs if names[o.request_id] == "req-2")
    held = replay(events, 16, 16, until_step=5).block_tables[req2]
    after = {b.block_id: b for b in replay(events, 16, 16, until_step=6).blocks}
    assert len(held) == 6 and all(after[i].ref_count == 0 for i in held)
    assert [after[i].cached for i in held] == [True] * 5 + [False]
    assert blue_grey in readme and light_grey in readme
    line = run_line(events, lang).replace("**", "")
    quoted = {"en": "6 requests arrived, 6 finished · 23 steps (4 prefill, 19 decode) · 1 preemptions",
              "zh-CN": "到达 6 个请求，完成 6 个 · 23 步（预填充 4，解码 19）· 抢占 1 次"}[lang]
    assert quoted in line
    assert quoted in readme if lang != "en" else "23 steps (4 prefill, 19 decode)" in readme
