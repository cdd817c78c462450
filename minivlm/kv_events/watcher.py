"""Watch a KV-event publisher (vLLM, SGLang, minivlm): a SUB socket on a thread feeding a TreeView, a monitor of its
connection (so the watcher can say whether anything is there), and a client for the publisher's replay socket.
`python -m minivlm.kv_events.watcher tcp://host:5557[#topic]` prints the stream's state, counters and tree as it
goes."""
import argparse
import json
import threading
import time
import uuid

import zmq
from zmq.utils.monitor import recv_monitor_message

from minivlm.kv_events.decode import parse_seq
from minivlm.kv_events.view import TreeView

REPLAY_TIMEOUT_S = 1.0
CATCH_UP_S = 0.5  # a batch known to be sent and not here after this long is fetched from the replay socket
QUIET_S = 5.0  # a stream silent this long is said to have had no data for that long (an idle engine sends nothing)
# what the stream is doing (KVEventWatcher.state), in the order a watcher usually meets them
STATES = ("no_publisher", "waiting", "receiving", "quiet", "gone", "decode_errors")
MONITORED = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED


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

    def __init__(self, target: str, replay_endpoint: str | None = None, clock=time.monotonic):
        self.endpoint, self.topic = parse_target(target)
        self.replay_endpoint = replay_endpoint
        self.clock = clock
        self.view = TreeView(replay_client(replay_endpoint) if replay_endpoint else None, clock)
        self.started_at = clock()
        # the connection as the socket monitor reports it: None until it says (an inproc:// stream never does)
        self.connected: bool | None = None
        self.connection_changed_at: float | None = None
        self.attempts = 0  # connection attempts refused or unanswered so far (nothing listening there)
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        self.monitor = self.sub.get_monitor_socket(MONITORED)
        try:
            self.sub.connect(self.endpoint)
        except zmq.ZMQError as e:  # "tcp://host" without a port, a port that is not a number: one sentence
            self.sub.disable_monitor()
            self.monitor.close(linger=0)
            self.sub.close(linger=0)
            raise ValueError(f"cannot watch {self.endpoint!r}: {e.strerror}; watch an address like "
                             "tcp://host:5557 or tcp://host:5557#topic") from None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="minivlm-kv-watch", daemon=True)
        self.thread.start()

    def _run(self):
        poller = zmq.Poller()
        poller.register(self.sub, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(100))
                if self.monitor in ready:
                    self._connection(recv_monitor_message(self.monitor)["event"])
                if self.sub in ready:
                    self.view.feed_frames(self.sub.recv_multipart())
        finally:
            self.sub.disable_monitor()
            self.monitor.close(linger=0)
            self.sub.close(linger=0)

    def _connection(self, event: int):
        if event == zmq.EVENT_CONNECT_RETRIED:
            self.attempts += 1
            if self.connected is None:
                self.connected = False  # never connected: nothing listening (yet)
            return
        connected = event == zmq.EVENT_CONNECTED
        if connected != self.connected:
            self.connected, self.connection_changed_at = connected, self.clock()

    def state(self, now: float | None = None) -> dict:
        """What the stream is doing, for a person: `state` (one of STATES) and the times that go with it, in
        seconds: `waited` (since the watcher started), `silent` (since the last message), `since` (since the
        connection last changed), plus the last batch's wall-clock time and the view's summary."""
        now = self.clock() if now is None else now
        s = self.view.summary()
        batches, messages = s["counts"].get("batches", 0), s["counts"].get("messages", 0)
        last = s["last_message_at"]
        connected = self.connected if self.connected is not None else (True if messages else None)
        if s["errors_since_batch"] and (batches == 0 or s["last_error_at"] >= (s["last_batch_at"] or 0)):
            state = "decode_errors"  # what arrives (lately) does not decode: garbage, or another protocol
        elif connected is False and (messages or self.connection_changed_at is not None):
            state = "gone"  # it was there (it sent, or it connected) and the connection is down
        elif not messages:
            state = "no_publisher" if connected is False else "waiting"
        elif now - last >= QUIET_S:
            state = "quiet"
        else:
            state = "receiving"
        return {"state": state, "connected": connected, "attempts": self.attempts,
                "waited": now - self.started_at, "silent": None if last is None else now - last,
                "since": None if self.connection_changed_at is None else now - self.connection_changed_at,
                "last_batch_wall": s["last_batch_wall"], "summary": s}

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
            print(json.dumps({**w.view.summary(), "state": w.state()["state"], "tree": [(n.block_id, n.parent_block, n.kind, n.key[:12])
                                                           for n in w.view.tree()]}), flush=True)
    except KeyboardInterrupt:
        w.close()


if __name__ == "__main__":
    main()
