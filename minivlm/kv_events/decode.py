"""Decode one KV-event message from any publisher of the common schema into plain records, saying which dialect
it was: vLLM's current events (msgpack maps tagged "type"), vLLM's older positional arrays (tag first, with
`medium`), SGLang's positional arrays (tag first, trailing fields omitted; vLLM <= 0.9 looked the same). The
batch itself may be positional [ts, events, rank] or a map {"ts", "events", "data_parallel_rank"}."""
from dataclasses import dataclass

import msgpack

DIALECTS = ("vllm-map", "vllm-array", "sglang")
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                 "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class DecodeError(ValueError):
    """A message that is not a KV-event batch; `reason` is a short label the watcher counts by."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class Event:
    """One decoded event: kind "BlockStored" | "BlockRemoved" | "AllBlocksCleared"; hashes as hex strings."""
    kind: str
    hashes: list[str]
    parent: str | None = None
    token_ids: list[int] | None = None
    block_size: int | None = None
    extra_keys: list | None = None  # one entry per block (a list or None), as sent
    medium: str | None = None


@dataclass
class Batch:
    seq: int
    topic: str
    ts: float
    events: list[Event]
    rank: int | None
    dialect: str | None      # None for a batch without events
    unknown: list[str]       # tags of events this decoder does not know (skipped)


def hex_hash(h) -> str:
    """A block hash as hex: bytes as they are (vLLM's sha256 digests); ints (older vLLM, SGLang) as 64-bit."""
    if isinstance(h, (bytes, bytearray)):
        return bytes(h).hex()
    if isinstance(h, int) and not isinstance(h, bool):
        return f"{h & (2**64 - 1):016x}"
    raise DecodeError("bad block hash", f"{type(h).__name__} (expected bytes or int)")


def parse_seq(raw: bytes) -> int:
    if len(raw) != 8:
        raise DecodeError("bad sequence frame", f"{len(raw)} bytes (expected 8)")
    return int.from_bytes(raw, "big", signed=True)


def _event(raw) -> tuple[Event | str, str]:
    """(Event, dialect) or (unknown tag, dialect)."""
    if isinstance(raw, dict):
        tag, fields, dialect = raw.get("type"), raw, "vllm-map"
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = STORED_FIELDS if tag == "BlockStored" else REMOVED_FIELDS if tag == "BlockRemoved" else ()
        fields = dict(zip(names, raw[1:]))
        has_medium = len(raw) > (6 if tag == "BlockStored" else 2)
        dialect = "vllm-array" if has_medium or tag == "AllBlocksCleared" else "sglang"
    else:
        raise DecodeError("bad event", f"neither a tagged map nor a tagged array: {type(raw).__name__}")
    if tag == "AllBlocksCleared":
        return Event("AllBlocksCleared", []), dialect
    if tag not in ("BlockStored", "BlockRemoved"):
        return str(tag), dialect
    hashes = fields.get("block_hashes")
    if not isinstance(hashes, (list, tuple)):
        raise DecodeError("bad event", f"{tag}.block_hashes is not a list")
    ev = Event(tag, [hex_hash(h) for h in hashes], medium=fields.get("medium"))
    if tag == "BlockStored":
        parent, tokens, bs = fields.get("parent_block_hash"), fields.get("token_ids"), fields.get("block_size")
        if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, int) for t in tokens):
            raise DecodeError("bad event", "BlockStored.token_ids is not a list of ints")
        if not isinstance(bs, int) or bs < 1:
            raise DecodeError("bad event", f"BlockStored.block_size is {bs!r}")
        extra = fields.get("extra_keys")
        ev.parent = hex_hash(parent) if parent is not None else None
        ev.token_ids, ev.block_size = list(tokens), bs
        ev.extra_keys = list(extra) if isinstance(extra, (list, tuple)) else None
    return ev, dialect


def decode_payload(payload: bytes) -> tuple[float, list, int | None]:
    """(ts, raw events, data-parallel rank) from a msgpack batch, positional or map."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:
        raise DecodeError("bad msgpack", f"{type(e).__name__}: {e}") from None
    if isinstance(batch, dict):  # a map-encoded batch
        batch = [batch.get("ts"), batch.get("events"), batch.get("data_parallel_rank")]
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[0], (int, float)) \
            or not isinstance(batch[1], (list, tuple)):
        raise DecodeError("not a batch", "expected [ts, events, data_parallel_rank]")
    return float(batch[0]), list(batch[1]), batch[2] if len(batch) > 2 else None


def decode_batch(seq: int, topic: str, payload: bytes) -> Batch:
    ts, raw_events, rank = decode_payload(payload)
    events, unknown, dialects = [], [], []
    for raw in raw_events:
        ev, dialect = _event(raw)
        dialects.append(dialect)
        (unknown.append if isinstance(ev, str) else events.append)(ev)
    # the batch's dialect: a positional stream shows its kind on stored/removed events (cleared says nothing)
    best = next((d for d in dialects if d != "vllm-array"), dialects[0] if dialects else None)
    return Batch(seq, topic, ts, events, rank, best, unknown)


def decode_frames(frames: list[bytes]) -> Batch:
    """One PUB message (topic, seq, payload) -> Batch; DecodeError if it is not one."""
    if len(frames) != 3:
        raise DecodeError("wrong frame count", f"{len(frames)} frames (expected topic, seq, payload)")
    topic, seq_raw, payload = frames
    return decode_batch(parse_seq(seq_raw), topic.decode("utf-8", "replace"), payload)
