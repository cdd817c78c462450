"""The kv_shared group's manager (coordinator.py explains the groups and their one interface): Gemma 4's last
num_kv_shared_layers compute no K/V of their own; each attends over the K/V of the last earlier layer of its type, in
that layer's blocks. So this group owns no blocks and no slots: it takes nothing at admission, frees nothing, caches
nothing, and every request's part of a step only names the groups its layers read (their tables are already in
those groups' parts). It is a group all the same, so the block map, memory_report and the KV tab can say so."""
from minivlm.engine.kv_cache.group_manager import GroupManager
from minivlm.engine.kv_cache.group_steps import SharedGroupStep
from minivlm.engine.outputs import GroupInfo


class KVSharedManager(GroupManager):
    """A group of layers that read other groups' blocks: every call of the interface answers "nothing here" (the
    defaults of group_manager.py); its part of a step names the groups it reads."""
    kind = "kv_shared"
    window = None
    rewinds = True  # it keeps nothing that a token computed again could contradict
    speculates = True  # nothing of its own for a guess to leave behind

    def __init__(self, sources: dict[int, int], reads: tuple[int, ...], block_size: int, caching: bool, events,
                 group_idx: int):
        self.sources = dict(sources)  # each shared layer -> the layer whose K/V it reads
        self.reads = tuple(reads)     # the group ids of those layers, in order
        self.block_size, self.caching, self.events, self.group_idx = block_size, caching, events, group_idx
        self.tables: dict[int, list[int]] = {}  # always empty: the block map reads it like any group's

    @classmethod
    def make(cls, pool, group_idx: int, block_size: int, caching: bool, events):
        """The manager of a pool's kv_shared group (kv_pool.GroupPool: its sources and the groups they are in)."""
        return cls(pool.sources, pool.reads, block_size, caching, events, group_idx)

    def step_part(self, seq, start: int, end: int) -> SharedGroupStep:
        return SharedGroupStep(self.reads)

    def info(self, layers: list[int], rid: dict[int, str]) -> GroupInfo:
        return GroupInfo(self.kind, self.kind, layers, None, 0, 0, {}, reads=dict(self.sources))
