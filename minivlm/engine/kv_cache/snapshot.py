"""The KV block map as plain data, built each step from the block manager (KVSnapshot, in outputs.py), and the
one block-fill formula the live snapshot and the replays share."""
from minivlm.engine.outputs import BlockInfo, GroupInfo, KVSnapshot


def block_kind(token_types: list[int], video: bool = False) -> str:
    """text | image | mixed by the token types a block holds (free when it holds none); video: it holds a video's
    tokens (placeholders, or the timestamps between its frame pairs)."""
    if not token_types:
        return "free"
    if video:
        return "video"
    return "image" if all(token_types) else "mixed" if any(token_types) else "text"


def block_fill(computed: int, j: int, block_size: int, token_types: list[int], videos=()) -> tuple[int, str]:
    """(tokens with K/V, kind) of the j-th block of a request with `computed` tokens computed: the one formula the
    live snapshot and the replays share. An empty reserved block is named by its first planned token; videos: the
    request's video spans (start, length), whose blocks are "video"."""
    n = max(0, min(block_size, computed - j * block_size))
    start, end = j * block_size, j * block_size + max(n, 1)
    return n, block_kind(token_types[start:end], holds_video(videos, start, end))


def video_spans(seq) -> list[tuple[int, int]]:
    """(start, length) of each video of seq in its tokens (the arrived event carries them, so replays know)."""
    return [(im.start, im.end - im.start) for im in seq.images if im.kind == "video"]


def holds_video(videos, start: int, end: int) -> bool:
    """Whether tokens [start, end) overlap one of the video spans (start, length)."""
    return any(a < end and a + n > start for a, n in videos)


class SnapshotBuilder:
    """Builds KVSnapshots with O(blocks held + blocks changed) Python work, not O(pool): unchanged blocks reuse their
    (immutable) BlockInfo from the previous snapshot; the one O(pool) part is copying the list of references
    (8 bytes a block), so snapshots every step stay cheap on a large pool."""

    def __init__(self, bm, num_layers: int = 0):
        self.bm, self.num_layers = bm, num_layers
        self.infos = [BlockInfo(b.block_id, 0, 0, None, [], "free", False) for b in bm.blocks]

    def build(self, running: list, waiting: list, step: int, num_preemptions: int, full: bool = False,
              last_event_seq: int = 0) -> KVSnapshot:
        """full=True rebuilds every block (the reference the incremental path is tested against)."""
        bm, bs = self.bm, self.bm.block_size
        owners: dict[int, list[str]] = {}
        fill: dict[int, tuple[int, str]] = {}
        tables = {}
        changed = set(range(len(bm.blocks))) if full else set(bm.dirty)
        bm.dirty.clear()
        for seq in running + [s for s in waiting if bm.table(s)]:
            table = bm.table(seq)
            tables[seq.request_id] = list(table)
            changed.add(table[-1])  # the block being appended to changes every step
            for j, b in enumerate(table):
                owners.setdefault(b, []).append(seq.request_id)
                if b in changed:
                    n, kind = block_fill(seq.num_computed, j, bs, seq.token_types, video_spans(seq))
                    if n >= fill.get(b, (-1, ""))[0]:
                        fill[b] = (n, kind)
        for b in changed:
            blk = bm.blocks[b]
            # cached: a lookup finds it (a copy of a block computed twice at once holds its key but is never found)
            cached = blk.ref_count == 0 and blk.key is not None and bm.key_to_block.get(blk.key) == b
            n, kind = fill.get(b, (bs if cached else 0, blk.kind if cached else "free"))
            self.infos[b] = BlockInfo(b, blk.ref_count, n, blk.key[:16] if blk.key else None,
                                      owners.get(b, []), kind, cached)
        holders = running + [s for s in waiting if bm.table(s)]
        groups = bm.groups(holders) if hasattr(bm, "groups") else [GroupInfo(
            "full_attention", "full_attention", list(range(self.num_layers)), None, len(bm.blocks), bm.num_free,
            {r: list(t) for r, t in tables.items()})]
        return KVSnapshot(bs, len(bm.blocks), list(self.infos), tables, step, [s.request_id for s in running],
                          [s.request_id for s in waiting], num_preemptions, dict(bm.stats), last_event_seq, groups)
