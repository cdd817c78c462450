"""The prefix cache as a forest: every cached block is a node, its parent the block whose key its own key chains
on. A prefix hit is a walk from a root down one path; requests sharing a prefix share the path up to a branch."""
from dataclasses import dataclass


@dataclass(frozen=True)
class TreeNode:
    """One block in the prefix cache. parent_block is None for a root (first block of a prompt) and for an orphan
    whose parent was evicted (no lookup can reach it any more). eviction_rank: 0 = the next cached block the free
    queue overwrites; evicted_after: how many more block allocations until then; both None while in use."""
    block_id: int
    key: str
    parent_key: str | None
    parent_block: int | None
    ref_count: int
    kind: str
    num_tokens: int
    eviction_rank: int | None
    evicted_after: int | None

    @property
    def orphan(self) -> bool:
        return self.parent_key is not None and self.parent_block is None


def eviction_order(bm) -> list[int]:
    """Cached-but-free blocks in the order the free queue will overwrite them (its left end goes first)."""
    return [b for b in bm.free if bm.blocks[b].key is not None and bm.key_to_block.get(bm.blocks[b].key) == b]


def prefix_forest(bm) -> list[TreeNode]:
    """Every block the cache can serve (its key index), with its chain parent and eviction position, by block id.
    Read it under the engine's lock (Engine.prefix_tree does)."""
    rank = {b: r for r, b in enumerate(eviction_order(bm))}
    queue_index = {b: i for i, b in enumerate(bm.free) if b in rank}
    nodes = []
    for key, b in bm.key_to_block.items():
        blk = bm.blocks[b]
        parent = bm.key_to_block.get(blk.parent) if blk.parent is not None else None
        after = queue_index[b] + 1 if b in rank else None
        nodes.append(TreeNode(b, key, blk.parent, parent, blk.ref_count, blk.kind, len(blk.token_ids), rank.get(b),
                              after))
    return sorted(nodes, key=lambda n: n.block_id)
