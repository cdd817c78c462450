"""A session's run on the KV tab: every event of one engine after the moment the session launched or paused
(replay, timeline, decision log and counters all come from them), launches that drain on threads, pausing with a
watchdog, and on a shared deployment an isolated engine per session."""
import collections
import dataclasses
import threading
import time

import gradio as gr

from minivlm import Request, SamplingParams
from minivlm.views.events import replay, replay_steps

from panels.decisions import decision_log, encoder_line, frame_line, lifetime_line, run_line
from panels.holder import EngineHolder
from panels.i18n import EN, t
from panels.i18n.errors import localize_error
from panels.paged_vs_contiguous import paging_markdown
from panels.plots import block_map_figure, block_table, drafted_blocks
from panels.sessions import collect_before_an_engine
from panels.timeline import timeline_figure

KEPT_RUNS = 8  # sessions whose last run stays replayable (a shared deployment's isolated engines are closed after)
SHARED_LAUNCH_BLOCKS = 96  # a shared deployment's session gets its own pool this small (it still preempts)
PAUSE_TIMEOUT_S = 120  # a paused engine whose page stopped asking (closed, or gone) resumes after this long
SLIDER_LABEL = t(EN, "kv.slider")
POLL_S = 1.0  # the page asks for the live view this often,
RENDER_SHARE = 0.02  # and a run's live redraws may take at most 2 % of the wall time while its engine decodes


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


class Run:
    """One session's run on one engine: every event after the moment it started. Launched requests drain on
    background threads, so a paused engine never blocks the page and a closed page loses no request."""

    def __init__(self, engine, owned: bool, parent=None):
        self.engine, self.owned = engine, owned  # owned: an isolated engine this run closes when dropped
        self.parent = parent or engine  # the holder's engine it was made from
        snap = engine.snapshot()
        idle = not (snap.running or snap.waiting or engine.has_unfinished())
        self.base = snap if idle else None  # an idle pool is a replay base; else replay the whole log
        self.start_seq = snap.last_event_seq
        self.start_step = snap.step  # the frame before the run's first arrival
        self.threads: list[threading.Thread] = []
        self.fetched, self.fetch_lock = [], threading.Lock()  # the events read so far (all_events)
        self.errors: list[Exception] = []  # said in the page's language when shown
        self.aborted = False  # a launched request was cut off
        self.touched = time.monotonic()
        self.settled_at = 0.0  # when its last launch finished draining
        self.redraw = Throttle(RENDER_SHARE, POLL_S)  # paces the live view while the engine runs freely

    def launch(self, requests: list[Request], params: SamplingParams):
        """Submit at once (the engine batches them) and drain on a thread; refused input shows in the summary."""
        stream = self.engine.stream_many(requests, params, snapshots=False)

        def drain():
            try:
                for ev in stream:
                    if ev.finished and ev.output is not None and ev.output.finish_reason == "abort":
                        self.aborted = True  # cut off (a rebuild closed the engine)
            except Exception as e:  # refused input or a failed step: the summary shows it
                self.errors.append(e)
            finally:
                self.settled_at = time.monotonic()
        t = threading.Thread(target=drain, name="kv-launch", daemon=True)
        t.start()
        self.threads.append(t)

    def busy(self) -> bool:
        return self.engine.is_paused() or any(t.is_alive() for t in self.threads)

    def moving(self, grace: float) -> bool:
        """Busy, or settled within `grace` seconds (so a page polling every `grace` s sees how it ended)."""
        return self.busy() or time.monotonic() - self.settled_at < grace

    def all_events(self):
        """The events replay needs: after the base, or the whole log when the run began on a busy engine. Kept
        as fetched, so a poll rebuilds only the events logged since the last one (the log packs its events)."""
        with self.fetch_lock:
            after = self.fetched[-1].seq if self.fetched else self.base.last_event_seq if self.base else 0
            new = self.engine.events(after)
            if new and new[0].seq != after + 1:  # the ring dropped some since the last poll: what it still holds
                self.fetched = self.engine.events(self.base.last_event_seq if self.base else 0)
            else:
                self.fetched = (self.fetched + new)[-self.engine.config.event_log_size:]  # no more than the ring
            return list(self.fetched)

    def frame(self, events, step: int):
        """The KV state after `step`, replayed from events alone."""
        return replay(events, self.engine.num_blocks, self.engine.config.block_size, until_step=step, base=self.base)

    def fullest_step(self) -> int | None:
        """The run's step with the most blocks in use (where a finished run's replay opens)."""
        steps = replay_steps(self.all_events(), self.engine.num_blocks, self.engine.config.block_size, self.base)
        used = {s: sum(b.ref_count > 0 for b in snap.blocks) for s, snap in steps if s > self.start_step}
        return max(used, key=used.get, default=None)

    def pause(self):
        """Pause; a watchdog resumes the engine once nobody has looked at this run for PAUSE_TIMEOUT_S."""
        self.touched = time.monotonic()
        self.engine.pause()

        def watch():
            while self.engine.is_paused():
                if time.monotonic() - self.touched > PAUSE_TIMEOUT_S:
                    self.engine.resume()
                    return
                time.sleep(1.0)
        threading.Thread(target=watch, name="kv-pause-watchdog", daemon=True).start()

    def close(self):
        """Drop the run: an isolated engine is closed (its requests end as aborted); the holder's engine is left
        as it is (another page may have paused it; the watchdog resumes it once nobody looks)."""
        if self.owned:
            self.engine.close()


class Runs:
    """The sessions' runs (the last KEPT_RUNS). On a shared deployment every session steps and launches on an
    isolated engine of its own, never on the engine the other visitors are served by."""

    def __init__(self, holder: EngineHolder):
        self.holder = holder
        self.runs: collections.OrderedDict[str, Run] = collections.OrderedDict()
        self.ended: dict[str, str] = {}  # session -> what of its ended ("launch" or "run"; shown until its next run)
        self.lock = threading.Lock()
        if getattr(holder, "sessions", None) is not None:  # an idle session's run is closed (panels/sessions.py)
            holder.sessions.add(self)

    def get(self, session: str) -> Run | None:
        """The session's run (None when it has none, or its engine was rebuilt since)."""
        with self.lock:
            run = self.runs.get(session)
            stale = run is not None and run.parent is not self.holder.engine
            if stale:
                del self.runs[session]
                self.ended[session] = "launch" if any(t.is_alive() for t in run.threads) or run.aborted else "run"
        if stale:
            run.close()
            return None
        if run is not None:
            run.touched = time.monotonic()
        return run

    def ended_note(self, session: str, lang: str = EN) -> str | None:
        """Why the session's last run is gone (a rebuild ended it), in `lang`; None if it is not."""
        what = self.ended.get(session)
        return None if what is None else t(lang, "kv.ended_by_rebuild", what=t(lang, f"kv.what_{what}"))

    def current(self, session: str) -> Run:
        """The session's run while it is busy (paused or draining); else a new run on the right engine."""
        parent = self.holder.get()
        run = self.get(session)
        if run is not None and run.busy():
            return run
        engine, owned = parent, self.holder.shared
        if owned:  # keep the session's isolated engine (and its prefix cache) across runs
            blocks = min(parent.num_blocks, SHARED_LAUNCH_BLOCKS)  # its encoder cache: at most its pool's tokens
            if run is None:
                collect_before_an_engine()  # the new engine freezes what is alive: no session garbage with it
            engine = run.engine if run is not None else parent.isolated(
                num_blocks=blocks, encoder_cache_size=blocks * parent.config.block_size, vision_cache_bytes=None)
        new = Run(engine, owned, parent)
        with self.lock:
            self.ended.pop(session, None)
            self.runs[session] = new
            self.runs.move_to_end(session)
            evicted = [] if run is None or run.engine is engine else [run]
            while len(self.runs) > KEPT_RUNS:
                evicted.append(self.runs.popitem(last=False)[1])
        for old in evicted:
            old.close()
        return new

    def release_idle(self, idle_s: float) -> int:
        """Close the runs nobody has looked at for idle_s seconds (the page polls while it is open) that have
        stopped moving: a shared deployment's isolated engine goes with its run. Returns how many."""
        now = time.monotonic()
        with self.lock:
            idle = [s for s, run in self.runs.items() if now - run.touched > idle_s and not run.moving(idle_s)]
            dropped = [self.runs.pop(s) for s in idle]
            for session in idle:
                self.ended.pop(session, None)
        for run in dropped:
            run.close()
        return len(dropped)

    def held(self) -> dict[str, int]:
        """The runs kept now, and of them the isolated engines (a shared deployment's)."""
        with self.lock:
            runs = list(self.runs.values())
        return {"kv_runs": len(runs), "isolated_engines": sum(run.owned for run in runs)}


def shared_totals(snap, lang: str = EN) -> str:
    """The shared engine as counts: what a visitor may know of the other visitors' use of it."""
    used = sum(b.ref_count > 0 for b in snap.blocks)
    cached = sum(b.ref_count == 0 and b.cached for b in snap.blocks)
    return t(lang, "kv.shared_totals", running=len(snap.running), waiting=len(snap.waiting), used=used,
             total=snap.num_blocks, cached=cached, blocks=SHARED_LAUNCH_BLOCKS)


def live_view(run: Run, lang: str = EN):
    """view(run, run.engine, None) when the run's throttle allows one now (the engine runs freely), else None."""
    if not run.redraw.ready():
        return None
    t0 = time.thread_time()
    out = view(run, run.engine, None, lang=lang)
    run.redraw.spent(2 * (time.thread_time() - t0))  # gradio then serialises about as much again
    return out


def view(run: Run | None, engine, step: int | None, note: str | None = None, totals_only: bool = False,
         lang: str = EN):
    """The tab's outputs for one moment: live (step=None: the engine now) or the replay of `step` of the run;
    without a run, `note` says why (e.g. a rebuild ended it) and the replay slider is reset; totals_only (a
    shared deployment's visitor before their own run): the shared pool as counts, never its blocks or keys."""
    if run is None:
        snap = engine.snapshot()
        lines = [f"**{note}**"] if note else []
        title = None
        if totals_only:
            lines.append(shared_totals(snap, lang))
            snap = dataclasses.replace(snap, blocks=[], block_tables={}, running=[], waiting=[])
            title = t(lang, "kv.shared_title")
        else:
            lines += [frame_line(snap, t(lang, "kv.live_word"), lang), lifetime_line(snap, lang),
                      encoder_line(engine, lang),
                      paging_markdown(snap, engine.config.max_model_len, lang)]
        if engine.is_paused():
            lines.insert(0, t(lang, "kv.paused_elsewhere"))
        slider = gr.update(minimum=0, maximum=1, value=0, interactive=False, label=t(lang, "kv.slider"))
        return (block_map_figure(snap, title, lang), block_table(snap, lang), "<br>".join(lines),
                timeline_figure([], lang=lang), decision_log([], lang=lang), slider)
    events = run.all_events()
    mine = [e for e in events if e.seq > run.start_seq]
    live = run.engine.snapshot()
    last = max(live.step, run.start_step)
    if step is None:
        snap, shows = live, t(lang, "kv.live_word")
    else:
        try:
            snap = run.frame(events, max(run.start_step, min(int(step), last)))
            shows = t(lang, "kv.replay_word", step=live.step)
        except ValueError as e:  # the ring dropped events this run needs
            snap, shows = live, t(lang, "kv.no_replay", why=e)
    paused = t(lang, "kv.paused_suffix") if run.engine.is_paused() else ""
    summary = "<br>".join([frame_line(snap, shows, lang) + paused, run_line(mine, lang), lifetime_line(live, lang),
                           encoder_line(run.engine, lang),
                           paging_markdown(snap, run.engine.config.max_model_len, lang),
                           *[f"⚠ {localize_error(e, lang)}" for e in run.errors[-3:]]])
    label = t(lang, "kv.slider_run", n=last - run.start_step, first=run.start_step, last=last)
    slider = gr.update(minimum=run.start_step, maximum=max(last, run.start_step + 1), value=snap.step,
                       interactive=True, label=label)
    drafts = drafted_blocks(mine, snap.step, snap.block_size, lang)  # speculation: the step's guessed slots
    return (block_map_figure(snap, lang=lang, drafts=drafts), block_table(snap, lang), summary,
            timeline_figure(mine, snap.step, lang),
            decision_log(mine, until_step=snap.step, lang=lang), slider)
