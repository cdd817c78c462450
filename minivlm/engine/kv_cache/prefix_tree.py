"""The prefix cache as a forest: every cached block is a node, its parent the block whose key its own key chains
on. A prefix hit is a walk from a root down one path; requests sharing a prefix share the path up to a branch."""
from minivlm.kv_events.tree import TreeNode  # what a KV-event subscriber rebuilds is the same forest


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
