"""The KV watcher says what the stream is doing (#40 item 6): "nothing listening", "garbage bytes" and "publisher
gone" all used to read "batches 0 (last seq None) … decode errors: none". Over real ZMQ sockets on loopback: nothing
bound (waiting, nothing listening), a publisher bound and silent (connected, waiting), one sending garbage (decode
errors), one sending batches (connected, when the last batch came), one that stops sending (no data for N s) and
one that goes away (publisher gone); each state's line in English and in Chinese."""
import re
import time

import msgpack
import pytest
import zmq

from minivlm.kv_events.watcher import QUIET_S, STATES, KVEventWatcher
from panels import kv_watch
from panels.i18n import EN, ZH
from tests.test_kv_events import free_port

CJK = re.compile(r"[\u4e00-\u9fff]")
STORED = {"type": "BlockStored", "block_hashes": [b"\x01" * 32], "parent_block_hash": None, "token_ids": [5] * 4,
          "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None}


def until(w: KVEventWatcher, state: str, timeout: float = 10.0, send=None) -> dict:
    """Wait until the watcher is in `state` (calling `send` meanwhile, e.g. while the subscription travels)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if send is not None:
            send()
        now = w.state()
        if now["state"] == state:
            return now
        time.sleep(0.05)
    raise AssertionError(f"still {w.state()['state']!r} after {timeout} s, not {state!r}")


def settled(w: KVEventWatcher, quiet_for: float = 0.5) -> dict:
    """The state once no batch has landed for `quiet_for` s (loopback delivers within it; a CI machine can lag)."""
    st = w.state()
    while True:
        time.sleep(quiet_for)
        now = w.state()
        if now["last_batch_wall"] == st["last_batch_wall"]:
            return now
        st = now


def lines(w: KVEventWatcher, now: float | None = None) -> tuple[str, str]:
    """The first line of the status (the state), in English and in Chinese."""
    en, zh = (kv_watch.status_markdown(w, lang, now).split("\n\n")[0] for lang in (EN, ZH))
    assert CJK.search(zh) and not CJK.search(en) and en != zh
    return en, zh


@pytest.fixture
def pub():
    port = free_port()
    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    yield port, sock
    sock.close(linger=0)


def batch(seq: int, events=()) -> list[bytes]:
    return [b"kv", seq.to_bytes(8, "big"), msgpack.packb([time.time(), list(events), 0], use_bin_type=True)]


def test_nothing_listening_is_waiting_and_says_so(pub):
    port, _ = pub  # nothing bound on it
    w = KVEventWatcher(f"tcp://127.0.0.1:{port}")
    try:
        st = until(w, "no_publisher")
        assert st["attempts"] >= 1 and st["summary"]["counts"].get("messages", 0) == 0
        en, zh = lines(w)
        assert f"**waiting**: nothing is listening at `tcp://127.0.0.1:{port}` yet" in en and "keeps trying" in en
        assert "等待中" in zh and "还没有发布端在监听" in zh
    finally:
        w.close()


def test_a_bound_silent_publisher_is_connected_and_waiting(pub):
    port, sock = pub
    sock.bind(f"tcp://127.0.0.1:{port}")
    w = KVEventWatcher(f"tcp://127.0.0.1:{port}")
    try:
        until(w, "waiting")
        en, zh = lines(w)
        assert "**connected, waiting**: no data yet" in en and "已连接，等待中" in zh
    finally:
        w.close()


def test_garbage_bytes_are_decode_errors(pub):
    port, sock = pub
    sock.bind(f"tcp://127.0.0.1:{port}")
    w = KVEventWatcher(f"tcp://127.0.0.1:{port}")
    try:
        until(w, "decode_errors", send=lambda: sock.send_multipart([b"\xde\xad", b"\xbe\xef", b"\x00garbage"]))
        en, zh = lines(w)
        assert "**decode errors**: the last" in en and "could not be decoded" in en and "last batch at never" in en
        assert "解码错误" in zh and "从未" in zh
        md = kv_watch.status_markdown(w)
        assert "decode errors: bad sequence frame" in md or "decode errors: bad msgpack" in md, md
        # a good batch: receiving again; garbage after it: decode errors again (the latest messages count)
        sock.send_multipart(batch(0, [STORED]))
        until(w, "receiving")
        sock.send_multipart([b"kv", b"\x00" * 8, b"\xc1"])
        until(w, "decode_errors")
        assert "**decode errors**: the last 1 message could not be decoded" in lines(w)[0]
    finally:
        w.close()


def test_receiving_says_when_the_last_batch_came_then_no_data_for_n_s(pub):
    port, sock = pub
    sock.bind(f"tcp://127.0.0.1:{port}")
    w = KVEventWatcher(f"tcp://127.0.0.1:{port}")
    try:
        until(w, "receiving", send=lambda: sock.send_multipart(batch(0, [STORED])))
        st = settled(w)  # batches sent while the subscription travelled may still land: the time read is the last's
        at = time.strftime("%H:%M:%S", time.localtime(st["last_batch_wall"]))
        assert abs(st["last_batch_wall"] - time.time()) < 5
        en, zh = lines(w)
        assert en.startswith("🟢 **connected**: receiving · last batch ") and f"ago, at {at}" in en
        assert "已连接" in zh and at in zh
        # the publisher stays but sends nothing more: after QUIET_S the line says how long there has been no data
        st = until(w, "quiet", timeout=QUIET_S + 10)
        assert st["connected"] and st["silent"] >= QUIET_S
        en, zh = lines(w)
        assert re.search(r"\*\*connected, no data for \d+ s\*\* · last batch at " + at, en), en
        assert re.search(r"已连接，\d+ 秒 没有数据", zh), zh
        en, zh = lines(w, now=w.clock() + 125)  # two minutes later
        assert "no data for 2 min" in en and "2 分钟 没有数据" in zh
    finally:
        w.close()


def test_a_publisher_that_goes_away_is_gone_with_no_data_for_n_s(pub):
    port, sock = pub
    sock.bind(f"tcp://127.0.0.1:{port}")
    w = KVEventWatcher(f"tcp://127.0.0.1:{port}")
    try:
        until(w, "receiving", send=lambda: sock.send_multipart(batch(0, [STORED])))
        sock.close(linger=0)  # the publisher stops: its process ended, its socket is gone
        st = until(w, "gone")
        assert st["connected"] is False and st["summary"]["blocks"] == 1  # the tree stays as it was last seen
        en, zh = lines(w, now=w.clock() + 7)
        assert re.search(r"🔴 \*\*publisher gone\*\*: disconnected (7|8) s ago · no data for (7|8|9) s · last batch at "
                         r"\d\d:\d\d:\d\d", en), en
        assert "发布端已离开" in zh and re.search(r"(7|8|9) 秒 没有数据", zh), zh
    finally:
        w.close()


def test_every_state_has_its_line():
    assert set(STATES) == set(kv_watch.STATE_LINES)
