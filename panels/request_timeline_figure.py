"""The Timeline tab's pictures, from one run's events: a Gantt chart in wall-clock time (one row per request, a bar
per span: queue, vision tower, prefill or chunk, each decode step, preempted; a mark where it finished), whose
hover says the span's steps and the decision log's sentence for it; the step-time histogram of two runs; and the
latency percentiles of two runs side by side (minivlm.views.timeline computes every number)."""
import plotly.graph_objects as go

from minivlm.views.timeline import timeline

from panels.anatomy_figures import TITLE, TOP_MARGIN, needs_width
from panels.i18n import EN, t
from panels.i18n.events import describe_in, plan_request
from panels.plots import natural_key

SPAN_COLORS = {"queue": "#f2c14e", "vision": "#c39bd3", "tower": "#6c3483", "prefill": "#1f6fbf",
               "chunk": "#5dade2", "decode": "#239b56", "preempted": "#e74c3c"}  # a tower slice over its wait
KIND_WORDS = {"queue": "tl.kind.queue", "vision": "tl.kind.vision", "tower": "tl.kind.tower",
              "prefill": "tl.kind.prefill",
              "chunk": "tl.kind.chunk", "decode": "tl.kind.decode", "preempted": "tl.kind.preempted"}
FINISH_MARK = dict(symbol="line-ns", size=14, line=dict(width=3, color="#555"))
MS = 1e3
LEGEND_PX = 70  # below the axis title, three rows of legend on a phone
# the legend at the figure's foot (the container's, not the plot's: a short plot would pull it onto its ticks)
LEGEND = dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, traceorder="normal")


def span_hover(span, t0: float, sentences: dict, lang: str) -> str:
    """'r3 · decode · step 14 · 120.4–131.9 ms (11.5 ms)' and the decision log's sentence for that span."""
    steps = span.steps
    where = (t(lang, "tl.steps", first=steps[0], last=steps[-1]) if len(steps) > 1 else
             t(lang, "tl.step", step=steps[0]) if steps else t(lang, "tl.no_step"))
    head = t(lang, "tl.hover", rid=span.request_id, kind=t(lang, KIND_WORDS[span.kind]), where=where,
             start=f"{(span.start - t0) * MS:.1f}", end=f"{(span.end - t0) * MS:.1f}", ms=f"{span.seconds * MS:.1f}")
    if span.accepted:
        head += t(lang, "tl.accepted", n=span.accepted)
    if span.tower_seconds is not None:
        head += t(lang, "tl.tower", ms=f"{span.tower_seconds * MS:.1f}", n=span.slices)
    said = sentences.get(("tower", steps[0], span.start) if span.kind == "tower" else
                         (span.request_id, span.kind, steps[0] if steps else None))
    return head + ("<br>" + wrap(said) if said else "")


def wrap(text: str, width: int = 70) -> str:
    """Hover text in lines of about `width` characters (a phone's hover box is narrow)."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + len(word) > width:
            lines.append(line)
            line = ""
        line += ("" if not line else " ") + word
    return "<br>".join(lines + [line])


def sentences_of(events, lang: str) -> dict:
    """(request, span kind, first step) -> the decision log's sentence: a step's plan line for that request, the
    preemption's reason, the vision thread's report."""
    out = {}
    for ev in events:
        if ev.kind == "scheduled":
            for r in ev.plan:
                kind = "decode" if r["kind"] == "decode" else r["kind"] if r["kind"] == "chunk" else "prefill"
                out[(r["request_id"], kind, ev.step)] = plan_request(r, lang)
        elif ev.kind == "preempted":
            out[(ev.request_id, "preempted", ev.step)] = describe_in(ev, lang)
        elif ev.kind == "tower_slice":
            out[("tower", ev.step, ev.fields["started"])] = describe_in(ev, lang)
        elif ev.kind == "vision_encoded":
            out[(ev.request_id, "vision", ev.fields["arrived_step"])] = describe_in(ev, lang)
    return out


def gantt_figure(events, title: str, lang: str = EN) -> go.Figure:
    """One row per request (in arrival order, top down), x in ms since the run's first arrival."""
    tl = timeline(events)
    rows = sorted(tl.requests, key=lambda r: (tl.requests[r].arrived, natural_key(r)))
    t0 = tl.start or 0.0
    said = sentences_of(events, lang)
    fig = go.Figure()
    for kind, color in SPAN_COLORS.items():
        spans = [s for r in rows for s in tl.requests[r].spans if s.kind == kind]
        fig.add_trace(go.Bar(
            orientation="h", y=[s.request_id for s in spans], x=[max(s.seconds * MS, 0.2) for s in spans],
            base=[(s.start - t0) * MS for s in spans], marker=dict(color=color, line=dict(width=0)),
            name=t(lang, KIND_WORDS[kind]), hovertext=[span_hover(s, t0, said, lang) for s in spans],
            hoverinfo="text", showlegend=True))
    done = [tl.requests[r] for r in rows if tl.requests[r].finished is not None]
    ends = [(r.token_times[-1] if r.token_times else r.finished) for r in done]
    fig.add_trace(go.Scatter(
        x=[(e - t0) * MS for e in ends], y=[r.request_id for r in done], mode="markers", marker=FINISH_MARK,
        name=t(lang, "tl.finished"), hoverinfo="text",
        hovertext=[t(lang, "tl.finish_hover", rid=r.request_id, reason=t(lang, f"reason.{r.finish_reason}"),
                     step=r.finished_step, ms=f"{(e - t0) * MS:.1f}", n=len(r.token_times))
                   for r, e in zip(done, ends)]))
    fig.update_layout(
        title=dict(TITLE, text=title, x=0.01, xanchor="left"), barmode="overlay", bargap=0.25,
        height=max(260, TOP_MARGIN + LEGEND_PX + 60 + 22 * len(rows)),
        margin=dict(l=10, r=10, t=TOP_MARGIN, b=LEGEND_PX + 50), legend=LEGEND,
        xaxis=dict(title=t(lang, "tl.axis"), rangemode="tozero"),
        yaxis=dict(autorange="reversed", type="category", categoryorder="array", categoryarray=rows),
        meta={"requests": rows, "spans": sum(len(tl.requests[r].spans) for r in rows)})
    return needs_width(fig, 330)


def step_histogram(runs: list[tuple[str, list]], lang: str = EN) -> go.Figure:
    """Every step's duration (start to end, ms) of each run, overlaid."""
    fig = go.Figure()
    for (label, events), color in zip(runs, ("#1f6fbf", "#d35400")):
        steps = timeline(events).steps
        fig.add_trace(go.Histogram(x=[s.seconds * MS for s in steps], name=label, opacity=0.6, nbinsx=30,
                                   marker_color=color, hovertemplate=t(lang, "tl.hist_hover") + "<extra></extra>"))
    fig.update_layout(title=dict(TITLE, text=t(lang, "tl.hist_title"), x=0.01, xanchor="left"), barmode="overlay",
                      height=280 + LEGEND_PX, margin=dict(l=10, r=10, t=TOP_MARGIN, b=LEGEND_PX + 50), legend=LEGEND,
                      xaxis=dict(title=t(lang, "tl.hist_axis"), ticks="outside", ticklen=6),  # the two 0s apart
                      yaxis=dict(title=t(lang, "tl.hist_count"), ticks="outside", ticklen=6))
    return needs_width(fig, 330)


FIGURES = {"ttft": "tl.m.ttft", "itl": "tl.m.itl", "e2e": "tl.m.e2e", "queue": "tl.m.queue", "step": "tl.m.step"}
ROWS = (("ttft", "mean"), ("ttft", "p50"), ("ttft", "p99"), ("itl", "mean"), ("itl", "p50"), ("itl", "p99"),
        ("e2e", "p50"), ("e2e", "p99"), ("queue", "mean"), ("queue", "p99"), ("step", "p50"), ("step", "p99"))


def percentile_rows(runs: list[tuple[str, list]], lang: str = EN) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per figure, one column per run; latencies in ms."""
    sums = [timeline(events).summary() for _, events in runs]
    body = [[t(lang, FIGURES[name], q=t(lang, "tl.mean") if q == "mean" else q)] + [fmt(s[name][q]) for s in sums]
            for name, q in ROWS]
    body.append([t(lang, "tl.m.tokens_per_s")] + [f"{s['tokens_per_s']:.1f}" if s["tokens_per_s"] else "–"
                                                   for s in sums])
    body.append([t(lang, "tl.m.finished")] + [f"{s['finished']} / {s['requests']}" for s in sums])
    return [t(lang, "tl.m.figure")] + [label for label, _ in runs], body


def fmt(seconds) -> str:
    return "–" if seconds is None else f"{seconds * MS:.1f} ms"
