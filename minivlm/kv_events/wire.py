"""minivlm's block events in vLLM's wire format: three frames (topic, 8-byte big-endian sequence number,
msgpack payload); the payload the positional batch [ts, events, data_parallel_rank]; each event a msgpack map
tagged "type" with vLLM's field names, in vLLM's field order."""
import hashlib

import msgpack

MEDIUM = "GPU"                   # vLLM's name for the engine's own KV tier (llm-d reads it as device tier "gpu")
WIRE_KINDS = {"full_attention": "full_attention", "sliding_window": "sliding_window", "recurrent": "mamba"}  # vLLM's
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay socket's end-of-stream marker


def wire_hash(key: str) -> bytes:
    """A minivlm block key (sha256 hex) on the wire: its 32 raw bytes, as vLLM sends its sha256 block hashes.
    The same mapping for block_hashes and parent_block_hash, so a child's parent equals its parent's hash."""
    try:
        return bytes.fromhex(key)
    except ValueError:  # not hex (a foreign key): still a stable 32-byte hash of it
        return hashlib.sha256(key.encode()).digest()


def extra_keys(extra: tuple) -> tuple | None:
    """The extra key material hashed into a block, as vLLM exposes it: the identifiers of the images overlapping
    the block (their content hashes), then the cache_salt on a prompt's first block; None when there is none.
    Strategy A hashes no image identity, so its blocks carry none (which is why it serves false hits)."""
    ids, salt = [], []
    for e in extra:
        if isinstance(e, str):                       # strategy B: the image's content hash
            ids.append(e)
        elif isinstance(e, tuple) and e and e[0] == "salt":
            salt.append(e[1])
        elif isinstance(e, tuple) and e and e[0] != "model":  # strategy C: (content hash, grid, tiles, settings, offset)
            ids.append(e[0])
    out = tuple(ids + salt)
    return out or None


def stored(records: list[dict], block_size: int, groups: dict | None = None) -> dict:
    """One BlockStored for a chain of stored records (each: key, parent, token_ids, extra, group) of one KV-cache
    group; groups: group_idx -> (kind, sliding window), as the engine's pool made them."""
    extras = [extra_keys(r["extra"]) for r in records]
    ev = {"type": "BlockStored",
          "block_hashes": [wire_hash(r["key"]) for r in records],
          "parent_block_hash": wire_hash(records[0]["parent"]) if records[0]["parent"] is not None else None,
          "token_ids": [t for r in records for t in r["token_ids"]],
          "block_size": block_size, "lora_id": None, "medium": MEDIUM, "lora_name": None}
    if any(x is not None for x in extras):  # omitted when empty, as msgspec omits a default
        ev["extra_keys"] = extras
    group = records[0].get("group", 0)
    kind, window = (groups or {}).get(group, ("full_attention", None))
    ev["group_idx"], ev["kv_cache_spec_kind"] = group, WIRE_KINDS[kind]
    if window is not None:
        ev["kv_cache_spec_sliding_window"] = window
    return ev


def removed(keys: list, group: int = 0) -> dict:
    return {"type": "BlockRemoved", "block_hashes": [wire_hash(k) for k in keys], "medium": MEDIUM,
            "group_idx": group}


def to_wire_events(records: list[tuple], block_size: int, groups: dict | None = None) -> list[dict]:
    """Records ("stored", rec) / ("removed", key) / ("cleared", None) in order -> vLLM events; consecutive stored
    blocks that chain become one BlockStored (as vLLM sends a request's newly full blocks), consecutive removals
    one BlockRemoved."""
    out, chain, gone = [], [], []

    def flush():
        if chain:
            out.append(stored(chain, block_size, groups))
            chain.clear()
        if gone:
            out.append(removed([r["key"] for r in gone], gone[0].get("group", 0)))
            gone.clear()
    for kind, rec in records:
        if isinstance(rec, str):  # a removed key of the full-attention group (the records' older form)
            rec = {"key": rec, "group": 0}
        if kind == "stored":
            if gone or (chain and (rec["parent"] != chain[-1]["key"] or rec.get("group", 0) != chain[-1].get("group", 0))):
                flush()
            chain.append(rec)
        elif kind == "removed":
            if chain or (gone and gone[-1].get("group", 0) != rec.get("group", 0)):
                flush()
            gone.append(rec)
        else:
            flush()
            out.append({"type": "AllBlocksCleared"})
    flush()
    return out


def encode_batch(ts: float, events: list[dict], data_parallel_rank: int = 0) -> bytes:
    return msgpack.packb([ts, events, data_parallel_rank], use_bin_type=True)


def frames(topic: str, seq: int, payload: bytes) -> tuple[bytes, bytes, bytes]:
    return topic.encode(), seq.to_bytes(8, "big"), payload
