"""KVSnapshot -> plotly block map, pandas block table and a one-line summary (pure functions, unit-tested)."""
import math
import re
import zlib

import pandas as pd
import plotly.graph_objects as go

# 20 request colours picked greedily for the largest smallest CIEDE2000 difference: any two differ by ΔE00 >= 18
# (consecutive request ids never look alike), and each is >= 25 from the map's greys below, white and black
PALETTE = ["#2288dd", "#ffff00", "#114400", "#880000", "#ff9977", "#000077", "#ff00ff", "#00ffee", "#00aa11",
           "#997700", "#991166", "#009999", "#ff2266", "#5544ff", "#ffbb44", "#88ff88", "#ff99cc", "#cc5500",
           "#bbbb77", "#9966aa"]
FREE_COLOR, CACHED_COLOR = "#eef1f5", "#b9c3d6"  # free vs cached-but-free (revivable through its hash)
UNOWNED_COLOR = "#555555"  # in use but held by no live request (only between engine steps)
TABLE_COLUMNS = ["request", "logical", "physical", "fill", "kind", "ref_count", "hash"]


def request_color(request_id: str) -> str:
    """A colour that stays with a request across steps: its counter (req-N) picks it, so a batch never repeats
    one within 20 consecutive requests; other ids fall back to a checksum."""
    base = request_id.split("#")[0]
    tail = base.rsplit("-", 1)[-1]
    n = int(tail) if tail.isdigit() else zlib.crc32(base.encode())
    return PALETTE[n % len(PALETTE)]


def natural_key(name: str) -> list:
    """Sort key that puts req-8 before req-10 (digit runs compare as numbers)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def grid_columns(num_blocks: int) -> int:
    """Cells per row: roughly square maps, capped at 64 columns."""
    return max(4, min(64, math.ceil(math.sqrt(num_blocks * 2))))


def block_cell(block_id: int, cols: int) -> tuple[int, int]:
    """(x, y) of a physical block on the map: row-major, block 0 top left."""
    y, x = divmod(block_id, cols)
    return x, y


def _hover(b) -> str:
    if b.ref_count == 0:
        state = "cached (free, revivable by hash)" if b.cached else "free"
        tail = f"<br>hash {b.block_hash}" if b.block_hash else ""
        return f"block {b.block_id} · {state}<br>{b.num_tokens} tokens{tail}"
    return (f"block {b.block_id} · ref {b.ref_count} · {b.kind}<br>{b.num_tokens} tokens filled"
            f"<br>hash {b.block_hash or '— (not full yet)'}<br>owners {', '.join(b.owners)}")


def block_map_figure(snap, title: str | None = None) -> go.Figure:
    """One cell per physical block: coloured by its first owner, cached-but-free and free in two greys,
    image blocks marked (◇ image tokens only, ◆ image and text), shared blocks labelled with their ref count."""
    cols = grid_columns(snap.num_blocks)
    rows = math.ceil(snap.num_blocks / cols)
    owners = sorted({b.owners[0] for b in snap.blocks if b.ref_count > 0 and b.owners}, key=natural_key)
    colors = [FREE_COLOR, CACHED_COLOR, UNOWNED_COLOR] + [request_color(r) for r in owners]
    index = {r: i + 3 for i, r in enumerate(owners)}
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    marks = {"image": ([], []), "mixed": ([], [])}
    shared_x, shared_y, shared_t = [], [], []
    for b in snap.blocks:
        x, y = block_cell(b.block_id, cols)
        used = b.ref_count > 0
        z[y][x] = (index[b.owners[0]] if b.owners else 2) if used else 1 if b.cached else 0
        text[y][x] = _hover(b)
        if used and b.kind in marks:
            marks[b.kind][0].append(x - 0.3)
            marks[b.kind][1].append(y - 0.3)
        if b.ref_count > 1:
            shared_x.append(x)
            shared_y.append(y)
            shared_t.append(str(b.ref_count))
    k = len(colors)
    scale = [[s, c] for i, c in enumerate(colors) for s in (i / k, (i + 1) / k)]
    fig = go.Figure(go.Heatmap(z=z, text=text, hovertemplate="%{text}<extra></extra>", colorscale=scale,
                               zmin=-0.5, zmax=k - 0.5, showscale=False, xgap=2, ygap=2, name="blocks"))
    for kind, fill in (("image", "white"), ("mixed", "black")):  # ◇ image tokens only, ◆ image and text
        xs, ys = marks[kind]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"{kind} tokens", hoverinfo="skip",
                                 marker=dict(symbol="diamond", size=7, color=fill, line=dict(width=1, color="black"))))
    # the count on a dark disc: readable on every request colour, and the legend shows the same disc
    fig.add_trace(go.Scatter(x=shared_x, y=shared_y, text=shared_t, mode="markers+text", name="ref count (shared)",
                             hoverinfo="skip", textfont=dict(color="white", size=11, family="monospace"),
                             marker=dict(symbol="circle", size=17, color="rgba(20, 20, 20, 0.72)")))
    legend = [(r, request_color(r)) for r in owners] + [("cached (free)", CACHED_COLOR), ("free", FREE_COLOR)]
    for name, color in legend:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, legendgroup="cells",
                                 marker=dict(symbol="square", size=12, color=color, line=dict(width=1, color="#999"))))
    fig.update_layout(
        title=title or f"KV pool at step {snap.step}: {snap.num_blocks} blocks × {snap.block_size} tokens",
        meta={"cols": cols}, height=min(760, 140 + rows * max(10, min(34, 700 // rows))),
        margin=dict(l=10, r=10, t=40, b=10), plot_bgcolor="white", legend=dict(orientation="v", x=1.01),
        xaxis=dict(visible=False, range=[-0.5, cols - 0.5]),
        yaxis=dict(visible=False, autorange="reversed", scaleanchor="x"))
    return fig


def block_table(snap) -> pd.DataFrame:
    """Every request's block table: logical index -> physical block, its fill, kind, ref count, hash prefix."""
    blocks = {b.block_id: b for b in snap.blocks}
    rows = []
    for rid in sorted(snap.block_tables, key=natural_key):
        for logical, pid in enumerate(snap.block_tables[rid]):
            b = blocks[pid]
            rows.append([rid, logical, pid, f"{b.num_tokens}/{snap.block_size}", b.kind, b.ref_count,
                         b.block_hash or ""])
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def snapshot_summary(snap) -> str:
    """Step, queues, preemptions, pool occupancy and prefix-cache counters in one markdown line."""
    used = sum(b.ref_count > 0 for b in snap.blocks)
    cached = sum(b.ref_count == 0 and b.cached for b in snap.blocks)
    st = snap.cache_stats or {}
    return (f"**step {snap.step}** · running {len(snap.running)} · waiting {len(snap.waiting)} · "
            f"preemptions {snap.num_preemptions} · blocks used {used} / cached {cached} / "
            f"free {snap.num_blocks - used - cached} of {snap.num_blocks} · prefix-cache hits "
            f"{st.get('hits', 0)} (true {st.get('true_hits', 0)}, false {st.get('false_hits', 0)}) "
            f"in {st.get('lookups', 0)} lookups")
