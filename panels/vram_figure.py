"""The VRAM tab's figure: the memory plan per GPU as a stacked bar beside what this engine holds now, and the workload's
KV demand against the pool in tokens (plotly, in the page's language)."""
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from panels.anatomy_figures import MARGIN_X, needs_width, text_px
from panels.i18n import EN, t
from panels.i18n.budget import word

SEGMENTS = [("LLM weights", "#1f77b4"), ("vision encoder", "#9467bd"), ("activations", "#ff7f0e"),
            ("KV cache", "#2ca02c"), ("overhead", "#7f7f7f")]
COLUMNS, SPACING, SUBPLOT_TITLE_FONT = [0.6, 0.4], 0.12, 13  # the plan's two bars: their widths, gap and titles
AXIS_PX = 72  # a bar's tick labels ("0.015") and axis title ("GiB") beside it
GIB = 2 ** 30


def estimate_parts(est) -> list[int]:
    """Bytes per bar segment of an estimate, in SEGMENTS order."""
    return [est.text_weights_bytes, est.vision_weights_bytes, est.activation_peak_bytes, est.kv_cache_bytes,
            est.overhead_bytes]


def engine_parts(rep) -> list[int]:
    """Bytes per bar segment of a MemoryReport (activations only where the device reports a peak)."""
    held = rep.weights_bytes + rep.kv_cache_bytes
    act = max(0, rep.peak_bytes - held) if rep.peak_bytes is not None else 0
    return [rep.weights_bytes - rep.vision_weights_bytes, rep.vision_weights_bytes, act, rep.kv_cache_bytes, 0]


def budget_figure(est_parts, eng_parts, memory_bytes: int, budget_bytes: int, device: str, engine_device: str,
                  kv_tokens: tuple[int, int, str] | None = None, lang: str = EN):
    """Two stacked bars (GiB), each on its own scale: the estimate per GPU against the device's memory and budget
    lines, and what this engine holds now; below, when kv_tokens = (pool, demand, demand label) is given, the
    workload's KV demand against the pool in tokens. Every label sits beside a bar or in the legend, never on one."""
    rows = 2 if kv_tokens else 1
    titles = [t(lang, "fig.estimate", device=device), t(lang, "fig.engine", device=engine_device)] + \
        ([t(lang, "fig.kv")] if kv_tokens else [])
    fig = make_subplots(rows=rows, cols=2, column_widths=COLUMNS, horizontal_spacing=SPACING, vertical_spacing=0.2,
                        row_heights=[0.72, 0.28][:rows], specs=[[{}, {}]] + ([[{"colspan": 2}, None]] if kv_tokens
                                                                             else []),
                        subplot_titles=titles)
    fig.update_annotations(font_size=SUBPLOT_TITLE_FONT)  # the subplot titles
    # each subplot as wide as its title (and the axes' ticks and titles beside the bars), the KV row as wide as its
    # labels and some bar: on a narrower screen the figure keeps that width and scrolls (panels/page.py)
    need = max([text_px(title, SUBPLOT_TITLE_FONT) / (share * (1 - SPACING)) + 60
                for title, share in zip(titles, COLUMNS)] + [AXIS_PX / SPACING])  # the gap: the right bar's axis
    for col, parts in ((1, est_parts), (2, eng_parts)):
        for (name, color), b in zip(SEGMENTS, parts):
            name = word(lang, "seg", name)
            fig.add_trace(go.Bar(name=name, x=[t(lang, "fig.memory")], y=[b / GIB],
                                 marker_color=color, legendgroup=name, showlegend=col == 1,
                                 hovertemplate=f"{name}: %{{y:.4f}} GiB<extra></extra>"), row=1, col=col)
    fig.add_hline(memory_bytes / GIB, line=dict(color="gray", width=2), row=1, col=1, showlegend=True,
                  name=t(lang, "fig.device_memory", gib=f"{memory_bytes / GIB:.1f}"))
    fig.add_hline(budget_bytes / GIB, line=dict(color="red", dash="dash"), row=1, col=1, showlegend=True,
                  name=t(lang, "fig.budget", gib=f"{budget_bytes / GIB:.1f}"))
    if kv_tokens:
        pool, demand, label = kv_tokens
        bars = [label, t(lang, "fig.pool", n=f"{pool:,}")]
        need = max(need, text_px(titles[2], SUBPLOT_TITLE_FONT), max(text_px(b, 12) for b in bars) + 160)
        fig.add_trace(go.Bar(y=bars, x=[demand, pool], orientation="h",
                             marker_color=["#d62728" if demand > pool else "#17becf", "#2ca02c"], showlegend=False,
                             name=t(lang, "fig.demand_vs_pool"), hovertemplate="%{y}<extra></extra>"), row=2, col=1)
        fig.update_xaxes(title_text=t(lang, "fig.tokens"), row=2, col=1)
    fig.update_layout(barmode="stack", height=640 if kv_tokens else 420, margin=dict(l=10, r=10, t=40, b=10),
                      legend=dict(orientation="h", yanchor="top", y=-0.12 if kv_tokens else -0.08, x=0))
    fig.update_yaxes(title_text="GiB", row=1)
    return needs_width(fig, need + MARGIN_X)
