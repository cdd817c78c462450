"""KV blocks tab: the physical block map and block tables, live while requests decode; a launcher for N concurrent
requests (continuous batching, preemption) whose every step is recorded and replayed with a slider."""
import collections
import os
import time

import gradio as gr

from minivlm import Request, SamplingParams

from panels.access import refusal
from panels.chat import EXAMPLES
from panels.holder import EXAMPLES_DIR, EngineHolder, gpu
from panels import prefix_tree
from panels.paged_vs_contiguous import paging_markdown
from panels.plots import block_map_figure, block_table, snapshot_summary

RENDER_SHARE = 0.02  # live rendering may take at most 2 % of wall time while the engine decodes,
LIVE_INTERVAL = 0.5  # and happens at most twice a second (the replay shows every step afterwards)
KEPT_TIMELINES = 8   # sessions whose last run stays replayable
LAUNCH_LIMITS = {False: (32, 256), True: (8, 128)}  # shared deployment? -> most requests, most tokens each
SHARED_LAUNCH_BLOCKS = 96  # a shared deployment's launcher gets its own pool this small (it still preempts)


def render(snap, max_model_len: int | None = None):
    """A snapshot as the tab's three outputs (with max_model_len the summary adds paged vs contiguous)."""
    paging = "<br>" + paging_markdown(snap, max_model_len) if max_model_len else ""
    return block_map_figure(snap), block_table(snap), snapshot_summary(snap) + paging


class Throttle:
    """Lets work through only while the time it takes stays under `share` of the wall time (and at most once per
    `min_interval` seconds)."""

    def __init__(self, share: float, min_interval: float = 0.0):
        self.share, self.min_interval = share, min_interval
        self.next_at = time.perf_counter() + min_interval  # a run shorter than that needs no live frames

    def ready(self) -> bool:
        return time.perf_counter() >= self.next_at

    def spent(self, seconds: float):
        self.next_at = time.perf_counter() + max(self.min_interval, seconds / self.share)


def demo_requests(n: int, salt: str | None) -> list[Request]:
    """n requests over three example scenes, asking each its own question, then how many shapes there are:
    equal prompts share every full block, equal images share their image blocks."""
    reqs = []
    for i in range(n):
        name, question = EXAMPLES[i % 3]
        if (i // 3) % 2:
            question = "How many shapes are there?"
        reqs.append(Request(prompt=question, images=[os.path.join(EXAMPLES_DIR, name)], cache_salt=salt))
    return reqs


def record_run(engine, requests, params, renderer: Throttle, snapshots: bool = True):
    """Submit all requests at once (the engine batches them) and collect the KV snapshot of every step.
    Yields ("live", snapshot) whenever `renderer` allows a render, then ("done", timeline, errors);
    snapshots=False runs the same requests the same way without any (the baseline for the panel's cost).
    All events arrive on one queue in step order, so no thread wakes up per request per token."""
    timeline, errors = {}, []
    events = engine.stream_many(requests, params, snapshots=snapshots)
    try:
        for ev in events:
            snap = ev.snapshot
            if snap is None or snap.step in timeline:
                continue
            timeline[snap.step] = snap
            if renderer.ready():
                yield "live", snap
    except Exception as e:  # refused input (ValueError) or a failed step
        errors.append(str(e))
    finally:
        events.close()  # aborts what still runs if the page went away mid-run
    yield "done", [timeline[k] for k in sorted(timeline)], errors


def build(holder: EngineHolder):
    """Lay out the KV tab and wire its events (api names: kv_snapshot, kv_launch, kv_replay)."""
    timelines: collections.OrderedDict[str, list] = collections.OrderedDict()
    launching: set[str] = set()
    with gr.Row():
        # off by default on a public deployment, where every open page would poll the engine
        live = gr.Checkbox(not holder.shared, label="Live (poll the engine once a second)", elem_id="kv-live")
        refresh = gr.Button("Refresh now", size="sm")
    summary = gr.Markdown(elem_id="kv-summary", label="summary")
    block_map = gr.Plot(label="Physical KV blocks", elem_id="kv-map")
    most_requests, most_tokens = LAUNCH_LIMITS[holder.shared]
    if holder.shared:
        gr.Markdown(f"Shared deployment: your launch runs on its own {SHARED_LAUNCH_BLOCKS}-block pool (the weights "
                    f"are shared, the other visitors' requests and cache are not), at most {most_requests} requests.")
    prefix_tree.attach(holder, block_map)
    with gr.Row():
        n = gr.Slider(1, most_requests, value=8, step=1, label="concurrent requests", elem_id="kv-n")
        max_tokens = gr.Slider(4, most_tokens, value=48, step=1, label="tokens each (EOS ignored)",
                               elem_id="kv-tokens")
        launch = gr.Button("Launch N requests", variant="primary", elem_id="kv-launch")
    step = gr.Slider(0, 1, value=0, step=1, label="replay step (after a run)", interactive=False, elem_id="kv-step")
    # the API describes the step as what it is, not by the placeholder range 0-1 (the real one comes with a run)
    step.api_info = lambda: {"type": "number", "description": "an engine step recorded in your last launch"}
    table = gr.Dataframe(label="Block tables: logical index → physical block", elem_id="kv-table", max_height=360)
    last_step = gr.State(-1)
    timer = gr.Timer(1.0)

    def current():
        snap = holder.get().snapshot()
        return (*render(snap, holder.config.max_model_len), snap.step)

    def poll(is_live, seen, request: gr.Request):
        if not is_live or (request and request.session_hash in launching):
            return gr.skip(), gr.skip(), gr.skip(), seen
        snap = holder.get().snapshot()
        if snap.step == seen:
            return gr.skip(), gr.skip(), gr.skip(), seen
        return (*render(snap, holder.config.max_model_len), snap.step)

    @gpu
    def run(requests, tokens_each, request: gr.Request):
        if not all(isinstance(v, (int, float)) for v in (requests, tokens_each)) \
                or not (1 <= requests <= most_requests and 4 <= tokens_each <= most_tokens):
            raise refusal(f"The launcher runs 1 to {most_requests} requests of 4 to {most_tokens} tokens each here; "
                          f"got {requests!r} × {tokens_each!r}.")
        session = request.session_hash if request else ""
        throttle = Throttle(RENDER_SHARE, LIVE_INTERVAL)
        # shared: a pool of its own, so one visitor's launch can neither fill nor preempt the others'
        engine = holder.get()
        if holder.shared:
            engine = engine.isolated(num_blocks=min(engine.num_blocks, SHARED_LAUNCH_BLOCKS))
        batch = demo_requests(int(requests), holder.salt(session))
        params = SamplingParams(max_tokens=int(tokens_each), ignore_eos=True)
        preempted_before = engine.snapshot().num_preemptions  # the engine's counter covers its whole life
        launching.add(session)
        try:
            for kind, *data in record_run(engine, batch, params, throttle):
                if kind == "live":
                    t0 = time.thread_time()
                    frame = render(data[0], holder.config.max_model_len)
                    throttle.spent(time.thread_time() - t0)
                    yield *frame, gr.skip(), data[0].step
        finally:
            launching.discard(session)
            if holder.shared:
                engine.close()
        timeline, errors = data
        for e in errors:
            gr.Warning(e)
        if not timeline:
            yield *render(holder.get().snapshot(), holder.config.max_model_len), gr.skip(), -1
            return
        timelines[session] = timeline
        timelines.move_to_end(session)
        while len(timelines) > KEPT_TIMELINES:
            timelines.popitem(last=False)
        busiest = max(timeline, key=lambda s: sum(b.ref_count > 0 for b in s.blocks))
        slider = gr.Slider(timeline[0].step, timeline[-1].step, value=busiest.step, step=1, interactive=True,
                           label=f"replay step ({len(timeline)} steps recorded, "
                                 f"{timeline[-1].num_preemptions - preempted_before} preemptions; "
                                 f"showing the fullest step)")
        # last_step = the engine's step now: live polling redraws only once the engine moves on, not over the replay
        yield *render(busiest, holder.config.max_model_len), slider, holder.get().snapshot().step

    def replay(step, request: gr.Request):  # the argument names the API's parameter (it shadows the slider)
        timeline = timelines.get(request.session_hash if request else "", [])
        if not timeline:
            raise refusal("Launch a run first: replay shows the steps of your last run.")
        snap = next((s for s in reversed(timeline) if s.step <= step), timeline[0])
        return render(snap, holder.config.max_model_len)

    outs = [block_map, table, summary]
    timer.tick(poll, [live, last_step], outs + [last_step], api_name=False, show_progress="hidden",
               concurrency_id="kv_view", concurrency_limit=4)
    refresh.click(current, None, outs + [last_step], api_name="kv_snapshot", concurrency_id="kv_view")
    # preprocess=False: the bounds are checked by `run`, with its own message and no traceback in the log
    launch.click(run, [n, max_tokens], outs + [step, last_step], api_name="kv_launch", concurrency_id="kv_launch",
                 concurrency_limit=1, preprocess=False)
    # input: dragging, arrow keys and a typed step (Enter) all redraw, not only releasing the mouse
    step.input(replay, [step], outs, api_name="kv_replay", concurrency_id="kv_view", trigger_mode="always_last")
    return block_map
