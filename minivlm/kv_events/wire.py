"""minivlm's block events in vLLM's wire format: three frames (topic, 8-byte big-endian sequence number,
msgpack payload); the payload the positional batch [ts, events, data_parallel_rank]; each event a msgpack map
tagged "type" with vLLM's field names, in vLLM's field order."""
import hashlib

import msgpack

MEDIUM = "GPU"                   # vLLM's name for the engine's own KV tier (llm-d reads it as device tier "gpu")
SPEC_KIND = "full_attention"     # every minivlm layer attends to the whole prefix
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


def stored(records: list[dict], block_size: int) -> dict:
    """One BlockStored for a chain of stored records (each: key, parent, token_ids, extra)."""
    extras = [extra_keys(r["extra"]) for r in records]
    ev = {"type": "BlockStored",
          "block_hashes": [wire_hash(r["key"]) for r in records],
          "parent_block_hash": wire_hash(records[0]["parent"]) if records[0]["parent"] is not None else None,
          "token_ids": [t for r in records for t in r["token_ids"]],
          "block_size": block_size, "lora_id": None, "medium": MEDIUM, "lora_name": None}
    if any(x is not None for x in extras):  # omitted when empty, as msgspec omits a default
        ev["extra_keys"] = extras
    ev["group_idx"], ev["kv_cache_spec_kind"] = 0, SPEC_KIND
    return ev


def removed(keys: list[str]) -> dict:
    return {"type": "BlockRemoved", "block_hashes": [wire_hash(k) for k in keys], "medium": MEDIUM, "group_idx": 0}


def to_wire_events(records: list[tuple], block_size: int) -> list[dict]:
    """Records ("stored", rec) / ("removed", key) / ("cleared", None) in order -> vLLM events; consecutive stored
    blocks that chain become one BlockStored (as vLLM sends a request's newly full blocks), consecutive removals
    one BlockRemoved."""
    out, chain, gone = [], [], []

    def flush():
        if chain:
            out.append(stored(chain, block_size))
            chain.clear()
        if gone:
            out.append(removed(list(gone)))
            gone.clear()
    for kind, rec in records:
        if kind == "stored":
            if gone or (chain and rec["parent"] != chain[-1]["key"]):
                flush()
            chain.append(rec)
        elif kind == "removed":
            if chain:
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
