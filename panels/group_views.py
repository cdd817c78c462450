"""The KV tab's views of a hybrid model's KV-cache groups (Qwen3.5, Gemma 3), under the block map, which stays the
full-attention group's: the sliding-window group's table per request (blocks that left the window marked ✕, the
window said) and the recurrent group's state slots (which request holds which slot, which hold checkpoints and where
each was saved). HTML, so a phone wraps the cells instead of scrolling; drawn from the same frame as the map: the live
engine, or the replayed step (panels/group_replay.py). A model whose every layer attends fully shows nothing here."""
import html

import gradio as gr

from panels.group_replay import GroupFrame, group_frame, hybrid, live_frame
from panels.holder import layer_ranges, shared_reads
from panels.i18n import EN, L, lang_of, t
from panels.plots import natural_key, request_color

INK_DARK, INK_LIGHT = "#000000", "#ffffff"  # black: >= 4.8:1 on every request colour
CHECKPOINT_BG, FREE_BG = "#b9c3d6", "#eef1f5"  # the block map's cached and free greys
CELL = ("display:inline-block;min-width:2.2em;padding:2px 4px;margin:1px;border-radius:3px;text-align:center;"
        "font-family:monospace;font-size:12px;line-height:1.5;")
ROW = "display:flex;flex-wrap:wrap;align-items:center;gap:2px;margin:3px 0;"
NOTE = "font-size:12px;margin:2px 0 6px;opacity:0.85;"  # the theme's own text colour, a little muted


def luminance(hex_color: str) -> float:
    def channel(v: int) -> float:
        v /= 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def ink(background: str) -> str:
    """Black or white text, whichever reads better on `background` (WCAG contrast)."""
    lum = luminance(background)
    return INK_DARK if (lum + 0.05) / (luminance(INK_DARK) + 0.05) >= 1.05 / (lum + 0.05) else INK_LIGHT


def cell(text: str, title: str, background: str | None, **data) -> str:
    """One cell: a filled box (its ink picked for contrast), or, with no background, a dashed outline in the
    theme's own text colour (a block that left the window)."""
    style = CELL + (f"background:{background};color:{ink(background)};" if background else
                    "border:1px dashed currentColor;")
    attrs = "".join(f" data-{k}='{html.escape(str(v))}'" for k, v in data.items())
    return f"<span class='kvg-cell' style='{style}' title='{html.escape(title)}'{attrs}>{html.escape(text)}</span>"


def plural(layers: list[int]) -> str:
    return "s" if len(layers) > 1 else ""


def sliding_head(g, lang: str) -> str:
    held = len({b for table in g.block_tables.values() for b in table if b is not None})
    return t(lang, "groups.sliding", s=plural(g.layers), layers=layer_ranges(g.layers), window=g.window, size=g.size,
             held=held, free=g.free)


def sliding_html(g, bs: int, lang: str) -> str:
    out = [f"<div>{sliding_head(g, lang)}</div>",
           f"<div style='{NOTE}'>{t(lang, 'groups.sliding_why', window=g.window)}</div>"]
    for rid in sorted(g.block_tables, key=natural_key):
        cells = []
        for i, b in enumerate(g.block_tables[rid]):
            span = dict(i=i, first=i * bs, last=(i + 1) * bs - 1)
            cells.append(cell("✕", t(lang, "groups.cell_left", **span), None, logical=i, block="", state="left")
                         if b is None else
                         cell(str(b), t(lang, "groups.cell_block", b=b, **span), request_color(rid), logical=i, block=b,
                              state="held"))
        out.append(f"<div class='kvg-row' data-request='{html.escape(rid)}' style='{ROW}'>"
                   f"<b style='min-width:4.5em'>{html.escape(rid)}</b>{''.join(cells)}</div>")
    out.append(f"<div style='{NOTE}'>{t(lang, 'groups.left_legend' if g.block_tables else 'groups.no_tables')}</div>")
    return "".join(out)


def saved_words(key: str, saved_at: dict, bs: int, lang: str) -> tuple[str, str]:
    """(the checkpoint cell's short text, the sentence of where it was saved)."""
    if key not in saved_at:
        return key[:6], t(lang, "groups.saved_before", key=key[:8])
    tokens, rid = saved_at[key]
    said = t(lang, "groups.saved", tokens=tokens, block=tokens // bs - 1, key=key[:8]) + \
        (t(lang, "groups.saved_by", rid=rid) if rid else t(lang, "groups.saved_earlier"))
    return t(lang, "groups.tokens_short", n=tokens), said


def recurrent_head(g, lang: str) -> str:
    return t(lang, "groups.recurrent", s=plural(g.layers), layers=layer_ranges(g.layers), size=g.size,
             running=len(g.block_tables), checkpoints=len(g.checkpoints), free=g.free)


def recurrent_html(g, frame: GroupFrame, bs: int, lang: str) -> str:
    running = {table[0]: rid for rid, table in g.block_tables.items()}
    checkpoint = {slot: key for key, slot in g.checkpoints.items()}
    out = [f"<div>{recurrent_head(g, lang)}</div>", f"<div style='{NOTE}'>{t(lang, 'groups.recurrent_why')}</div>"]
    cells, slot = [], 0
    while slot < g.size:
        if slot not in running and slot not in checkpoint:  # a run of free slots is one cell (48 slots on a phone)
            last = slot
            while last + 1 < g.size and last + 1 not in running and last + 1 not in checkpoint:
                last += 1
            span = f"{slot}–{last}" if last > slot else str(slot)
            cells.append(cell(f"{span}·{t(lang, 'groups.free_word')}", t(lang, "groups.slot_free", slot=span),
                              FREE_BG, slot=slot, state="free", last=last))
            slot = last + 1
            continue
        if slot in running:
            rid = running[slot]
            cells.append(cell(f"{slot}·{rid}", t(lang, "groups.slot_running", slot=slot, rid=rid), request_color(rid),
                              slot=slot, state="running", holder=rid))
        else:
            short, said = saved_words(checkpoint[slot], frame.saved_at, bs, lang)
            cells.append(cell(f"{slot}·{short}", t(lang, "groups.slot_checkpoint", slot=slot, saved=said),
                              CHECKPOINT_BG, slot=slot, state="checkpoint", key=checkpoint[slot][:16]))
        slot += 1
    out.append(f"<div class='kvg-slots' style='{ROW}'>{''.join(cells)}</div>")
    lines = [t(lang, "groups.resumed", rid=rid, slot=g.block_tables[rid][0], source=frame.resumed[rid])
             if rid in frame.resumed else t(lang, "groups.holds", rid=rid, slot=g.block_tables[rid][0])
             for rid in sorted(g.block_tables, key=natural_key)]
    lines.append(t(lang, "groups.checkpoints_head") if checkpoint else t(lang, "groups.no_checkpoints"))
    lines += ["· " + t(lang, "groups.slot_checkpoint", slot=slot, saved=saved_words(key, frame.saved_at, bs, lang)[1])
              for slot, key in sorted(checkpoint.items())]
    out += [f"<div style='{NOTE}' class='kvg-line'>{line}</div>" for line in lines]
    return "".join(out)


def groups_html(frame: GroupFrame, bs: int, shows: str, lang: str = EN) -> str:
    """Every group of the frame: the full one in a line (the map above draws it), the others' tables."""
    parts = [t(lang, "groups.heading", step=frame.step, shows=shows)]
    for g in frame.groups:
        if g.kind == "full_attention":
            used = len({b for table in g.block_tables.values() for b in table})
            body = t(lang, "groups.full", s=plural(g.layers), layers=layer_ranges(g.layers), size=g.size, bs=bs,
                     used=used)
        elif g.kind == "sliding_window":
            body = sliding_head(g, lang) if frame.counts_only else sliding_html(g, bs, lang)
        elif g.kind == "kv_shared":  # Gemma 4: no blocks of its own, its layers read other layers' blocks
            body = t(lang, "groups.shared", s=plural(g.layers), layers=layer_ranges(g.layers),
                     reads=shared_reads(g.reads))
        else:
            body = recurrent_head(g, lang) if frame.counts_only else recurrent_html(g, frame, bs, lang)
        parts.append(f"<div class='kvg-group' data-group='{g.kind}' style='margin:6px 0 10px'>{body}</div>")
    return f"<div id='kv-groups-body'>{''.join(parts)}</div>"


def chain_tokens(nodes, bs: int) -> dict[str, int]:
    """Block key -> the tokens up to its block's end, for every cached block whose chain reaches a root."""
    by_block = {n.block_id: n for n in nodes}
    out: dict[str, int] = {}

    def tokens(n) -> int | None:
        if n.key not in out:
            if n.parent_key is None:
                out[n.key] = bs
            else:
                parent = by_block.get(n.parent_block)
                up = tokens(parent) if parent is not None else None
                if up is None:
                    return None
                out[n.key] = up + bs
        return out[n.key]
    for n in nodes:
        tokens(n)
    return out


def frame_for(run, engine, at, totals_only: bool = False) -> GroupFrame | None:
    """The groups of the frame the map shows: the run's replayed step `at`, else the engine now (None: a model with
    one group). totals_only (a shared deployment's visitor before their own run): sizes only, never who holds what."""
    snap = engine.snapshot()
    if not hybrid(snap.groups):
        return None
    events = run.all_events() if run is not None else []
    frame = None
    if run is not None and at is not None:
        try:
            step = max(run.start_step, min(int(at), snap.step))
            frame = group_frame(events, snap.groups, run.frame(events, step), engine.config.block_size, run.base)
        except ValueError:  # the ring dropped events this run needs: the engine now
            frame = None
    frame = frame or live_frame(snap, [e for e in events if run is None or e.seq > run.start_seq])
    unknown = [k for g in frame.groups for k in g.checkpoints if k not in frame.saved_at]
    if unknown:  # saved before the run: where, from the prefix cache's chains (while their blocks are cached)
        depth = chain_tokens(engine.prefix_tree(), engine.config.block_size)
        frame.saved_at.update({k: (depth[k], None) for k in unknown if k in depth})
    if totals_only and run is None:
        frame.counts_only, frame.saved_at, frame.resumed = True, {}, {}
    return frame


def attach(view_of, block_map: gr.Plot, pinned: gr.State) -> gr.HTML:
    """The group views, redrawn whenever the block map is (the same frame: live, or the replayed `pinned` step).
    view_of(request) -> (run or None, engine, totals_only)."""
    box = gr.HTML(visible=False, elem_id="kv-groups", label=L("groups.label"))

    def draw(at, request: gr.Request):
        run, engine, totals_only = view_of(request)
        lang = lang_of(request)
        frame = frame_for(run, engine, at, totals_only)
        if frame is None:
            return gr.update(visible=False, value="")
        shows = t(lang, "kv.live_word" if at is None or run is None else "groups.replayed")
        return gr.update(visible=True, value=groups_html(frame, engine.config.block_size, shows, lang))

    block_map.change(draw, pinned, box, api_name=False, show_progress="hidden", trigger_mode="always_last",
                     concurrency_id="kv_groups", concurrency_limit=2)
    return box
