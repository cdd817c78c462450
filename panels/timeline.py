"""The run's timeline: one row per request, one column per scheduler step, each cell the request's state in that
step (waiting, prefill, decode, idle: in the batch but another request's prefill step ran, preempted, finished),
cache hits marked. Derived from the event log alone, so it
agrees with the replayed block map and the decision log by construction (pure functions, unit-tested)."""
import plotly.graph_objects as go

from minivlm.events import by_step

STATE_COLORS = {"waiting": "#f2c14e", "prefill": "#2e86de", "decode": "#27ae60", "idle": "#a9dfbf",
               "preempted": "#e74c3c", "finished": "#7f8c8d"}
STATES = list(STATE_COLORS)


def natural_key(request_id: str):
    """req-2 before req-10."""
    head, _, tail = request_id.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (request_id, -1)


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


def timeline_figure(events, selected_step: int | None = None) -> go.Figure:
    """Requests × steps heatmap of the run; ★ = blocks reused from the cache (✕ = some were false hits);
    a line marks `selected_step`."""
    states = request_states(events)
    rows = sorted(states, key=natural_key)
    steps = sorted({s for per in states.values() for s in per}) or [0]
    first, last = steps[0], steps[-1]
    xs = list(range(first, last + 1))
    z = [[STATES.index(states[r][s]) if s in states[r] else None for s in xs] for r in rows]
    text = [[f"{r} · step {s}: {states[r][s]}" if s in states[r] else "" for s in xs] for r in rows]
    k = len(STATES)
    scale = [[v, STATE_COLORS[name]] for i, name in enumerate(STATES) for v in (i / k, (i + 1) / k)]
    fig = go.Figure(go.Heatmap(x=xs, y=rows, z=z, text=text, hovertemplate="%{text}<extra></extra>",
                               colorscale=scale, zmin=-0.5, zmax=k - 0.5, showscale=False, xgap=1, ygap=2,
                               name="states"))
    hits = cache_hits(events)
    for false, symbol, name in ((False, "star", "cache hit"), (True, "x", "false cache hit")):
        marks = [(s, r, f"{r} reused {n} cached block(s) at step {s}" + (f", {f} FALSE" if f else ""))
                 for (r, s), (n, f) in hits.items() if (f > 0) == false and r in states]
        fig.add_trace(go.Scatter(x=[m[0] for m in marks], y=[m[1] for m in marks], text=[m[2] for m in marks],
                                 mode="markers", name=name, hovertemplate="%{text}<extra></extra>",
                                 marker=dict(symbol=symbol, size=11, color="white", line=dict(width=1.5,
                                                                                             color="black"))))
    for name in STATES:  # legend entries for the heatmap's colours
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=12, color=STATE_COLORS[name])))
    if selected_step is not None:
        fig.add_vline(x=selected_step, line=dict(color="black", width=2, dash="dot"))
    fig.update_layout(
        title=dict(text=f"{len(rows)} request(s) × steps {first}–{last}" + (
            f" · showing step {selected_step}" if selected_step is not None else ""), x=0.01, xanchor="left"),
        height=max(220, 120 + 26 * len(rows)), margin=dict(l=10, r=10, t=60, b=30), plot_bgcolor="white",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1),
        meta={"steps": [first, last], "requests": rows},
        xaxis=dict(title="scheduler step", range=[first - 0.5, last + 0.5]),
        yaxis=dict(autorange="reversed", type="category"))
    return fig
