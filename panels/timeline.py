"""The run's timeline: one row per request, one column per scheduler step, each cell the request's state in that
step (waiting, prefill, decode, idle: in the batch but another request's prefill step ran, preempted, finished),
cache hits marked. Derived from the event log alone, so it
agrees with the replayed block map and the decision log by construction (pure functions, unit-tested)."""
import itertools

import plotly.graph_objects as go

from minivlm.views.events import by_step

from panels.anatomy_figures import TITLE, TOP_MARGIN, needs_width, text_px
from panels.i18n import EN, t
from panels.plots import natural_key

STATE_COLORS = {"waiting": "#f2c14e", "prefill": "#2e86de", "decode": "#27ae60", "idle": "#a9dfbf",
               "preempted": "#e74c3c", "finished": "#7f8c8d"}
STATES = list(STATE_COLORS)
PREEMPTED_MARK = dict(symbol="square", size=10, color=STATE_COLORS["preempted"], line=dict(width=1.5, color="black"))


def step_tick(span: int) -> int:
    """Distance between the step axis' ticks: whole steps, at most ~12 ticks (1, 2, 5, 10, 20, 50, ...)."""
    return next(t for t in (m * 10 ** e for e in itertools.count() for m in (1, 2, 5)) if span / t <= 12)


def request_states(events) -> dict[str, dict[int, str]]:
    """request -> {step: state} from the step it arrived in to the step it finished (or the log's last step).
    A step's scheduled kind names what the request ran; in a "mixed" step (chunked prefill) a request computing more
    than one token ran a prefill chunk, the others decoded. A request that holds blocks but did not run in a step
    (a prefill step of others) is "idle" there."""
    states: dict[str, dict[int, str]] = {}
    queued: dict[str, str] = {}  # arrived, not finished -> "waiting" or "idle" (admitted: it holds blocks)
    for step, evs in by_step(events).items():
        for ev in evs:
            rid = ev.request_id
            if ev.kind == "arrived":
                states.setdefault(rid, {})
                queued[rid] = "waiting"
            elif ev.kind == "cache_lookup":
                queued[rid] = "idle"
            elif ev.kind == "scheduled":
                tokens = ev.fields.get("num_scheduled_tokens", {})
                for r in ev.request_ids:
                    kind = ev.step_kind if ev.step_kind != "mixed" else "prefill" if tokens[r] > 1 else "decode"
                    states.setdefault(r, {})[step] = kind
            elif ev.kind in ("preempted", "finished") and rid is not None:
                states.setdefault(rid, {})[step] = ev.kind
                if ev.kind == "finished":
                    queued.pop(rid, None)
                else:
                    queued[rid] = "waiting"
        for rid, state in queued.items():
            states[rid].setdefault(step, state)
    return states


def cache_hits(events) -> dict[tuple[str, int], tuple[int, int]]:
    """(request, step) -> (blocks reused from the prefix cache, of which false hits)."""
    return {(ev.request_id, ev.step): (len(ev.hits), sum(h.false_hit for h in ev.hits))
            for ev in events if ev.kind == "cache_lookup" and ev.hits}


def timeline_figure(events, selected_step: int | None = None, lang: str = EN) -> go.Figure:
    """Requests × steps heatmap of the run; ★ = blocks reused from the cache (✕ = some were false hits);
    a line marks `selected_step`."""
    states = request_states(events)
    rows = sorted(states, key=natural_key)
    steps = sorted({s for per in states.values() for s in per}) or [0]
    first, last = steps[0], steps[-1]
    xs = list(range(first, last + 1))
    z = [[STATES.index(states[r][s]) if s in states[r] else None for s in xs] for r in rows]
    text = [[t(lang, "timeline.cell", rid=r, step=s, state=t(lang, f"state.{states[r][s]}")) if s in states[r] else ""
             for s in xs] for r in rows]
    k = len(STATES)
    scale = [[v, STATE_COLORS[name]] for i, name in enumerate(STATES) for v in (i / k, (i + 1) / k)]
    fig = go.Figure(go.Heatmap(x=xs, y=rows, z=z, text=text, hovertemplate="%{text}<extra></extra>",
                               colorscale=scale, zmin=-0.5, zmax=k - 0.5, showscale=False,
                               xgap=1 if len(xs) <= 100 else 0, ygap=2, name="states"))
    # a preemption is one step: a marker of fixed size keeps it visible when a long run's steps are 1-2 px wide
    lost = [(s, r) for r in rows for s, state in states[r].items() if state == "preempted"]
    fig.add_trace(go.Scatter(x=[s for s, _ in lost], y=[r for _, r in lost], mode="markers",
                             name=t(lang, "state.preempted"), marker=PREEMPTED_MARK,
                             hovertemplate=t(lang, "timeline.preempted_hover") + "<extra></extra>"))
    hits = cache_hits(events)
    for false, symbol, name in ((False, "star", t(lang, "timeline.hit")), (True, "x", t(lang, "timeline.false_hit"))):
        marks = [(s, r, t(lang, "timeline.hit_hover", rid=r, n=n, step=s) + (t(lang, "timeline.false_suffix", n=f)
                                                                              if f else ""))
                 for (r, s), (n, f) in hits.items() if (f > 0) == false and r in states]
        fig.add_trace(go.Scatter(x=[m[0] for m in marks], y=[m[1] for m in marks], text=[m[2] for m in marks],
                                 mode="markers", name=name, hovertemplate="%{text}<extra></extra>",
                                 marker=dict(symbol=symbol, size=11, color="white", line=dict(width=1.5,
                                                                                             color="black"))))
    for name in (s for s in STATES if s != "preempted"):  # the heatmap's colours (preempted: its marker above)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=t(lang, f"state.{name}"),
                                 marker=dict(symbol="square", size=12, color=STATE_COLORS[name])))
    if selected_step is not None:
        fig.add_vline(x=selected_step, line=dict(color="gray", width=2, dash="dot"))
    fig.update_layout(
        title=dict(TITLE, text=t(lang, "timeline.title", n=len(rows), first=first, last=last) + (
            t(lang, "timeline.showing", step=selected_step) if selected_step is not None else ""), x=0.01,
            xanchor="left"),
        height=max(220, TOP_MARGIN + 60 + 26 * len(rows)), margin=dict(l=10, r=10, t=TOP_MARGIN, b=30),
        # right of the plot, one entry a line: it never runs into the title or the step axis however narrow
        legend=dict(traceorder="normal"),
        meta={"steps": [first, last], "requests": rows},
        xaxis=dict(title=t(lang, "timeline.axis"), range=[first - 0.5, last + 0.5], tick0=0, dtick=step_tick(last - first),
                   tickformat="d"),
        yaxis=dict(autorange="reversed", type="category"))
    # as wide as its step numbers apart (12 px digits, 14 px between), the request names and the legend beside
    ticks = (last - first) // step_tick(last - first) + 1
    names = max((text_px(tr.name or "", 12) for tr in fig.data[1:]), default=0)
    return needs_width(fig, ticks * (text_px(str(last), 12) + 14) + max(map(len, rows), default=4) * 8 + names + 60)
