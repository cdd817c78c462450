"""A node of the prefix cache's forest: what the engine's own prefix tree (Engine.prefix_tree) and a KV-event
subscriber's rebuilt one (kv_events.view) both return, so one drawing serves both. Plain data below the engine."""
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
