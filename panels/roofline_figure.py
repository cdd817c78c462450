"""The Roofline tab's pictures: the log-log roofline (the bandwidth slope up to the ridge, the flat FLOP ceiling) with
each step as a point under its ceiling, one sentence per point a student can check by hand, and the table of what
each step reads. Pure functions of a Machine and Points (minivlm/budget/machine.py,
minivlm/views/roofline_points.py)."""
import math

import pandas as pd
import plotly.graph_objects as go

from panels.anatomy_figures import MARGIN_X, TITLE, TOP_MARGIN, needs_width, text_px
from panels.i18n import EN, t

KIND_IDS = {"decode": "roof.kind.decode", "prefill": "roof.kind.prefill", "mixed": "roof.kind.mixed"}
KIND_COLORS = {"decode": "#1f77b4", "prefill": "#ff7f0e", "mixed": "#9467bd"}
ROOF_COLOR = "#7f7f7f"
COLUMNS = ["roof.col.step", "roof.col.requests", "roof.col.context", "roof.col.decoder", "roof.col.head",
           "roof.col.kv", "roof.col.state", "roof.col.total", "roof.col.gflop", "roof.col.intensity",
           "roof.col.bound", "roof.col.took", "roof.col.pct"]
PARTS = ("decoder weights", "LM head", "KV reads", "recurrent state")  # the table's byte columns (StepCost.parts)
PHONE_PX = 300  # the figure's least width (a phone's box is ~355 px): it scrolls sideways on a narrower screen


def num(x: float) -> str:
    """A figure as a student reads it: three significant digits below 100, whole numbers (with commas) above."""
    return f"{x:,.0f}" if abs(x) >= 99.95 else f"{x:#.3g}"


def decade(x: float, direction) -> float:
    """The power of ten at or beyond x (direction: math.floor below, math.ceil above)."""
    return 10.0 ** direction(math.log10(x))


def kind_word(kind: str, lang: str) -> str:
    return t(lang, KIND_IDS.get(kind, "roof.kind.mixed"))


def sentence(p, machine, lang: str = EN) -> str:
    """'a 1-request decode step at 70 tokens of context reads 333 MB; at 25 GB/s that is at best 13.3 ms; it took
    15.1 ms (88 % of the bound)': the lower ceiling's arithmetic, then the time the engine measured (or 'predicted')."""
    kind, best = kind_word(p.kind, lang), num(1e3 * p.bound_s)
    if p.memory_bound:
        text = t(lang, "roof.say_memory", n=p.batch, kind=kind, ctx=f"{p.context:,}", mb=num(p.cost.bytes / 1e6),
                 gbs=num(machine.bandwidth / 1e9), best=best)
    else:
        text = t(lang, "roof.say_compute", n=p.batch, kind=kind, tokens=f"{p.cost.tokens:,}",
                 gflop=num(p.cost.flops / 1e9), gflops=num(machine.flops / 1e9), best=best)
    if p.predicted:
        return text + t(lang, "roof.say_predicted")
    return text + t(lang, "roof.say_took", took=num(1e3 * p.seconds), pct=num(100 * p.fraction))


def table(points, lang: str = EN) -> pd.DataFrame:
    """One row per point: its bytes by part (MB), FLOPs, intensity, bound, time taken and the share of the bound."""
    rows = []
    for p in points:
        parts = [num(p.cost.parts[name] / 1e6) for name in PARTS]
        rows.append([kind_word(p.kind, lang), p.batch, f"{p.context:,}", *parts, num(p.cost.bytes / 1e6),
                     num(p.cost.flops / 1e9), num(p.cost.intensity), num(1e3 * p.bound_s),
                     "—" if p.predicted else num(1e3 * p.seconds), "—" if p.predicted else num(100 * p.fraction)])
    return pd.DataFrame(rows, columns=[t(lang, c) for c in COLUMNS])


def roofline_figure(machine, points, model: str, lang: str = EN) -> go.Figure:
    """Log-log: x FLOPs per byte, y GFLOP/s. The roof is min(bandwidth × x, FLOP rate); each measured step is a
    filled marker at the rate it reached with a dash at its ceiling above it, a predicted one an open marker on its
    ceiling. Hover: the point's sentence."""
    bw, peak, ridge = machine.bandwidth, machine.flops, machine.ridge
    xs = [p.cost.intensity for p in points if p.cost.intensity > 0] + [ridge]
    lo, hi = decade(min(xs) / 4, math.floor), decade(max(xs) * 4, math.ceil)  # whole decades: a tick at each
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[lo, ridge, hi], y=[bw * lo / 1e9, peak / 1e9, peak / 1e9], mode="lines",
                             line=dict(color=ROOF_COLOR, width=3), hoverinfo="skip",
                             name=t(lang, "roof.fig_roof")))
    dash_x, dash_y = [], []
    for kind, color in KIND_COLORS.items():
        for predicted in (False, True):
            group = [p for p in points if p.kind == kind and p.predicted == predicted]
            if not group:
                continue
            name = t(lang, "roof.fig_predicted" if predicted else "roof.fig_measured", kind=kind_word(kind, lang))
            y = [machine.ceiling(p.cost.intensity) / 1e9 if predicted else p.achieved / 1e9 for p in group]
            fig.add_trace(go.Scatter(
                x=[p.cost.intensity for p in group], y=y, mode="markers", name=name,
                marker=dict(size=11, color=color, symbol="circle-open" if predicted else "circle",
                            line=dict(width=2, color=color)),
                hovertext=[sentence(p, machine, lang) for p in group], hoverinfo="text"))
            if not predicted:
                for p in group:
                    dash_x += [p.cost.intensity, p.cost.intensity, None]
                    dash_y += [p.achieved / 1e9, machine.ceiling(p.cost.intensity) / 1e9, None]
    if dash_x:  # each measured point's gap to its ceiling, ended by a dash at the ceiling
        fig.add_trace(go.Scatter(x=dash_x, y=dash_y, mode="lines+markers", name=t(lang, "roof.fig_ceiling"),
                                 line=dict(color=ROOF_COLOR, width=1, dash="dot"), hoverinfo="skip",
                                 marker=dict(symbol="line-ew-open", size=16, color=ROOF_COLOR,
                                             line=dict(width=2, color=ROOF_COLOR))))
    title = t(lang, "roof.fig_title", model=model, device=machine.device)
    fig.update_layout(title=dict(TITLE, text=title), height=560, margin=dict(l=10, r=10, t=TOP_MARGIN, b=10),
                      xaxis=dict(type="log", title=t(lang, "roof.fig_x"), dtick=1,
                                 range=[math.log10(lo), math.log10(hi)]),
                      yaxis=dict(type="log", title=t(lang, "roof.fig_y"), dtick=1),
                      legend=dict(orientation="h", yanchor="top", y=-0.16, x=0))
    words = [t(lang, "roof.fig_x")] + [trace.name for trace in fig.data]  # the axis title, each legend entry
    need = max(PHONE_PX, *(text_px(w, 12) + 60 for w in words))
    return needs_width(fig, need + MARGIN_X)
