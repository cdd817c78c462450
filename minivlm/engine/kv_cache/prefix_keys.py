"""Chained block keys for the prefix cache: key_i = sha256(key_{i-1}, token ids of block i, extra_i).
What goes into `extra` is the strategy: A nothing, B image content hashes, C everything that shapes the KV."""
import hashlib


def hash_block(parent: str | None, token_ids: list[int], extra: tuple) -> str:
    h = hashlib.sha256()
    h.update((parent or "root").encode())
    h.update(b"|".join(str(t).encode() for t in token_ids))
    h.update(repr(extra).encode())
    return h.hexdigest()


def block_extra(seq, index: int, block_size: int, strategy: str, model_id: str, dtype: str) -> tuple:
    """The extra key material of block `index` under `strategy` ("A", "B" or "C")."""
    start, end = index * block_size, (index + 1) * block_size
    overlapping = [im for im in seq.images if im.start < end and im.end > start]
    extra: tuple = ()
    if strategy == "B":
        extra = tuple(im.content_hash for im in overlapping)
    elif strategy == "C":
        extra = tuple((im.content_hash, im.grid_thw, im.tiles, im.settings, im.start - start) for im in overlapping)
        if index == 0:
            extra += (("model", model_id, dtype),)
    if index == 0 and seq.cache_salt is not None:
        extra += (("salt", seq.cache_salt),)  # differently salted requests never share a block
    return extra


def block_key(seq, index: int, parent: str | None, block_size: int, strategy: str, model_id: str,
              dtype: str) -> tuple[str, tuple]:
    """Key of full block `index` chained on `parent` under `strategy`, and the extra material hashed into it."""
    extra = block_extra(seq, index, block_size, strategy, model_id, dtype)
    return hash_block(parent, seq.block_tokens(index, block_size), extra), extra


def extend_keys(seq, block_size: int, strategy: str, model_id: str, dtype: str):
    """Compute keys (strategy's and the strategy-C truth) for every full block of seq not keyed yet."""
    num_full = len(seq) // block_size
    seq.check_writable("block keys")
    for i in range(len(seq.truth_keys), num_full):
        parent_truth = seq.truth_keys[i - 1] if i else None
        truth_key, truth_extra = block_key(seq, i, parent_truth, block_size, "C", model_id, dtype)
        seq.truth_keys.append(truth_key)
        if strategy == "C":
            seq.block_keys.append(truth_key)
            seq.block_extras.append(truth_extra)
        elif strategy in ("A", "B"):
            parent = seq.block_keys[i - 1] if i else None
            key, extra = block_key(seq, i, parent, block_size, strategy, model_id, dtype)
            seq.block_keys.append(key)
            seq.block_extras.append(extra)
