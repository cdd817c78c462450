"""Per KV block, what went into its prefix-cache key under A, B and C, side by side. With a second request, each
key is green where both requests get the same key (the second would reuse the first's block) and red where they
differ, and every input that differs is highlighted with the second request's value next to it."""
import html
import itertools
import os

from minivlm.engine.anatomy import KEY_STRATEGIES

from panels.i18n import EN, t

SAME, DIFFERENT, NONE = "#d9f2d9", "#f8d4d4", "#f1f1f1"
EDGE = {SAME: "#1d6b40", DIFFERENT: "#a5281b", NONE: "#bbbbbb"}
INK, FAINT = "#1f2937", "#555"  # text on the pastel cells: dark in both page themes (their background is fixed)
MARK = f"<mark style='background:#ffe066;color:{INK}'>"  # a differing input, highlighted alike in both themes
SUBDUED = "opacity:0.8"  # muted text on the page's own background, in the theme's own text colour
WHAT = {s: t(EN, f"keys.what.{s}") for s in "ABC"}  # what each strategy's key holds beyond the parent key


def run_length(ids: list[int]) -> str:
    """Token ids with repeats folded: 1 361 205 3 5×12."""
    return " ".join(f"{k}×{n}" if n > 1 else str(k) for k, n in ((k, len(list(g))) for k, g in itertools.groupby(ids)))


def extra_fields(item) -> list[tuple[str, str]]:
    """One element of a key's extra material as named, readable fields."""
    if isinstance(item, str):  # B: an image's content hash
        return [("image", item[:12])]
    if item[0] == "model":
        return [("model", f"{os.path.basename(str(item[1]).rstrip('/'))} · {item[2]}")]
    if item[0] == "salt":
        return [("salt", str(item[1])[:24])]
    digest, grid, tiles, settings, offset = item  # C: an image overlapping the block
    if settings and settings[0] == "video processor":  # C: a video: its processor, then which frames, at what fps
        lo, hi = settings[5:7]
        _, frames, indices, total, fps, aimed, _, per_pair, _ = settings[11:20]
        return [("video", digest[:12]), ("frames", f"{len(indices)} of {total} · {frames[:8]}"),
                ("fps", f"{fps:g}" + (f" → {aimed:g}" if aimed else "")), ("s / pair", f"{per_pair:.3g}"),
                ("grid", "×".join(map(str, grid))), ("pixels", f"{lo:,}–{hi:,}"), ("at slot", str(offset))]
    if grid is not None:  # Qwen-VL: the patch grid and the pixel range
        lo, hi, patch, merge = settings[:4]
        return [("image", digest[:12]), ("grid", "×".join(map(str, grid))), ("pixels", f"{lo:,}–{hi:,}"),
                ("patch", str(patch)), ("merge", str(merge)), ("at slot", str(offset))]
    named = [s for s in settings if isinstance(s, tuple) and s and isinstance(s[0], str)]  # tiling settings
    return ([("image", digest[:12]), ("tiles", "×".join(map(str, tiles)) if tiles else "not split")]
            + [(s[0], "–".join(map(str, s[1:]))) for s in named] + [("at slot", str(offset))])


def key_lines(anatomy, i: int, strategy: str) -> list[list[tuple[str, str]]]:
    """Everything hashed into block i's key under `strategy`, as lines of named fields: parent key and token ids,
    then one line per element of the extra material."""
    b = anatomy.blocks[i]
    parent = anatomy.blocks[i - 1].keys[strategy][:10] + "…" if i else "root"
    ids = [t.token_id for t in anatomy.tokens[b.start:b.end]]
    return [[("parent", parent), ("tokens", run_length(ids))]] + [extra_fields(x) for x in b.key_inputs[strategy]]


def numbered(lines) -> dict[tuple[str, int], str]:
    """(name, k-th occurrence) -> value, so two requests' fields line up."""
    seen: dict[str, int] = {}
    out = {}
    for name, value in (f for line in lines for f in line):
        seen[name] = seen.get(name, -1) + 1
        out[(name, seen[name])] = value
    return out


def field_html(name: str, value: str, theirs: dict | None, slot: tuple[str, int]) -> str:
    text = html.escape(value)
    if theirs is not None and theirs.get(slot) != value:
        text = f"{MARK}{text}</mark> ≠ {MARK}{html.escape(theirs.get(slot, '—'))}</mark>"
    return f"<span style='color:{FAINT}'>{name}</span> {text}"


def cell(first, second, i: int, strategy: str) -> str:
    lines = key_lines(first, i, strategy)
    theirs = numbered(key_lines(second, i, strategy)) if second and i < len(second.blocks) else None
    key = first.blocks[i].keys[strategy]
    other = second.blocks[i].keys[strategy] if theirs is not None else None
    color = NONE if key is None or other is None else SAME if key == other else DIFFERENT
    verdict = {SAME: " = same key", DIFFERENT: " ≠ different key", NONE: ""}[color]
    shown = key[:12] + '…' if key else 'no key (partial block)'
    out = [f"<b style='color:{INK}'>{strategy}</b> <code style='color:{INK};background:none'>{shown}</code>"
           f"<span style='color:{EDGE[color]}'>{verdict}</span>"]
    seen: dict[str, int] = {}
    for line in lines:
        parts = []
        for name, value in line:
            seen[name] = seen.get(name, -1) + 1
            parts.append(field_html(name, value, theirs, (name, seen[name])))
        out.append(" · ".join(parts))
    mine = numbered(lines)
    if theirs is not None:
        extra = [f"<span style='color:{FAINT}'>{name}</span> — ≠ {MARK}{html.escape(v)}</mark>"
                 for (name, k), v in theirs.items() if (name, k) not in mine]
        out += [" · ".join(extra)] if extra else []
    return (f"<td style='background:{color};color:{INK};border-left:4px solid {EDGE[color]};padding:4px 8px;"
            f"vertical-align:top;"
            f"font:12px/1.45 ui-monospace,monospace'>" + "<br>".join(out) + "</td>")


def keys_html(first, second=None, names=None, lang: str = EN) -> str:
    """The key table of `first`, compared block by block with `second` when given."""
    names = names or (t(lang, "keys.request", n=1), t(lang, "keys.request", n=2))
    head = "".join(f"<th style='text-align:left;padding:4px 8px'>{s} <span style='font-weight:normal;{SUBDUED}'>"
                   f"({t(lang, f'keys.what.{s}')})</span></th>" for s in KEY_STRATEGIES)
    rows = []
    for b in first.blocks:
        label = t(lang, "keys.block", i=b.index, style=SUBDUED, first=b.start, last=b.end - 1,
                  kind=t(lang, f"kind.{b.kind}") if lang != EN else b.kind)
        rows.append(f"<tr><td style='padding:4px 8px;vertical-align:top;white-space:nowrap'>{label}</td>"
                    + "".join(cell(first, second, b.index, s) for s in KEY_STRATEGIES) + "</tr>")
    if second is None:
        note = t(lang, "keys.add_second")
    else:
        note = t(lang, "keys.compare", a=names[0], b=names[1], same_open=f"<span style='background:{SAME};color:{INK}'>",
                 diff_open=f"<span style='background:{DIFFERENT};color:{INK}'>", mark=MARK)
    return (f"<div id='anatomy-keys-table'><p style='margin:4px 0'>"
            f"{t(lang, 'keys.intro', strategy=first.strategy, note=note)}</p>"
            f"<table style='border-collapse:separate;border-spacing:0 4px;width:100%'><tr><th></th>{head}</tr>"
            + "".join(rows) + "</table></div>")
