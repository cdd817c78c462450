"""KVSnapshot -> plotly block map, pandas block table and a one-line summary (pure functions, unit-tested)."""
import math
import re
import zlib

import pandas as pd
import plotly.graph_objects as go

from panels.anatomy_figures import TITLE, TOP_MARGIN
from panels.i18n import CATALOGUE, EN, t

# 20 request colours picked greedily for the largest smallest CIEDE2000 difference: any two differ by ΔE00 >= 18
# (consecutive request ids never look alike), and each is >= 25 from the map's greys below, white and black
PALETTE = ["#2288dd", "#ffff00", "#114400", "#880000", "#ff9977", "#000077", "#ff00ff", "#00ffee", "#00aa11",
           "#997700", "#991166", "#009999", "#ff2266", "#5544ff", "#ffbb44", "#88ff88", "#ff99cc", "#cc5500",
           "#bbbb77", "#9966aa"]
FREE_COLOR, CACHED_COLOR = "#eef1f5", "#b9c3d6"  # free vs cached-but-free (revivable through its hash)
UNOWNED_COLOR = "#555555"  # in use but held by no live request (only between engine steps)
PHONE_MAP_PX = 340  # the map's width on a 400-px phone: the ref-count discs are sized to fit its cells
LEGEND_PER_ROW, LEGEND_ROW_PX = 4, 20  # legend entries per row on that phone, and a row's height
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


def row_px(rows: int) -> int:
    """A map row's height: tall rows for a small pool, at least 12 px for a large one (the map stays under ~700 px)."""
    return 44 if rows <= 4 else max(12, min(34, 560 // rows))


def block_cell(block_id: int, cols: int) -> tuple[int, int]:
    """(x, y) of a physical block on the map: row-major, block 0 top left."""
    y, x = divmod(block_id, cols)
    return x, y


def _hover(b, lang: str = EN) -> str:
    if b.ref_count == 0:
        state = t(lang, "map.cached_state" if b.cached else "map.free_state")
        tail = t(lang, "map.hash_tail", hash=b.block_hash) if b.block_hash else ""
        return t(lang, "map.free_hover", id=b.block_id, state=state, n=b.num_tokens, tail=tail)
    return t(lang, "map.used_hover", id=b.block_id, ref=b.ref_count, kind=kind_word(b.kind, lang), n=b.num_tokens,
             hash=b.block_hash or t(lang, "map.not_full"), owners=", ".join(b.owners))


def kind_word(kind: str, lang: str = EN) -> str:
    """A block kind (text, image, mixed, video, free) in `lang`."""
    return t(lang, f"kind.{kind}") if lang != EN and f"kind.{kind}" in CATALOGUE else kind


def drafted_blocks(events, step: int, block_size: int, lang: str = EN) -> dict[int, str]:
    """Speculative decoding at `step`: each block that held guessed tokens in that step, with what became of its
    guessed slots, from the step's plan and its `speculated` events: accepted; or rejected, its block freed with it
    (the block held only rejected guesses: the event's freed_blocks); or rejected but written in a block the request
    keeps, where its next tokens overwrite it."""
    verdicts = {e.request_id: e for e in events if e.step == step and e.kind == "speculated"}
    out: dict[int, list[str]] = {}
    for e in events:
        if e.step != step or e.kind != "scheduled":
            continue
        for r in e.plan:
            verdict = verdicts.get(r["request_id"])
            accepted, freed = (verdict.accepted, set(verdict.freed_blocks)) if verdict else (0, set())
            for j, slot in enumerate(r.get("draft_slots", ())):
                block = slot // block_size
                said = "map.draft_kept" if j < accepted else "map.draft_freed" if block in freed else \
                    "map.draft_overwritten"
                out.setdefault(block, []).append(t(lang, said, slot=slot, rid=r["request_id"], block=block))
    return {b: "<br>".join(lines) for b, lines in out.items()}


def block_map_figure(snap, title: str | None = None, lang: str = EN, drafts: dict[int, str] | None = None) -> go.Figure:
    """One cell per physical block: coloured by its first owner, cached-but-free and free in two greys,
    image blocks marked (◇ image tokens only, ◆ image and text), shared blocks labelled with their ref count;
    drafts (speculative decoding): the blocks that held this step's guessed tokens, starred."""
    cols = grid_columns(snap.num_blocks)
    rows = math.ceil(snap.num_blocks / cols)
    owners = sorted({b.owners[0] for b in snap.blocks if b.ref_count > 0 and b.owners}, key=natural_key)
    colors = [FREE_COLOR, CACHED_COLOR, UNOWNED_COLOR] + [request_color(r) for r in owners]
    index = {r: i + 3 for i, r in enumerate(owners)}
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    marks = {"image": ([], []), "mixed": ([], []), "video": ([], [])}
    shared_x, shared_y, shared_t = [], [], []
    for b in snap.blocks:
        x, y = block_cell(b.block_id, cols)
        used = b.ref_count > 0
        z[y][x] = (index[b.owners[0]] if b.owners else 2) if used else 1 if b.cached else 0
        text[y][x] = _hover(b, lang)
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
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=t(lang, f"map.{kind}_tokens"), hoverinfo="skip",
                                 marker=dict(symbol="diamond", size=7, color=fill, line=dict(width=1, color="black"))))
    if marks["video"][0]:  # ▶ a video's tokens (its frame pairs, and Qwen3-VL's timestamps between them)
        fig.add_trace(go.Scatter(x=marks["video"][0], y=marks["video"][1], mode="markers", name=t(lang, "map.video_tokens"),
                                 hoverinfo="skip", marker=dict(symbol="triangle-right", size=8, color="white",
                                                               line=dict(width=1, color="black"))))
    # the count on a dark disc, sized to fit a cell on a phone-wide map so neighbours' counts never merge
    disc = min(17, max(8, PHONE_MAP_PX // cols - 2))
    fig.add_trace(go.Scatter(x=shared_x, y=shared_y, text=shared_t, mode="markers+text" if disc >= 11 else "markers",
                             name=t(lang, "map.ref_count"), hoverinfo="skip",
                             textfont=dict(color="white", size=min(11, disc - 3), family="monospace"),
                             marker=dict(symbol="circle", size=disc, color="rgba(20, 20, 20, 0.72)")))
    if drafts:  # ☆ guessed tokens' slots in this step: accepted, or given back (the hover says which)
        cells = [block_cell(b, cols) for b in drafts]
        fig.add_trace(go.Scatter(x=[x + 0.3 for x, _ in cells], y=[y - 0.3 for _, y in cells], mode="markers",
                                 name=t(lang, "map.drafts"), text=list(drafts.values()),
                                 hovertemplate="%{text}<extra></extra>",
                                 marker=dict(symbol="star", size=10, color="#facc15", line=dict(width=1, color="black"))))
    legend = [(r, request_color(r)) for r in owners] + [(t(lang, "map.cached_legend"), CACHED_COLOR),
                                                           (t(lang, "map.free_legend"), FREE_COLOR)]
    for name, color in legend:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, legendgroup="cells",
                                 marker=dict(symbol="square", size=12, color=color, line=dict(width=1, color="#999"))))
    # the cells fill the width (no empty band on any screen) in rows of a fixed height; the legend flows in rows
    # under them, as many as a phone needs, so no entry is ever cut off
    legend_rows = math.ceil((len(legend) + 3 + bool(marks["video"][0]) + bool(drafts)) / LEGEND_PER_ROW)
    fig.update_layout(
        title=dict(TITLE, text=title or t(lang, "map.title", step=snap.step, blocks=snap.num_blocks,
                                          block_size=snap.block_size)),
        meta={"cols": cols}, height=TOP_MARGIN + rows * row_px(rows) + legend_rows * LEGEND_ROW_PX + 20,
        margin=dict(l=10, r=10, t=TOP_MARGIN, b=10),
        legend=dict(orientation="h", x=0, xanchor="left", y=-0.01, yanchor="top", traceorder="normal"),
        xaxis=dict(visible=False, range=[-0.5, cols - 0.5], fixedrange=True),
        yaxis=dict(visible=False, range=[rows - 0.5, -0.5], fixedrange=True))
    return fig


def block_table(snap, lang: str = EN) -> pd.DataFrame:
    """Every request's block table: logical index -> physical block, its fill, kind, ref count, hash prefix."""
    blocks = {b.block_id: b for b in snap.blocks}
    rows = []
    for rid in sorted(snap.block_tables, key=natural_key):
        for logical, pid in enumerate(snap.block_tables[rid]):
            b = blocks[pid]
            rows.append([rid, logical, pid, f"{b.num_tokens}/{snap.block_size}", kind_word(b.kind, lang),
                         b.ref_count, b.block_hash or ""])
    return pd.DataFrame(rows, columns=[t(lang, f"table.{c}") for c in TABLE_COLUMNS])
