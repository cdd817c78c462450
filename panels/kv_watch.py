"""Watch an external KV-event stream (vLLM, SGLang, another minivlm) from the KV tab: the prefix tree drawn from
its BlockStored / BlockRemoved events with the tab's own tree drawing, image blocks from extra_keys, and the
stream's counters (events, gaps and what replay recovered, restarts, decode errors, the dialect it speaks)."""
import logging
import threading
import time

import gradio as gr

from minivlm.kv_events.view import image_ids
from minivlm.kv_events.watcher import KVEventWatcher
from panels.prefix_tree import tree_figure
from panels.i18n import EN, L, lang_of, t

POLL_S = 1.0
# the first line of the status: what the stream is doing (KVEventWatcher.state), each state's sentence
STATE_LINES = {"no_publisher": "watch.state.no_publisher", "waiting": "watch.state.waiting",
               "receiving": "watch.state.receiving", "quiet": "watch.state.quiet", "gone": "watch.state.gone",
               "decode_errors": "watch.state.decode_errors"}
log = logging.getLogger("minivlm.kv_watch")


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


def duration(seconds: float | None, lang: str = EN) -> str:
    """"12 s", then "3 min" in `lang` (whole seconds, then whole minutes: the page redraws it only when it
    changes)."""
    n = int(seconds or 0)
    return t(lang, "watch.seconds", n=n) if n < 60 else t(lang, "watch.minutes", m=n // 60)


def state_line(w: KVEventWatcher, lang: str = EN, now: float | None = None) -> str:
    """What the stream is doing, in `lang`: connected and receiving, waiting (nothing listening, or no data yet),
    no data for N s, publisher gone, decode errors; and when the last batch arrived."""
    st = w.state(now)
    at = time.strftime("%H:%M:%S", time.localtime(st["last_batch_wall"])) if st["last_batch_wall"] else \
        t(lang, "watch.never")
    n = st["summary"]["errors_since_batch"]
    return t(lang, STATE_LINES[st["state"]], endpoint=w.endpoint, attempts=st["attempts"],
             waited=duration(st["waited"], lang), ago=duration(st["silent"], lang),
             since=duration(st["since"], lang), at=at, n=n, s="s" if n != 1 else "")


def status_markdown(w: KVEventWatcher | None, lang: str = EN, now: float | None = None) -> str:
    if w is None:
        return t(lang, "watch.idle")
    line = state_line(w, lang, now)
    s = w.view.summary()
    c = s["counts"]
    dialects = ", ".join(f"{d} ({n})" for d, n in s["dialects"].items()) or t(lang, "watch.none_yet")
    errors = ", ".join(f"{r}: {n}" for r, n in s["decode_errors"].items()) or t(lang, "watch.none")
    events = ", ".join(f"{k} {c.get(k, 0)}" for k in ("BlockStored", "BlockRemoved", "AllBlocksCleared"))
    topic = t(lang, "watch.topic", topic=w.topic) if w.topic else t(lang, "watch.every_topic")
    replay = t(lang, "watch.replay_at", endpoint=w.replay_endpoint) if w.replay_endpoint else \
        t(lang, "watch.no_replay")
    lines = [line, t(lang, "watch.watching", endpoint=w.endpoint, topic=topic, replay=replay),
             t(lang, "watch.counters", batches=c.get("batches", 0), seq="–" if s["last_seq"] is None else s["last_seq"],
               events=events, blocks=s["blocks"], images=s["image_blocks"]),
             t(lang, "watch.stream", gaps=c.get("gaps", 0), recovered=c.get("recovered", 0),
               restarts=c.get("restarts", 0), errors=errors, dialects=dialects)]
    if c.get("joined_at"):
        lines.append(t(lang, "watch.joined", seq=c["joined_at"]))
    if s["last_error"]:
        lines.append(t(lang, "watch.last_problem", error=s["last_error"]))
    if s["recent"]:
        lines.append(t(lang, "watch.recent", items=" · ".join(reversed(s["recent"][-6:]))))
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

    def start(publisher, replay_endpoint, request: gr.Request = None):
        lang = lang_of(request)
        if shared:  # a refusal, not a fault: no traceback in the log
            raise gr.Error(t(lang, "watch.shared"), print_exception=False)
        try:
            new = watching.start(publisher, replay_endpoint)
        except ValueError as e:
            log.warning("KV watch of %r refused: %s", publisher, e)  # one line in the log, not a traceback
            raise gr.Error(t(lang, "watch.refused", error=str(e)), print_exception=False) from None
        text = status_markdown(new, lang)
        return text, figure(new), (id(new), new.view.counts["messages"], text)

    def poll(shown, request: gr.Request = None):
        """Every POLL_S: the status when its words changed (the state line counts seconds), the tree when a
        message came."""
        w = watching.get()
        text = status_markdown(w, lang_of(request))
        now = (None, None) if w is None else (id(w), w.view.counts["messages"])
        was, said = (tuple(shown[:2]), shown[2]) if shown else ((None, None), None)
        if now == was and text == said:
            return gr.skip(), gr.skip(), shown
        return text if text != said else gr.skip(), figure(w) if now != was else gr.skip(), (*now, text)

    go.click(start, [target, replay], [status, tree, seen], api_name="kv_watch")
    timer.tick(poll, seen, [status, tree, seen], api_name="kv_watch_poll", show_progress="hidden")
    return status, tree
