"""The prefix tree as a subscriber sees it: built from BlockStored / BlockRemoved / AllBlocksCleared alone, with
the counters of the stream (events, gaps, replays, restarts, decode errors, dialects). Sockets live in watcher.py;
this is the state, fed one message at a time, so it is the same for a live stream and for a test."""
import re
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

from minivlm.kv_events.decode import Batch, DecodeError, decode_batch, decode_frames
from minivlm.kv_events.tree import TreeNode

HEXID = re.compile(r"^[0-9a-f]{32,}$")


def image_ids(extra) -> list[str]:
    """The image identifiers among a block's extra keys: hex digests (vLLM's mm hashes, minivlm's content
    hashes), alone or first in a tuple; anything else (a cache_salt, a LoRA name) is not an image."""
    ids = []
    for e in extra or ():
        head = e[0] if isinstance(e, (list, tuple)) and e else e
        if isinstance(head, str) and HEXID.match(head):
            ids.append(head)
    return ids


@dataclass
class Node:
    key: str
    parent: str | None
    token_ids: list[int]
    extra: list | None
    order: int       # arrival order: the node's label in the drawing
    count: int = 1   # stores minus removals of this hash (vLLM may hold one hash in several blocks)

    @property
    def kind(self) -> str:
        """text, or image (all one placeholder token) / mixed when the block carries an image identifier."""
        if not image_ids(self.extra):
            return "text"
        return "image" if len(set(self.token_ids)) == 1 else "mixed"


class TreeView:
    """Feed it messages (feed_frames) in arrival order; `replay(start_seq)`, if given, returns the missed
    (seq, payload) pairs from the publisher's replay socket. `clock` (monotonic seconds) times the arrivals, so the
    watcher can say how long the stream has been silent."""

    def __init__(self, replay=None, clock=time.monotonic):
        self.replay, self.clock = replay, clock
        self.last_message_at: float | None = None  # clock() of the last message of any kind
        self.last_batch_at: float | None = None    # ... of the last batch applied, and its wall-clock time
        self.last_batch_wall: float | None = None
        self.last_error_at: float | None = None    # ... of the last message that did not decode
        self.errors_since_batch = 0                # messages that did not decode since the last good batch
        self.lock = threading.Lock()
        self.nodes: dict[str, Node] = {}
        self.counts = Counter()   # messages, batches, and per event type; gaps, recovered, restarts, ...
        self.errors = Counter()   # decode errors by reason
        self.dialects = Counter()
        self.last_seq: int | None = None
        self.replayed: set[int] = set()  # batches caught up from the replay socket whose live copy has not come yet
        self.last_error, self.topic, self.orders = "", None, 0
        self.recent: deque[str] = deque(maxlen=12)  # one line per batch, newest last: evictions as they happen

    def feed_frames(self, frames: list[bytes]):
        with self.lock:
            self.counts["messages"] += 1
            self.last_message_at = self.clock()
            try:
                batch = decode_frames(frames)
            except DecodeError as e:
                self._error(e)
                return
            if batch.seq in self.replayed:  # already applied from the replay socket (caught up before it came)
                self.replayed.discard(batch.seq)
                self.counts["duplicates"] += 1
                return
            self._sequence(batch.seq)
            self._apply(batch)

    def catch_up(self):
        """Ask the replay socket for every batch after the last one seen: what a SUB socket misses before its
        subscription reaches the publisher, when no later batch comes to reveal the gap."""
        with self.lock:
            self._recover(0 if self.last_seq is None else self.last_seq + 1, None)

    def _error(self, e: DecodeError):
        self.errors[e.reason] += 1
        self.last_error = str(e)[:200]
        self.last_error_at = self.clock()
        self.errors_since_batch += 1

    def _sequence(self, seq: int):
        """Gap and restart handling before `seq` is applied."""
        if self.last_seq is not None and seq <= self.last_seq:
            self.counts["restarts"] += 1  # sequence numbers went back: a new publisher, its cache starts empty
            self.nodes.clear()
            self.replayed.clear()
            self.last_seq = None
            expected = 0
        else:
            expected = 0 if self.last_seq is None else self.last_seq + 1
        if seq > expected:
            if self.last_seq is None and not self.counts["batches"] and self.replay is None:
                self.counts["joined_at"] = seq  # joined a running stream: what came before is unknown
            else:
                self.counts["gaps"] += seq - expected
            self._recover(expected, seq)

    def _recover(self, start: int, end: int):
        if self.replay is None:
            return
        try:
            missed = self.replay(start)
        except Exception as e:  # a replay socket that does not answer: the gap stays
            self.counts["replay_failures"] += 1
            self.last_error = f"replay from {start} failed: {e}"[:200]
            return
        for seq, payload in missed:
            if start <= seq and (end is None or seq < end):
                try:
                    self._apply(decode_batch(seq, self.topic or "", payload))
                    self.counts["recovered"] += 1
                    if end is None:  # a gap found by asking: counted as one; its live copy, if it still
                        self.counts["gaps"] += 1  # arrives, is skipped, not taken for a restart
                        self.replayed.add(seq)
                except DecodeError as e:
                    self._error(e)

    def _apply(self, batch: Batch):
        self.counts["batches"] += 1
        self.last_seq, self.topic = batch.seq, batch.topic
        self.last_batch_at, self.last_batch_wall, self.errors_since_batch = self.clock(), time.time(), 0
        if batch.dialect:
            self.dialects[batch.dialect] += 1
        for tag in batch.unknown:
            self.errors["unknown event type"] += 1
            self.last_error = f"unknown event type {tag!r} (skipped)"
        seen = Counter()
        for ev in batch.events:
            self.counts[ev.kind] += 1
            seen[ev.kind] += len(ev.hashes) or 1
            if ev.kind == "AllBlocksCleared":
                self.nodes.clear()
            elif ev.kind == "BlockRemoved":
                for h in ev.hashes:
                    node = self.nodes.get(h)
                    if node is not None:
                        node.count -= 1
                        if node.count <= 0:
                            del self.nodes[h]
            else:
                self._stored(ev)
        parts = [f"+{seen['BlockStored']} stored"] * bool(seen["BlockStored"]) + \
            [f"-{seen['BlockRemoved']} evicted"] * bool(seen["BlockRemoved"]) + ["all cleared"] * bool(seen["AllBlocksCleared"])
        self.recent.append(f"seq {batch.seq}: {', '.join(parts) or 'no block events'}")

    def _stored(self, ev):
        parent, bs = ev.parent, ev.block_size
        extras = ev.extra_keys or [None] * len(ev.hashes)
        for i, h in enumerate(ev.hashes):
            if h in self.nodes:
                self.nodes[h].count += 1
            else:
                extra = extras[i] if i < len(extras) else None
                self.nodes[h] = Node(h, parent, ev.token_ids[i * bs:(i + 1) * bs], extra, self.orders)
                self.orders += 1
            parent = h

    # ---- reading ----------------------------------------------------------------------------------------
    def tree(self) -> list[TreeNode]:
        """The nodes as minivlm.kv_events.tree.TreeNode (block_id: arrival order; ref count and eviction rank are
        not on the wire), so panels/prefix_tree.py draws them."""
        with self.lock:
            nodes = list(self.nodes.values())
            by_key = {n.key: n.order for n in nodes}
        return sorted((TreeNode(n.order, n.key, n.parent, by_key.get(n.parent), 0, n.kind, len(n.token_ids),
                                None, None) for n in nodes), key=lambda t: t.block_id)

    def extra_keys(self) -> dict[str, list | None]:
        """Each cached hash's extra keys as sent (the drawing names a block's images from them)."""
        with self.lock:
            return {k: n.extra for k, n in self.nodes.items()}

    def summary(self) -> dict:
        with self.lock:
            return {"last_seq": self.last_seq, "topic": self.topic, "blocks": len(self.nodes),
                    "counts": dict(self.counts), "decode_errors": dict(self.errors),
                    "dialects": dict(self.dialects), "last_error": self.last_error,
                    "image_blocks": sum(n.kind != "text" for n in self.nodes.values()), "recent": list(self.recent),
                    "last_message_at": self.last_message_at, "last_batch_at": self.last_batch_at,
                    "last_batch_wall": self.last_batch_wall, "last_error_at": self.last_error_at,
                    "errors_since_batch": self.errors_since_batch}
