"""Watch an external KV-event stream (vLLM, SGLang, another minivlm) from the KV tab: the prefix tree drawn from
its BlockStored / BlockRemoved events with the tab's own tree drawing, image blocks from extra_keys, and the
stream's counters (events, gaps and what replay recovered, restarts, decode errors, the dialect it speaks)."""
import threading

import gradio as gr

from minivlm.kv_events.view import image_ids
from minivlm.kv_events.watcher import KVEventWatcher
from panels.prefix_tree import tree_figure
from panels.i18n import EN, L, t

POLL_S = 1.0


class Watching:
    """The app's one watcher (an operator's choice, like the engine): replaced when another target is set."""

    def __init__(self):
        self.lock = threading.Lock()
        self.watcher: KVEventWatcher | None = None

    def start(self, target: str, replay: str | None) -> KVEventWatcher:
        new = KVEventWatcher(target.strip(), (replay or "").strip() or None)  # ValueError on a bad address
        with self.lock:
            old, self.watcher = self.watcher, new
        if old is not None:
            old.close()
        return new

    def get(self) -> KVEventWatcher | None:
        with self.lock:
            return self.watcher


def status_markdown(w: KVEventWatcher | None) -> str:
    if w is None:
        return t(EN, "watch.idle")
    s = w.view.summary()
    c = s["counts"]
    dialects = ", ".join(f"{d} ({n})" for d, n in s["dialects"].items()) or "none yet"
    errors = ", ".join(f"{r}: {n}" for r, n in s["decode_errors"].items()) or "none"
    events = ", ".join(f"{k} {c.get(k, 0)}" for k in ("BlockStored", "BlockRemoved", "AllBlocksCleared"))
    lines = [f"**Watching** `{w.endpoint}`" + (f" topic `{w.topic}`" if w.topic else " (every topic)")
             + (f", replay `{w.replay_endpoint}`" if w.replay_endpoint else ", no replay socket"),
             f"batches {c.get('batches', 0)} (last seq {s['last_seq']}) · events: {events} · "
             f"{s['blocks']} blocks cached, {s['image_blocks']} with images",
             f"gaps {c.get('gaps', 0)} missed batches, {c.get('recovered', 0)} recovered by replay · "
             f"publisher restarts {c.get('restarts', 0)} · decode errors: {errors} · dialect: {dialects}"]
    if c.get("joined_at"):
        lines.append(f"joined a running stream at seq {c['joined_at']}: blocks stored before are not shown")
    if s["last_error"]:
        lines.append(f"last problem: {s['last_error']}")
    if s["recent"]:
        lines.append("recent: " + " · ".join(reversed(s["recent"][-6:])))
    return "\n\n".join(lines)


def figure(w: KVEventWatcher | None):
    if w is None:
        return None
    nodes, extra = w.view.tree(), w.view.extra_keys()

    def hover(n):
        ids = image_ids(extra.get(n.key))
        parent = ("root (a prompt's first block)" if n.parent_key is None else f"block #{n.parent_block}"
                  if n.parent_block is not None else "not in the stream (evicted, or stored before we joined)")
        return (f"#{n.block_id} · {n.kind} · {n.num_tokens} tokens<br>hash {n.key[:16]}…<br>parent: {parent}"
                + (f"<br>images: {', '.join(i[:12] + '…' for i in ids)}" if ids else ""))
    roots = sum(n.parent_key is None for n in nodes)
    title = (f"Watched prefix cache: {len(nodes)} blocks, {roots} root{'s' if roots != 1 else ''} "
             f"<br><sup>drawn from the publisher's KV events · numbers: order of arrival · orange / purple: the block "
             f"carries an image identifier in extra_keys</sup>")
    return tree_figure(nodes, hover_of=hover, title=title)


def build(watching: Watching, shared: bool):
    """The watch section (api names: kv_watch, kv_watch_poll). On a shared deployment visitors cannot point the
    server at an address of their choosing: only the --watch-kv-events flag sets it."""
    with gr.Accordion(L("watch.accordion"), open=watching.get() is not None):
        w = watching.get()
        with gr.Row():
            target = gr.Textbox(f"{w.endpoint}#{w.topic}" if w and w.topic else (w.endpoint if w else ""),
                                label=L("watch.target"), elem_id="kv-watch-target",
                                interactive=not shared, scale=3)
            replay = gr.Textbox(w.replay_endpoint or "" if w else "", label=L("watch.replay"),
                                elem_id="kv-watch-replay", interactive=not shared, scale=2)
            go = gr.Button(L("watch.go"), elem_id="kv-watch-go", interactive=not shared, scale=1)
        status = gr.Markdown(L("watch.idle") if w is None else status_markdown(w), elem_id="kv-watch-status", label=L("watch.status"))
        tree = gr.Plot(label=L("watch.tree"), elem_id="kv-watch-tree")
        seen = gr.State(None)
        timer = gr.Timer(POLL_S)

    def start(publisher, replay_endpoint):
        if shared:
            raise gr.Error("a shared deployment watches only what its operator set with --watch-kv-events")
        try:
            new = watching.start(publisher, replay_endpoint)
        except ValueError as e:
            raise gr.Error(str(e)) from None
        return status_markdown(new), figure(new), None

    def poll(shown):
        w = watching.get()
        now = None if w is None else (id(w), w.view.counts["messages"])
        if now == shown:
            return gr.skip(), gr.skip(), shown
        return status_markdown(w), figure(w), now

    go.click(start, [target, replay], [status, tree, seen], api_name="kv_watch")
    timer.tick(poll, seen, [status, tree, seen], api_name="kv_watch_poll", show_progress="hidden")
    return status, tree
