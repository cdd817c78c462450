"""KV events on the wire, read by a subscriber written from vLLM's published schema (msgspec structs: the batch
positional, the events maps tagged "type"), over real sockets on loopback: every message minivlm publishes for
a run with images, prefix hits, evictions and a reset decodes; hashes chain; the stream rebuilds the engine's
own prefix tree; replay returns what a late subscriber missed; drops at the high-water mark are counted."""
import os
import socket
import time
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import zmq

from minivlm import Request, SamplingParams
from minivlm.api.metrics import ApiMetrics
from minivlm.engine.kv_cache.full_attention import FullAttentionManager
from minivlm.engine.event_log import EventLog
from minivlm.kv_events import KVEventsConfig, kv_events_config
from minivlm.kv_events.publisher import KVEventPublisher
from minivlm.kv_events.watcher import replay_client
from panels.holder import EXAMPLES_DIR


# ---- vLLM's schema (vllm/distributed/kv_events.py), written out here from its field list --------------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Tagged by class name in the "type" field of a map."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subscribe(port: int, topic: str = "") -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(f"tcp://127.0.0.1:{port}")
    return sub


def drain(sub: zmq.Socket, until_seq: int, timeout_s: float = 10) -> list[tuple[bytes, int, bytes]]:
    out, deadline = [], time.monotonic() + timeout_s
    while (not out or out[-1][1] < until_seq) and time.monotonic() < deadline:
        if sub.poll(50):
            topic, seq, payload = sub.recv_multipart()
            out.append((topic, int.from_bytes(seq, "big"), payload))
    return out


def image(name: str) -> str:
    return os.path.join(EXAMPLES_DIR, name)


@pytest.fixture(scope="module")
def run(engine):
    """A 24-block engine publishing on loopback; a subscriber that joins after the first run (so it misses
    batches the replay socket has to return); images, a prefix hit, evictions, then a reset."""
    port, replay_port = free_port(), free_port()
    pub = engine.isolated(num_blocks=24, kv_events={"enable_kv_cache_events": True, "topic": "kv@test@tiny",
                                                    "endpoint": f"tcp://*:{port}",
                                                    "replay_endpoint": f"tcp://*:{replay_port}"})
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    first = [Request(prompt="Describe the picture.", images=[image(n)]) for n in
             ("three_shapes.png", "two_shapes.png", "three_shapes.png")]
    pub.generate(first, params)                       # before anyone listens: replay must bring these back
    missed = pub.kv_events_stats()["next_seq"]
    sub = subscribe(port, "kv@test")
    time.sleep(1.0)  # the subscription reaches the publisher (TCP connect + subscribe, on a busy machine too)
    pub.generate([first[0]], params)                  # a prefix hit: its blocks are served, none stored again
    later = [Request(prompt="Where is the shape?", images=[image(n)]) for n in
             ("red_circle.png", "blue_circle.png", "green_triangle.png", "yellow_square.png")]
    pub.generate(later, params)                       # 24 blocks cannot keep it all: evictions
    tree_before_reset = pub.prefix_tree()
    seq_before_reset = pub.kv_events_stats()["next_seq"] - 1
    pub.reset_prefix_cache()
    last = pub.kv_events_stats()["next_seq"] - 1
    live = drain(sub, last)
    replayed = replay_client(f"tcp://127.0.0.1:{replay_port}")(0)
    anatomy = {r.images[0]: pub.anatomy(r) for r in first + later}
    yield SimpleNamespace(engine=pub, live=live, replayed=replayed, missed=missed, last=last, anatomy=anatomy,
                          tree_before_reset=tree_before_reset, seq_before_reset=seq_before_reset,
                          block_size=pub.config.block_size)
    sub.close(linger=0)
    pub.close()


def test_every_message_decodes_with_vllms_schema_and_seq_is_consecutive(run):
    assert run.missed >= 1 and run.live, "the run published before and after the subscriber joined"
    assert all(topic == b"kv@test@tiny" for topic, _, _ in run.live)
    seqs = [s for _, s, _ in run.live]
    assert seqs == list(range(seqs[0], run.last + 1)), "consecutive sequence numbers, one per batch"
    assert seqs[0] <= run.missed  # the subscriber missed only what came before it joined
    assert [s for s, _ in run.replayed] == list(range(0, run.last + 1)), "replay returns every buffered batch"
    live = dict((s, p) for _, s, p in run.live)
    assert all(live[s] == p for s, p in run.replayed if s in live), "replay sends the very payloads published"
    for _, payload in run.replayed:
        batch = DECODER.decode(payload)  # strict: a field of the wrong type or an unknown tag raises
        assert batch.data_parallel_rank == 0 and batch.events and abs(batch.ts - time.time()) < 600


def events(run):
    return [ev for _, p in run.replayed for ev in DECODER.decode(p).events]


def test_hashes_chain_to_stored_parents_and_token_ids_fill_their_blocks(run):
    stored, bs = set(), run.block_size
    for ev in events(run):
        if isinstance(ev, BlockStored):
            assert ev.block_size == bs and len(ev.token_ids) == bs * len(ev.block_hashes)
            assert all(isinstance(h, bytes) and len(h) == 32 for h in ev.block_hashes)  # sha256 digests
            assert ev.parent_block_hash is None or ev.parent_block_hash in stored, "a parent is stored before"
            assert ev.medium == "GPU" and ev.group_idx == 0 and ev.kv_cache_spec_kind == "full_attention"
            assert ev.extra_keys is None or len(ev.extra_keys) == len(ev.block_hashes)
            stored.update(ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            assert set(ev.block_hashes) <= stored, "only a stored hash is removed"


def test_image_blocks_carry_the_image_identifiers(run):
    """Every block that overlaps an image's placeholder span carries that image's content hash in extra_keys;
    no other block does (checked on each stored chain from its root, against the request's anatomy)."""
    bs, depth, ids_at = run.block_size, {}, {}
    for ev in events(run):
        if isinstance(ev, BlockStored):
            parent = ev.parent_block_hash
            for i, h in enumerate(ev.block_hashes):
                depth[h] = depth[parent] + 1 if parent is not None else 0
                ids_at.setdefault(depth[h], set()).update((ev.extra_keys or [None] * 99)[i] or ())
                parent = h
    for anatomy in run.anatomy.values():
        im = anatomy.images[0]
        overlapping = {i for i in range(len(anatomy.tokens) // bs) if i * bs < im.start + im.num_tokens
                       and (i + 1) * bs > im.start}
        assert overlapping, "the image spans full blocks"
        for d in overlapping:
            assert im.content_hash in ids_at[d], f"block {d} overlaps the image but does not name it"
        for d in set(ids_at) - overlapping:
            assert im.content_hash not in ids_at[d]


def test_evictions_emit_block_removed_and_a_reset_all_blocks_cleared(run):
    evs = events(run)
    assert any(isinstance(e, BlockRemoved) for e in evs), "24 blocks cannot hold seven image prompts"
    assert isinstance(evs[-1], AllBlocksCleared), "the reset is the last batch"
    assert run.engine.prefix_tree() == []  # idle engine: the reset left nothing cached


def test_the_stream_rebuilds_the_engines_own_prefix_tree(run):
    """Replaying the stream up to the batch before the reset gives exactly the keys, parents and token
    counts of engine.prefix_tree() at that moment."""
    live: dict[bytes, tuple] = {}
    for seq, payload in run.replayed:
        if seq > run.seq_before_reset:
            break
        for ev in DECODER.decode(payload).events:
            if isinstance(ev, BlockStored):
                parent = ev.parent_block_hash
                for h in ev.block_hashes:
                    live[h] = (parent, len(ev.token_ids) // len(ev.block_hashes))
                    parent = h
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    live.pop(h)
            else:
                live.clear()
    engine_tree = {bytes.fromhex(n.key): (bytes.fromhex(n.parent_key) if n.parent_key else None, n.num_tokens)
                   for n in run.tree_before_reset}
    assert live == engine_tree and len(engine_tree) > 5


def test_metrics_export_the_publishers_counters(run):
    text = ApiMetrics(lambda: run.engine, lambda e: "tiny").exposition().decode()
    assert f'minivlm:kv_events_batches_total{{model_name="tiny"}} {float(run.engine.kv_events_stats()["batches"])}' \
           in text
    assert 'minivlm:kv_events_dropped_total{model_name="tiny",reason="hwm"} 0.0' in text


def test_a_step_that_logs_more_than_the_ring_holds_is_counted_and_what_it_holds_goes_out():
    """A step whose events outgrew the packed ring is counted as an incomplete batch (log_overflow), and the block
    events the ring still holds are published."""
    log = EventLog(4)
    pub = KVEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint="inproc://kv-overflow"), 4)
    core = SimpleNamespace(events=log, block_manager=FullAttentionManager(8, 4, True, log))
    stored = {"parent_block_hash": None, "token_ids": [1, 2, 3, 4], "extra_keys": (), "block_kind": "text"}
    log.emit("scheduled", step_kind="decode", plan=[])
    log.emit("BlockStored", "r", block_ids=[7], block_hashes=["a" * 64], **stored)
    pub.after_step(core)
    assert pub.stats["log_overflow"] == 0 and set(pub.index) == {(0, "a" * 64)}
    for i in range(6):  # one step, six events: two fell out of the ring before the publisher looked
        log.emit("BlockStored", "r", block_ids=[i], block_hashes=[f"{i:064x}"], **stored)
    pub.after_step(core)
    assert pub.stats["log_overflow"] == 1 and set(pub.index) == {(0, "a" * 64)} | {(0, f"{i:064x}") for i in range(2, 6)}
    pub.close()


def test_a_subscriber_at_the_high_water_mark_costs_drops_not_a_blocked_step():
    """hwm=1 and a subscriber that never reads: sends are refused and counted, after_step never waits."""
    bm, log = FullAttentionManager(8, 4, True, EventLog(1000)), None
    log = bm.events
    pub = KVEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint="inproc://kv-hwm", hwm=1), 4)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect("inproc://kv-hwm")
    time.sleep(0.1)
    core = SimpleNamespace(events=log, block_manager=bm)
    t = time.perf_counter()
    for i in range(200):
        log.emit("BlockStored", "r", block_ids=[i % 8], block_hashes=[f"{i:064x}"], parent_block_hash=None,
                 token_ids=[1, 2, 3, 4], extra_keys=(), block_kind="text")
        pub.after_step(core)
    enqueue_s = time.perf_counter() - t
    deadline = time.monotonic() + 5
    while pub.stats["batches"] + pub.stats["dropped_hwm"] < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pub.stats["dropped_hwm"] > 100 and pub.stats["batches"] >= 1
    assert len(pub.buffer) == 200, "dropped batches stay in the replay buffer"
    assert enqueue_s < 5  # generous: the point is it returned while the subscriber was stuck
    sub.close(linger=0)
    pub.close()


def test_config_takes_vllms_fields_and_refuses_bad_ones(engine):
    cfg = kv_events_config('{"enable_kv_cache_events": true, "topic": "kv"}')
    assert cfg.publisher == "zmq" and cfg.endpoint == "tcp://*:5557" and cfg.binds
    assert cfg.buffer_steps == 10_000 and cfg.hwm == 100_000 and cfg.max_queue_size == 100_000
    assert not KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://router:5557").binds  # connect
    assert KVEventsConfig(endpoint="tcp://[::]:5557").binds and KVEventsConfig(endpoint="ipc:///tmp/kv").binds
    assert not KVEventsConfig().active and not KVEventsConfig(enable_kv_cache_events=True, publisher="null").active
    for bad, msg in (('{"enable_kv_cache_events": 1}', "true or false"), ('{"publisher": "kafka"}', "publisher"),
                     ('{"endpoint": "localhost:5557"}', "ZMQ address"), ('{"hwm": -1}', "hwm"),
                     ('{"buffer_step": 3}', "unknown field"), ("{not json", "not valid JSON")):
        with pytest.raises(ValueError, match=msg):
            kv_events_config(bad)
    with pytest.raises(ValueError, match="event_log_size"):
        engine.isolated(event_log_size=0, kv_events={"enable_kv_cache_events": True})
    port = free_port()
    with socket.socket() as taken:  # a port someone else holds: a clear error, not a half-built engine
        taken.bind(("0.0.0.0", port))
        taken.listen()
        with pytest.raises(ValueError, match="cannot open"):
            engine.isolated(kv_events={"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}"})
