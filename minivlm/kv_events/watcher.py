"""Watch a KV-event publisher (vLLM, SGLang, minivlm): a SUB socket on a thread feeding a TreeView, and a
client for the publisher's replay socket. `python -m minivlm.kv_events.watcher tcp://host:5557[#topic]` prints
the stream's counters and tree as it goes."""
import argparse
import json
import threading
import time
import uuid

import zmq

from minivlm.kv_events.decode import parse_seq
from minivlm.kv_events.view import TreeView

REPLAY_TIMEOUT_S = 1.0
CATCH_UP_S = 0.5  # a batch known to be sent and not here after this long is fetched from the replay socket


def parse_target(target: str) -> tuple[str, str]:
    """"tcp://host:port#topic" -> (endpoint, topic); the topic is a prefix filter, empty = every topic."""
    if not isinstance(target, str) or not target.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(f"watch an address like tcp://host:5557 or tcp://host:5557#topic, got {target!r}")
    endpoint, _, topic = target.partition("#")
    if "*" in endpoint:
        raise ValueError(f"{endpoint!r} is a bind address; a watcher connects to the publisher's host and port")
    return endpoint, topic


def replay_client(endpoint: str, timeout_s: float = REPLAY_TIMEOUT_S):
    """A function start_seq -> [(seq, payload)] that asks a vLLM-style replay ROUTER for its buffered batches,
    up to the end marker (seq -1)."""
    def replay(start: int) -> list[tuple[int, bytes]]:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, uuid.uuid4().bytes)
        try:
            sock.connect(endpoint)
            sock.send_multipart([b"", start.to_bytes(8, "big")])  # the empty frame makes it look like a REQ
            out, deadline = [], time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sock.poll(int(left * 1000)):
                    raise TimeoutError(f"no end marker from {endpoint} within {timeout_s:.1f} s")
                frames = sock.recv_multipart()
                frames = frames[1:] if frames and frames[0] == b"" else frames
                if len(frames) != 2:
                    raise ValueError(f"replay answered {len(frames)} frames (expected seq, payload)")
                seq = parse_seq(frames[0])
                if seq == -1:
                    return out
                out.append((seq, frames[1]))
        finally:
            sock.close(linger=0)
    return replay


class KVEventWatcher:
    """Subscribe to `target` ("tcp://host:port#topic") on a daemon thread; .view holds the tree and counters."""

    def __init__(self, target: str, replay_endpoint: str | None = None):
        self.endpoint, self.topic = parse_target(target)
        self.replay_endpoint = replay_endpoint
        self.view = TreeView(replay_client(replay_endpoint) if replay_endpoint else None)
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        self.sub.connect(self.endpoint)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="minivlm-kv-watch", daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while not self._stop.is_set():
                if self.sub.poll(100):
                    self.view.feed_frames(self.sub.recv_multipart())
        finally:
            self.sub.close(linger=0)

    def wait_for(self, seq: int, timeout_s: float = 10.0) -> bool:
        """Block until the batch numbered `seq` has been applied (tests, scripts); a batch the caller knows was
        sent but that has not come within CATCH_UP_S is asked from the replay socket (a late join loses it)."""
        start = time.monotonic()
        caught_up = False
        while time.monotonic() < start + timeout_s:
            last = self.view.last_seq
            if last is not None and last >= seq:
                return True
            if not caught_up and self.replay_endpoint and time.monotonic() > start + CATCH_UP_S:
                self.view.catch_up()
                caught_up = True
            time.sleep(0.01)
        return False

    def close(self):
        self._stop.set()
        self.thread.join(2)


def main(argv=None):
    p = argparse.ArgumentParser(description="print a KV-event stream's counters and prefix tree")
    p.add_argument("target", help="tcp://host:port[#topic] of a vLLM / SGLang / minivlm publisher")
    p.add_argument("--replay", default=None, help="the publisher's replay endpoint, to recover missed batches")
    p.add_argument("--every", type=float, default=2.0, help="seconds between prints")
    args = p.parse_args(argv)
    w = KVEventWatcher(args.target, args.replay)
    try:
        while True:
            time.sleep(args.every)
            print(json.dumps({**w.view.summary(), "tree": [(n.block_id, n.parent_block, n.kind, n.key[:12])
                                                           for n in w.view.tree()]}), flush=True)
    except KeyboardInterrupt:
        w.close()


if __name__ == "__main__":
    main()
