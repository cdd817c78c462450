"""The publisher: after every engine step that changed the prefix cache, one batch of vLLM KV events. The step
only collects its block events and enqueues them (never blocking); a sender thread encodes, sends on a ZMQ PUB
socket, keeps the replay buffer and answers replay requests on a ROUTER socket."""
import logging
import queue
import threading
import time
from collections import Counter, deque

import zmq

from minivlm.kv_events.config import KVEventsConfig
from minivlm.kv_events.wire import END_SEQ, encode_batch, frames, to_wire_events

log = logging.getLogger("minivlm")
POLL_S = 0.02  # how often the idle sender looks at the replay socket


class KVEventPublisher:
    """What the wire shows is the cache's index (the blocks a lookup can hit): a key is stored once and removed
    once, even when two blocks computed the same content (the index keeps the first)."""

    def __init__(self, config: KVEventsConfig, block_size: int, data_parallel_rank: int = 0):
        self.config, self.block_size, self.rank = config, block_size, data_parallel_rank
        self.stats = Counter()  # batches, events, dropped_queue, dropped_hwm, replays, bad_replay_requests
        self.queue: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self.index: dict[tuple[int, str], tuple[int, dict]] = {}  # (group, key) -> (block id, record): the index
        self.groups: dict[int, tuple[str, int | None]] = {0: ("full_attention", None)}  # group -> (kind, window)
        self.seen, self.next_seq = 0, 0               # last event-log seq read; next batch sequence number
        self.deadline = None                          # set by close: send what is queued until then
        ctx = zmq.Context.instance()
        # XPUB is a PUB on the wire; NODROP makes a full subscriber queue refuse the send, so drops are counted
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_NODROP, 1)
        self.pub.setsockopt(zmq.SNDHWM, config.hwm)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.replay = None
        try:
            (self.pub.bind if config.binds else self.pub.connect)(config.endpoint)
            if config.replay_endpoint is not None:
                self.replay = ctx.socket(zmq.ROUTER)
                self.replay.setsockopt(zmq.LINGER, 0)
                self.replay.bind(config.replay_endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise ValueError(f"kv_events: cannot open {config.endpoint if self.replay is None else config.replay_endpoint}"
                             f" ({e}); pick a free port or another endpoint") from None
        self.thread = threading.Thread(target=self._run, name="minivlm-kv-events", daemon=True)
        self.thread.start()

    # ---- on the stepping thread, under the engine's lock ----------------------------------------------------
    def after_step(self, core):
        """Collect the block events logged since the last call; enqueue them as one batch if there are any."""
        events = core.events
        if events.last_seq == self.seen:
            return
        if events.last_seq - self.seen > len(events.ring):
            self.stats["log_overflow"] += 1  # one step logged more than the ring holds: the batch is incomplete
        new = events.newer_than(self.seen, kinds=("BlockStored", "BlockRemoved", "AllBlocksCleared", "state_saved",
                                                   "state_evicted"))
        self.seen = events.last_seq
        records = []
        for ev in new:
            group = getattr(ev, "group", 0)  # another KV-cache group than the full-attention one (engine/kv_cache/coordinator.py)
            if ev.kind == "BlockStored":
                self._stored(ev, records, group)
            elif ev.kind == "state_saved":  # a recurrent state checkpoint: a block of the state group, for a router
                self._index(group, ev.block_hash, -1, {"key": ev.block_hash, "parent": ev.parent_block_hash,
                                                       "token_ids": ev.token_ids, "extra": ev.extra_keys}, records)
            elif ev.kind in ("BlockRemoved", "state_evicted"):
                ids, keys = (ev.block_ids, ev.block_hashes) if ev.kind == "BlockRemoved" else ([-1], [ev.block_hash])
                for b, key in zip(ids, keys):
                    if self.index.get((group, key), (None,))[0] == b:
                        del self.index[(group, key)]
                        records.append(("removed", {"key": key, "group": group}))
            elif ev.kind == "AllBlocksCleared":
                self._cleared(core.block_manager, records)
        if records:
            self._enqueue(records)

    def _stored(self, ev, records: list, group: int):
        bs, parent = self.block_size, ev.parent_block_hash
        for i, (b, key) in enumerate(zip(ev.block_ids, ev.block_hashes)):
            rec = {"key": key, "parent": parent, "token_ids": ev.token_ids[i * bs:(i + 1) * bs],
                   "extra": ev.extra_keys}
            parent = key
            self._index(group, key, b, rec, records)

    def _index(self, group: int, key: str, b: int, rec: dict, records: list):
        rec["group"] = group
        if (group, key) not in self.index:  # a second block with an indexed key is not in the index (setdefault)
            self.index[(group, key)] = (b, rec)
            records.append(("stored", rec))

    def _cleared(self, bm, records: list):
        """A reset keeps the keys of blocks in use: clear, then store those again, parents first (a hybrid model's
        other groups: the sliding blocks in use; no state checkpoint survives a reset)."""
        pools = {0: bm, getattr(getattr(bm, "sliding", None), "group_idx", -1): getattr(bm, "sliding", None)}
        self.index = {(g, k): v for (g, k), v in self.index.items()
                      if pools.get(g) is not None and pools[g].key_to_block.get(k) == v[0]}
        records.append(("cleared", None))
        depth: dict[tuple, int] = {}

        def level(gk):
            if gk not in depth:
                p = (gk[0], self.index[gk][1]["parent"])
                depth[gk] = level(p) + 1 if p in self.index else 0
            return depth[gk]
        for gk in sorted(self.index, key=level):
            records.append(("stored", self.index[gk][1]))

    def _enqueue(self, records: list):
        seq, self.next_seq = self.next_seq, self.next_seq + 1  # numbered here: a dropped batch shows as a gap
        try:
            self.queue.put_nowait((seq, time.time(), records))
        except queue.Full:
            self.stats["dropped_queue"] += 1

    # ---- the sender thread ----------------------------------------------------------------------------------
    def _run(self):
        try:
            while self.deadline is None or (not self.queue.empty() and time.monotonic() < self.deadline):
                try:
                    item = self.queue.get(timeout=POLL_S)
                except queue.Empty:
                    item = ()
                if item:
                    self._send(*item)
                self._serve_replays()
        except Exception:
            log.exception("minivlm: the KV-event sender stopped")
        finally:
            self._close_sockets()

    def _send(self, seq: int, ts: float, records: list):
        events = to_wire_events(records, self.block_size, self.groups)
        payload = encode_batch(ts, events, self.rank)
        self.buffer.append((seq, payload))
        try:
            self.pub.send_multipart(frames(self.config.topic, seq, payload), flags=zmq.NOBLOCK)
            self.stats["batches"] += 1
            self.stats["events"] += len(events)
        except zmq.Again:  # a subscriber's queue is at the high-water mark: dropped (replay still has it)
            self.stats["dropped_hwm"] += 1
        while self.pub.poll(0):  # subscription notices: read so they never pile up
            self.pub.recv_multipart()

    def _serve_replays(self):
        while self.replay is not None and self.replay.poll(0):
            msg = self.replay.recv_multipart()
            envelope, body = (msg[:2], msg[2]) if len(msg) == 3 and msg[1] == b"" else (msg[:1], msg[-1])
            if len(msg) not in (2, 3) or len(body) != 8:
                self.stats["bad_replay_requests"] += 1
                continue
            start = int.from_bytes(body, "big")
            self.stats["replays"] += 1
            for seq, payload in list(self.buffer):
                if seq >= start:
                    self.replay.send_multipart([*envelope, seq.to_bytes(8, "big"), payload])
            self.replay.send_multipart([*envelope, END_SEQ, b""])

    def _close_sockets(self):
        for s in (self.pub, self.replay):
            if s is not None:
                s.close(linger=0)

    def close(self, timeout: float = 1.0):
        """Send what is queued (up to `timeout`), then close the sockets; the endpoint is free again after."""
        self.deadline = time.monotonic() + timeout
        self.thread.join(timeout + 1)


def make_publisher(config: KVEventsConfig | None, block_size: int) -> KVEventPublisher | None:
    return KVEventPublisher(config, block_size) if config is not None and config.active else None
