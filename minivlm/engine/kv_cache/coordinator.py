"""One KV-cache coordinator for every model (vLLM v1's KVCacheCoordinator, in small). A decoder's layers do not all
keep the same thing: Gemma 3's sliding layers need only the last `window` tokens, Qwen3.5's Gated DeltaNet layers
keep one fixed-size state per request. Layers with the same CacheSpec (kind and window) form a group with its own
pool, its own table per request and its own manager; a plain model is one full-attention group on the same path:

    full_attention  FullAttentionManager (full_attention.py): every token's K/V, prefix-cached by block key; its
                    blocks are the prefix cache's (block map, prefix tree, the plan's block table)
    sliding_window  SlidingWindowManager (sliding_window.py): the same paged blocks, but blocks wholly out of every
                    future query's window are given back while the request runs (they stay cached by key)
    recurrent       RecurrentManager (recurrent.py): one state slot per running request; for the prefix cache the
                    state is saved into a checkpoint slot at chosen block boundaries, keyed by the block key there

Every group's manager but the full one answers the same calls, which the coordinator makes for each in turn:
longest_hit (how much of a hit it can serve), admit, advance (take and drop what no query can see, plan saves),
publish / register (cache), ran, inputs (the runner's part), deallocate / forget (free), unpublish, reset,
save_points, info. The prefix-hit rule is the fixed point every group can serve: the full group offers h blocks,
the sliding group needs the blocks inside the window before h, the recurrent group a checkpoint at exactly h; h
shrinks until all agree. Chunking stays the scheduler's: a group only says where it saves (save_points)."""
from minivlm.engine.event_log import EventLog
from minivlm.engine.kv_cache.full_attention import FullAttentionManager
from minivlm.engine.kv_cache.recurrent import RecurrentManager
from minivlm.engine.kv_cache.sliding_window import SlidingWindowManager
from minivlm.engine.outputs import GroupInfo


class KVCacheCoordinator:
    """The scheduler's, the core's and the snapshot's one object: the full-attention group's blocks (read through
    as before: blocks, tables, table(seq), free, key_to_block, stats, dirty) and every group driven together."""

    def __init__(self, full: FullAttentionManager, others: list | None = None,
                 layers: list[list[int]] | None = None):
        self.full, self.others = full, list(others or [])
        self.layers = layers or [[]] * (1 + len(self.others))  # each group's decoder layers, full group first
        self.block_size, self.caching, self.events = full.block_size, full.caching, full.events

    # ---- the full group's blocks: the block map, the prefix tree, the plan's block table ----
    blocks = property(lambda self: self.full.blocks)
    tables = property(lambda self: self.full.tables)
    free = property(lambda self: self.full.free)
    key_to_block = property(lambda self: self.full.key_to_block)
    stats = property(lambda self: self.full.stats)
    dirty = property(lambda self: self.full.dirty)
    num_free = property(lambda self: self.full.num_free)

    def table(self, seq) -> list[int]:
        return self.full.table(seq)

    def blocks_needed(self, num_tokens: int) -> int:
        return self.full.blocks_needed(num_tokens)

    # ---- admission: the longest hit every group serves ----
    def match_prefix(self, seq) -> list[int]:
        """The full group's hit, shortened until every group can serve it."""
        hits = self.full.match_prefix(seq)
        n = len(hits)
        while True:
            m = n
            for g in self.others:
                m = g.longest_hit(seq, m)
            if m == n:
                return hits[:n]
            n = m

    def can_allocate(self, seq) -> bool:
        return self.full.can_allocate(seq, self.match_prefix(seq))

    def allocate(self, seq):
        hits = self.full.allocate(seq, self.match_prefix(seq))
        for g in self.others:
            g.admit(seq, len(hits))
        return hits

    # ---- each step ----
    def begin_step(self):
        """A new plan starts."""
        for g in self.others:
            g.begin_step()

    def save_points(self, seq) -> list[int]:
        """Tokens after which some group saves seq's state (the scheduler ends its chunks there)."""
        return sorted({p for g in self.others for p in g.save_points(seq)})

    def advance(self, seq, start: int, end: int):
        """Before seq computes tokens [start, end): every group's blocks taken and given back, saves planned."""
        for g in self.others:
            g.advance(seq, start, end)

    def publish(self, seq, end: int, start: int | None = None) -> list[tuple[int, str]]:
        for g in self.others:
            g.publish(seq, end, start)
        return self.full.publish(seq, end, start)

    def register(self, seq, i: int) -> list[tuple[int, str]]:
        for g in self.others:
            g.register(seq, i)
        return self.full.register(seq, i)

    def ran(self, seq):
        """seq's step ran (num_computed moved): a state saved by it becomes a checkpoint."""
        for g in self.others:
            g.ran(seq)

    def group_inputs(self, seq, start: int, end: int) -> dict:
        """What the runner needs of seq in the other groups (its sliding table, its state slot and their copies)."""
        out = {}
        for g in self.others:
            out.update(g.inputs(seq, start, end))
        return out

    # ---- growth while decoding (the full group; the others grow in advance) ----
    def can_append(self, seq) -> bool:
        return self.full.can_append(seq)

    def append_slot(self, seq):
        self.full.append_slot(seq)

    def reserve(self, seq, num_tokens: int):
        self.full.reserve(seq, num_tokens)

    def trim(self, seq) -> list[int]:
        return self.full.trim(seq)

    # ---- leaving ----
    def deallocate(self, seq):
        self.full.deallocate(seq)
        for g in self.others:
            g.deallocate(seq)

    def forget(self, seq, written: int | None = None):
        for g in self.others:
            g.forget(seq, written)
        self.full.forget(seq, written)

    def unpublish(self, seq, start: int):
        for g in self.others:
            g.unpublish(seq, start)
        self.full.unpublish(seq, start)

    def reset(self):
        self.full.reset()
        for g in self.others:
            g.reset()

    def groups(self, seqs) -> list[GroupInfo]:
        """Every group now, with the tables of `seqs` (running, and waiting ones that hold blocks)."""
        rid = {s.seq_id: s.request_id for s in seqs}
        full = self.full
        return [GroupInfo("full_attention", "full_attention", self.layers[0], None, len(full.blocks), full.num_free,
                          {rid[k]: list(t) for k, t in full.tables.items() if k in rid})] + \
            [g.info(layers, rid) for g, layers in zip(self.others, self.layers[1:])]


def build(pool, block_size: int, caching: bool, events: EventLog | None = None) -> KVCacheCoordinator:
    """The coordinator of a pool (engine/kv_cache/kv_pool.py): one manager per group, numbered as the KV events name them."""
    events = events or EventLog(0)
    if not pool.groups:  # a plain model: one full-attention group over every layer
        return KVCacheCoordinator(FullAttentionManager(pool.num_blocks, block_size, caching, events), [],
                                  [list(range(len(pool.layer_caches)))])
    others, layers = [], [pool.groups["full_attention"].layers]
    for kind, g in pool.groups.items():
        if kind == "full_attention":
            continue
        idx = 1 + len(others)
        others.append(SlidingWindowManager(g.window, g.size, block_size, caching, events, group_idx=idx)
                      if kind == "sliding_window" else RecurrentManager(g.size, block_size, caching, events, idx))
        layers.append(g.layers)
    full = FullAttentionManager(pool.groups["full_attention"].size, block_size, caching, events)
    return KVCacheCoordinator(full, others, layers)


def wire_groups(coordinator: KVCacheCoordinator) -> dict[int, tuple[str, int | None]]:
    """group_idx -> (kind, sliding window) of every group, as the KV events name them."""
    return {0: ("full_attention", None), **{g.group_idx: g.wire() for g in coordinator.others}}
