"""KV blocks tab: the physical block map, block tables, a timeline and a decision log of the current run, all
derived from the engine's event log (one source, so they cannot disagree), with step-through: Pause, launch
requests or send a chat, then Step one scheduler iteration at a time."""
import os
import tempfile
import time

import gradio as gr

from minivlm import Request, SamplingParams

from panels.access import refusal
from panels import group_views, prefix_tree
from panels.holder import EXAMPLES_DIR, EngineHolder, gpu
from panels.i18n import LANGUAGES, L, lang_of, t
from panels.kv_run import POLL_S, SHARED_LAUNCH_BLOCKS, Runs, live_view, view

LAUNCH_LIMITS = {False: (32, 256), True: (8, 128)}  # shared deployment? -> most requests, most tokens each


# clicking a step on the timeline moves the replay slider there (and so replays it): plotly reports the click in
# the page, where the slider's range input is set as if dragged
TIMELINE_CLICK_JS = """() => {
    const hook = (tries) => {
        const plot = document.querySelector('#kv-timeline .js-plotly-plot');
        if (!plot || !plot.on) { if (tries > 0) setTimeout(() => hook(tries - 1), 200); return; }
        if (plot.dataset.stepHook) return;
        plot.dataset.stepHook = '1';
        plot.on('plotly_click', (d) => {
            const range = document.querySelector('#kv-step input[type=range]');
            if (!range || !d.points.length) return;
            const set = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
            set.call(range, Math.round(d.points[0].x));
            range.dispatchEvent(new Event('input', {bubbles: true}));
            range.dispatchEvent(new Event('change', {bubbles: true}));
            range.dispatchEvent(new PointerEvent('pointerup', {bubbles: true}));
        });
    };
    hook(25);
}"""


# (example scene, a question whose answer decodes for a while, a second question about the same scene)
DEMO = [("three_shapes.png", "Describe the picture.", "Where is the green circle?"),
        ("two_shapes.png", "Describe the picture.", "Where is the purple square?"),
        ("red_circle.png", "Describe the picture.", "What color is the shape?")]


def demo_requests(n: int, salt: str | None, images: bool = True) -> list[Request]:
    """n requests over three example scenes, asking each for a description (the model's answer is 5 to 20
    tokens), then a question about the same picture: equal prompts share every full block, equal images share
    their image blocks. images=False (a text model): the same questions about the scene named in words."""
    reqs = []
    for i in range(n):
        name, describe, other = DEMO[i % 3]
        question = other if (i // 3) % 2 else describe
        if images:
            reqs.append(Request(prompt=question, images=[os.path.join(EXAMPLES_DIR, name)], cache_salt=salt))
        else:
            scene = name.removesuffix(".png").replace("_", " ")
            reqs.append(Request(prompt=f"Imagine a picture of {scene}. {question}", cache_salt=salt))
    return reqs


def build(holder: EngineHolder, switch: gr.Radio | None = None):
    """Lay out the KV tab and wire its events (api names: kv_snapshot, kv_launch, kv_replay, kv_pause, kv_step,
    kv_resume, kv_events); `switch`: the header's language switch (the tab redraws in the chosen language)."""
    runs = Runs(holder)
    launching: set[str] = set()
    most_requests, most_tokens = LAUNCH_LIMITS[holder.shared]
    with gr.Row():
        # off by default on a public deployment, where every open page would poll the engine
        live = gr.Checkbox(not holder.shared, label=L("kv.live"), elem_id="kv-live")
        refresh = gr.Button(L("kv.refresh"), size="sm")
        back = gr.Button(L("kv.back"), size="sm", elem_id="kv-back")
    with gr.Row():
        pause = gr.Button(L("kv.pause"), elem_id="kv-pause")
        step1 = gr.Button(L("kv.step"), variant="primary", elem_id="kv-step1")
        step10 = gr.Button(L("kv.step10"), elem_id="kv-step10")
        resume = gr.Button(L("kv.resume"), elem_id="kv-resume")
    if holder.shared:  # fixed for the deployment: its number is in both languages' text
        shared_note = gr.Markdown(t("en", "kv.shared_note", blocks=SHARED_LAUNCH_BLOCKS), elem_id="kv-shared-note")
    summary = gr.Markdown(elem_id="kv-summary", label=L("kv.summary"))
    with gr.Row():
        block_map = gr.Plot(label=L("kv.map"), elem_id="kv-map", scale=3, min_width=480)  # a phone: full width
        with gr.Column(scale=2):
            gr.Markdown(L("kv.log_heading"))
            decisions = gr.Markdown(elem_id="kv-decisions", label=L("kv.log"), max_height=520, container=True)
    pinned = gr.State(None)  # the replayed step, or None: live

    def groups_view_of(request):  # a hybrid model's groups, of the engine the map shows, at the map's step
        run = runs.get(session_of(request))
        return run, run.engine if run else holder.get(), holder.shared
    group_views.attach(groups_view_of, block_map, pinned)
    # a shared deployment's visitor sees the tree of their own engine only (None before their first run)
    prefix_tree.attach(lambda request: getattr(runs.get(session_of(request)), "engine", None) or
                       (None if holder.shared else holder.get()), block_map)
    with gr.Row():
        n = gr.Slider(1, most_requests, value=8, step=1, label=L("kv.n"), elem_id="kv-n")
        max_tokens = gr.Slider(4, most_tokens, value=48, step=1, label=L("kv.tokens"), elem_id="kv-tokens")
        no_eos = gr.Checkbox(False, label=L("kv.no_eos"), elem_id="kv-no-eos")
        launch = gr.Button(L("kv.launch"), variant="primary", elem_id="kv-launch")
    step = gr.Slider(0, 1, value=0, step=1, label=L("kv.slider"), interactive=False,
                     elem_id="kv-step")
    # the API describes the step as what it is, not by the placeholder range 0-1 (the real one comes with a run)
    step.api_info = lambda: {"type": "number", "description": "an engine step recorded in your current run"}
    timeline = gr.Plot(label=L("kv.timeline"), elem_id="kv-timeline")
    table = gr.Dataframe(label=L("kv.table"), elem_id="kv-table", max_height=360)
    with gr.Row():
        download = gr.Button(L("kv.download"), size="sm", elem_id="kv-download")
        events_file = gr.File(label=L("kv.events_file"), elem_id="kv-events-file", visible=False)
    seen = gr.State(None)    # (engine, last event seq) the page shows, so an idle poll sends nothing
    timer = gr.Timer(POLL_S)

    def session_of(request: gr.Request | None) -> str:
        return request.session_hash if request else ""

    def show(session: str, at=None, paced: bool = False, lang: str = "en"):
        """The tab's outputs for the session (paced: a live frame of a freely running engine, None if too soon)."""
        run = runs.get(session)
        engine = run.engine if run else holder.get()
        seen_now = (id(engine), engine.snapshot().last_event_seq)
        paced = paced and run is not None and not engine.is_paused()
        out = live_view(run, lang) if paced else view(run, engine, at, runs.ended_note(session, lang),
                                                      totals_only=holder.shared, lang=lang)
        return None if out is None else (*out, at, seen_now)

    def poll(is_live, at, shown, request: gr.Request):
        session = session_of(request)
        run = runs.get(session)  # also the watchdog's sign that the page is still open
        if at is not None and run is None and session in runs.ended:  # a replay of an engine since rebuilt
            return show(session, lang=lang_of(request))
        if at is not None or session in launching or not (is_live or run is not None and run.moving(3 * POLL_S)):
            return (gr.skip(),) * 8  # a replayed step stays on screen until Back to live
        engine = run.engine if run else holder.get()
        if shown and shown[0] == id(engine) and not engine.events(since=shown[1]):
            return (gr.skip(),) * 8  # nothing was decided since the page's view
        return show(session, paced=True, lang=lang_of(request)) or (gr.skip(),) * 8

    def refresh_now(request: gr.Request):
        return show(session_of(request), lang=lang_of(request))

    @gpu
    def run_launch(requests, tokens_each, ignore_eos, request: gr.Request):
        if not all(isinstance(v, (int, float)) for v in (requests, tokens_each)) \
                or not (1 <= requests <= most_requests and 4 <= tokens_each <= most_tokens):
            raise refusal(t(lang_of(request), "kv.bad_launch", most=most_requests, tokens=most_tokens,
                            got=f"{requests!r} × {tokens_each!r}"))
        session, lang = session_of(request), lang_of(request)
        run = runs.current(session)
        run.launch(demo_requests(int(requests), holder.salt(session), images=run.engine.family.images != "none"),
                   SamplingParams(max_tokens=int(tokens_each), ignore_eos=bool(ignore_eos)))
        if run.engine.is_paused():
            gr.Info(t(lang, "kv.queued", n=int(requests)))
            yield show(session, lang=lang)
            return
        launching.add(session)  # this generator draws the run; the poll stays out of its way
        try:
            while any(t.is_alive() for t in run.threads) and not run.engine.is_paused():
                time.sleep(POLL_S)
                frame = show(session, paced=True, lang=lang)
                if frame is not None:
                    yield frame
        finally:
            launching.discard(session)
        if runs.get(session) is not run:  # a rebuild ended the launch: say so, and show the new engine
            gr.Warning(runs.ended_note(session, lang) or t(lang, "kv.launch_ended"))
            yield show(session, lang=lang)
            return
        paused = run.engine.is_paused()  # else the run ended: open its replay at its fullest step
        yield show(session, None if paused else run.fullest_step(), lang=lang)

    def do_pause(request: gr.Request):
        session = session_of(request)
        runs.current(session).pause()
        return show(session, lang=lang_of(request))

    def do_step(count: int, request: gr.Request):
        session, lang = session_of(request), lang_of(request)
        run = runs.get(session)
        if run is None or not run.engine.is_paused():
            raise refusal(t(lang, "kv.pause_first"))
        for _ in range(count):
            if not run.engine.has_unfinished():
                gr.Info(t(lang, "kv.nothing_left"))
                break
            run.engine.step()
            run.touched = time.monotonic()
        return show(session, lang=lang)

    @gpu
    def step_once(request: gr.Request):
        return do_step(1, request)

    @gpu
    def step_ten(request: gr.Request):
        return do_step(10, request)

    def do_resume(request: gr.Request):
        session = session_of(request)
        run = runs.get(session)  # any session resumes the engine it sees, whoever paused it
        engine = run.engine if run is not None else holder.get()
        if engine.is_paused():
            engine.resume()
        return show(session, lang=lang_of(request))

    def select(step, request: gr.Request):  # the argument names the API's parameter (it shadows the slider)
        session = session_of(request)
        if runs.get(session) is None:
            raise refusal(t(lang_of(request), "kv.replay_first"))
        return show(session, step, lang=lang_of(request))

    def events_jsonl(request: gr.Request):
        run = runs.get(session_of(request))
        if run is None:
            raise refusal(t(lang_of(request), "kv.download_first"))
        path = os.path.join(tempfile.mkdtemp(prefix="minivlm-events-"), "events.jsonl")
        with open(path, "w") as f:
            f.write(run.engine.events_jsonl(since=run.start_seq))
        return gr.update(value=path, visible=True)

    outs = [block_map, table, summary, timeline, decisions, step, pinned, seen]
    timer.tick(poll, [live, pinned, seen], outs, api_name=False, show_progress="hidden",
               concurrency_id="kv_view", concurrency_limit=4)
    refresh.click(refresh_now, None, outs, api_name="kv_snapshot", concurrency_id="kv_view")
    back.click(refresh_now, None, outs, api_name=False, concurrency_id="kv_view")
    launch.click(run_launch, [n, max_tokens, no_eos], outs, api_name="kv_launch", concurrency_id="kv_launch",
                 concurrency_limit=1, preprocess=False)
    pause.click(do_pause, None, outs, api_name="kv_pause", concurrency_id="kv_control")
    step1.click(step_once, None, outs, api_name="kv_step", concurrency_id="kv_control")
    step10.click(step_ten, None, outs, api_name=False, concurrency_id="kv_control")
    resume.click(do_resume, None, outs, api_name="kv_resume", concurrency_id="kv_control")
    # input: dragging, arrow keys and a typed step all redraw, not only releasing the mouse
    step.input(select, [step], outs, api_name="kv_replay", concurrency_id="kv_view", trigger_mode="always_last")
    timeline.change(None, None, None, js=TIMELINE_CLICK_JS)
    download.click(events_jsonl, None, events_file, api_name="kv_events")
    if switch is not None:  # the chosen language: the tab redraws in it (a replayed step stays where it is)
        def relang(chosen, at, request: gr.Request):
            LANGUAGES.set(request, chosen)
            return show(session_of(request), at, lang=chosen)
        switch.change(relang, [switch, pinned], outs, api_name=False, concurrency_id="kv_view")
        if holder.shared:
            switch.change(lambda chosen: t(chosen, "kv.shared_note", blocks=SHARED_LAUNCH_BLOCKS), switch,
                          shared_note, api_name=False, queue=False)
    return block_map
