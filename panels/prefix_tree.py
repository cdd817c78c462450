"""The prefix cache as a tree (engine.prefix_tree(): the block manager's state now): each cached block a node, an
edge from the block its key chains on. A prefix hit walks down from a root while keys match; requests sharing a
prefix share a path and branch where they differ. The next block the free queue will overwrite is ringed red."""
import gradio as gr
import plotly.graph_objects as go

from panels.anatomy_figures import MARGIN_X, needs_width
from panels.i18n import EN, L, lang_of, t


KIND_COLORS = {"text": "#7eaef5", "image": "#f2a65a", "mixed": "#b28ae8", "video": "#e05d8c"}
NEXT_EVICTED = "#d62728"
ROW_PX, MAX_HEIGHT = 44, 900  # a row of the tree, the figure at most (more rows: smaller nodes)
# a chain of up to LABELLED_DEPTH blocks: 22-px nodes labelled with their ids, DEPTH_PX apart; a longer one (a long
# chat's) is drawn compact, ids in the hover only. The figure asks for that width; a narrower screen scrolls it
LABELLED_DEPTH, DEPTH_PX, COMPACT_DEPTH_PX = 40, 30, 14
LEGEND_PX = 190  # the legend right of the tree


def pale(color: str, share: float = 0.55) -> str:
    """`color` mixed with white: a cached (free) block, the same colour behind its label in both themes (an
    opacity would let the dark page through, under dark label text)."""
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(v + (255 - v) * share):02x}" for v in rgb)


def nice_step(at_least: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is at least `at_least` (axis ticks that never collide)."""
    step = 1
    while step < at_least:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2
    return step


def layout(nodes) -> dict[int, tuple[int, float]]:
    """block id -> (depth, row): children to the right of their parent, each leaf its own row, a parent centred
    on its children; roots (and orphans, whose parent was evicted) in block-id order."""
    children: dict[int, list] = {}
    for n in nodes:
        if n.parent_block is not None:
            children.setdefault(n.parent_block, []).append(n)
    pos, next_row = {}, [0]

    def place(n, depth):
        kids = children.get(n.block_id, [])
        for k in kids:
            place(k, depth + 1)
        if kids:
            row = sum(pos[k.block_id][1] for k in kids) / len(kids)
        else:
            row, next_row[0] = next_row[0], next_row[0] + 1
        pos[n.block_id] = (depth, row)

    for root in (n for n in nodes if n.parent_block is None):
        place(root, 0)
    return pos


def hover(n, lang: str = EN) -> str:
    from panels.plots import kind_word
    state = (t(lang, "tree.in_use", n=n.ref_count, s="s" if n.ref_count > 1 else "") if n.ref_count else
             t(lang, "tree.cached", n=n.evicted_after, s="s" if n.evicted_after != 1 else "", rank=n.eviction_rank))
    parent = (t(lang, "tree.root") if n.parent_key is None else
              t(lang, "tree.parent_block", id=n.parent_block) if n.parent_block is not None else t(lang, "tree.orphan"))
    return t(lang, "tree.hover", id=n.block_id, kind=kind_word(n.kind, lang), n=n.num_tokens, key=n.key[:16],
             parent=parent, state=state)


def tree_figure(nodes, hover_of=hover, title: str | None = None, lang: str = EN) -> go.Figure:
    """The forest: one trace for the edges, one per block kind for the nodes, labels with block id and ref count.
    hover_of and title let another source of nodes (a watched KV-event stream, panels/kv_watch.py) say its own."""
    pos = layout(nodes)
    depths = 1 + max((p[0] for p in pos.values()), default=0)
    rows = 1 + max((p[1] for p in pos.values()), default=0)
    row_px = min(ROW_PX, (MAX_HEIGHT - 190) / rows)
    depth_px = DEPTH_PX if depths <= LABELLED_DEPTH else COMPACT_DEPTH_PX
    node = min(22 if depths <= LABELLED_DEPTH else 10, row_px - 6)
    labelled = node >= 16
    fig = go.Figure()
    ex, ey = [], []
    for n in nodes:
        if n.parent_block is not None:
            (x0, y0), (x1, y1) = pos[n.parent_block], pos[n.block_id]
            ex += [x0, x1, None]
            ey += [y0, y1, None]
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#999", width=1.5), hoverinfo="skip",
                             name="key chains on parent", showlegend=False))
    for kind, color in KIND_COLORS.items():
        group = [n for n in nodes if n.kind == kind]
        if kind == "video" and not group:  # only video models have them: no empty legend entry elsewhere
            continue
        fig.add_trace(go.Scatter(
            x=[pos[n.block_id][0] for n in group], y=[pos[n.block_id][1] for n in group],
            name=t(lang, "tree.kind_block", kind=t(lang, f"kind.{kind}") if lang != EN else kind),
            mode="markers+text" if labelled else "markers", textposition="middle center", hoverinfo="text",
            hovertext=[hover_of(n, lang) if hover_of is hover else hover_of(n) for n in group],
            text=[str(n.block_id) for n in group], textfont=dict(size=9, color="#111"),
            marker=dict(size=node, symbol="square", color=[color if n.ref_count else pale(color) for n in group],
                        line=dict(width=[2.5 if n.ref_count > 1 else 1 for n in group], color="#222"))))
    shared = [n for n in nodes if n.ref_count > 1]  # the ref count on a dark disc at the node's corner
    fig.add_trace(go.Scatter(x=[pos[n.block_id][0] + 0.28 for n in shared],
                             y=[pos[n.block_id][1] - 0.3 for n in shared],
                             text=[f"×{n.ref_count}" for n in shared], mode="markers+text" if labelled else "markers",
                             hoverinfo="skip", name="ref count", showlegend=False,
                             textfont=dict(size=9, color="white"),
                             marker=dict(symbol="circle", size=18 if labelled else 7,
                                         color="rgba(20, 20, 20, 0.85)")))  # both themes
    nxt = [n for n in nodes if n.eviction_rank == 0]
    fig.add_trace(go.Scatter(x=[pos[n.block_id][0] for n in nxt], y=[pos[n.block_id][1] for n in nxt],
                             mode="markers", name=t(lang, "tree.next_evicted"), hoverinfo="skip",
                             marker=dict(size=node + 10, symbol="square-open", color=NEXT_EVICTED,
                                         line=dict(width=3))))
    orphans = sum(n.orphan for n in nodes)
    in_use = sum(n.ref_count > 0 for n in nodes)  # the rest: the block map's "cached" (free, found by a lookup)
    roots = sum(n.parent_key is None for n in nodes)
    branches = sum(1 for n in nodes if sum(m.parent_block == n.block_id for m in nodes) > 1)
    fig.update_layout(
        title=dict(font=dict(size=14), text=title or t(
            lang, "tree.title", n=len(nodes), in_use=in_use, free=len(nodes) - in_use, roots=roots, s_roots="s" if roots != 1 else "", branches=branches,
            s_branches="s" if branches != 1 else "", orphans=t(lang, "tree.orphans", n=orphans) if orphans else "")),
        height=190 + int(rows * row_px), margin=dict(l=10, r=10, t=100, b=10),
        # ticks far enough apart for their numbers (12 px, up to 3 digits); the axis title below them (automargin)
        xaxis=dict(title=t(lang, "tree.axis"), dtick=nice_step(28 / depth_px), zeroline=False, showgrid=False,
                   automargin=True, range=[-0.6, depths - 0.4]),
        yaxis=dict(visible=False, range=[rows - 0.4, -0.6]), legend=dict(x=1.01, y=1))
    return needs_width(fig, depth_px * (depths + 0.2) + LEGEND_PX + MARGIN_X)


def attach(engine_of, block_map: gr.Plot) -> gr.Plot:
    """A tree view that redraws whenever the block map changes, from the state of the engine the map shows:
    engine_of(request) (on a shared deployment a stepping session's own engine, not the shared one)."""
    tree = gr.Plot(label=L("kv.tree"), elem_id="kv-tree")

    def draw(request: gr.Request):
        engine, lang = engine_of(request), lang_of(request)
        if engine is None:
            return tree_figure([], title=t(lang, "tree.none_yet"), lang=lang)
        return tree_figure(engine.prefix_tree(), lang=lang)

    # its own queue slot: the map's poll never waits behind a tree that waits for the engine's current step
    block_map.change(draw, None, tree, api_name=False,
                     show_progress="hidden", trigger_mode="always_last", concurrency_id="kv_tree",
                     concurrency_limit=1)
    return tree
