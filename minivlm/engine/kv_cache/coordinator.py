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
    kv_shared       KVSharedManager (kv_shared.py): Gemma 4's layers that read another layer's K/V own nothing:
                    every call answers "nothing here", its part names the groups its layers read

Every group's manager answers the same calls (group_manager.py: the interface, with what a group that has nothing of
that kind does), which the coordinator makes for each in turn (`managers`, indexed by group id, as the plan's parts and
the KV events number them): longest_hit (how much of a hit it can serve), admit,
begin_step, advance (take and drop what no query can see, plan saves), publish / register (cache), ran, step_part (its
part of the plan: an AttentionGroupStep or a StateGroupStep, group_steps.py), deallocate / forget (free), unpublish,
reset, save_points, info, wire. The prefix-hit rule is the fixed point every group can serve: the full group offers h
blocks, the sliding group needs the blocks inside the window before h, the recurrent group a checkpoint at exactly h;
h shrinks until all agree. Chunking stays the scheduler's: a group only says where it saves (save_points).

One group still leads: the full-attention group (group 0). Only it holds every block of a prompt under its key, so
only it can offer a hit for the others to shorten (a sliding group gives blocks back, a recurrent one keeps states at
a few boundaries); and its table is the one the block map, the prefix tree, preemption and decode growth (can_append,
append_slot, reserve, trim: the others grow in advance) are told in, so the coordinator reads it through as
`blocks`, `tables`, `table(seq)`. Every model has that group: a decoder without one is refused by kv_pool.py."""
from minivlm.engine.event_log import EventLog
from minivlm.engine.kv_cache.full_attention import FullAttentionManager
from minivlm.engine.kv_cache.group_manager import GroupManager
from minivlm.engine.kv_cache.kv_shared import KVSharedManager
from minivlm.engine.kv_cache.recurrent import RecurrentManager
from minivlm.engine.kv_cache.sliding_window import SlidingWindowManager
from minivlm.engine.outputs import GroupInfo


class KVCacheCoordinator:
    """The scheduler's, the core's and the snapshot's one object: every group's manager driven together, and the
    leading full-attention group's blocks read through (blocks, tables, table(seq), free, key_to_block, stats, dirty)."""

    def __init__(self, managers: list[GroupManager], layers: list[list[int]] | None = None):
        self.managers = list(managers)   # by group id; group 0 is the full-attention group, which leads
        self.full = self.managers[0]
        self.layers = layers or [[]] * len(self.managers)  # each group's decoder layers
        self.block_size, self.caching, self.events = self.full.block_size, self.full.caching, self.full.events

    # ---- the leading group's blocks: the block map, the prefix tree, preemption ----
    blocks = property(lambda self: self.full.blocks)
    tables = property(lambda self: self.full.tables)
    free = property(lambda self: self.full.free)
    key_to_block = property(lambda self: self.full.key_to_block)
    stats = property(lambda self: self.full.stats)
    dirty = property(lambda self: self.full.dirty)
    num_free = property(lambda self: self.full.num_free)

    def table(self, seq) -> list[int]:
        return self.full.table(seq)

    @property
    def rewinds(self) -> bool:
        """Every group can go back to an earlier token (a recurrent state cannot: it is recomputed from zero)."""
        return all(g.rewinds for g in self.managers)

    def blocks_needed(self, num_tokens: int) -> int:
        return self.full.blocks_needed(num_tokens)

    @property
    def speculates(self) -> bool:
        """Guesses can be held and given back in every group (its manager's `speculates`: the full and sliding groups
        reserve blocks for them and trim those past the accepted tokens, a recurrent group keeps each guess's state for
        the step and puts the accepted one back; docs/ENGINE.md, "Speculation on hybrid models")."""
        return all(g.speculates for g in self.managers)

    # the group of a kind, or None: what spec_decode/ngram.py's why_not asks (prefer `speculates`)
    states = property(lambda self: next((g for g in self.managers if g.kind == "recurrent"), None))
    sliding = property(lambda self: next((g for g in self.managers if g.kind == "sliding_window"), None))

    # ---- admission: the longest hit every group serves ----
    def match_prefix(self, seq) -> list[int]:
        """The leading group's hit, shortened until every group can serve it."""
        hits = self.full.match_prefix(seq)
        n = len(hits)
        while True:
            m = n
            for g in self.managers:
                m = g.longest_hit(seq, m)
            if m == n:
                return hits[:n]
            n = m

    def can_allocate(self, seq) -> bool:
        return self.full.can_allocate(seq, self.match_prefix(seq))

    def allocate(self, seq):
        """seq's tables with the hit every group serves; returns the leading group's CacheHits."""
        hits = self.full.allocate(seq, self.match_prefix(seq))
        for g in self.managers:
            g.admit(seq, len(hits))
        return hits

    # ---- each step ----
    def begin_step(self):
        """A new plan starts."""
        for g in self.managers:
            g.begin_step()

    def save_points(self, seq) -> list[int]:
        """Tokens after which some group saves seq's state (the scheduler ends its chunks there)."""
        return sorted({p for g in self.managers for p in g.save_points(seq)})

    def advance(self, seq, start: int, end: int):
        """Before seq computes tokens [start, end): every group's blocks taken and given back, saves planned."""
        for g in self.managers:
            g.advance(seq, start, end)

    def publish(self, seq, end: int, start: int | None = None) -> list[tuple[int, str]]:
        """Every group caches the full blocks [start, end) completes; the leading group's (last, as its events always
        came) are the plan's."""
        return [g.publish(seq, end, start) for g in reversed(self.managers)][-1]

    def register(self, seq, i: int) -> list[tuple[int, str]]:
        return [g.register(seq, i) for g in reversed(self.managers)][-1]

    def ran(self, seq):
        """seq's step ran (num_computed moved): a state saved by it becomes a checkpoint."""
        for g in self.managers:
            g.ran(seq)

    def step_parts(self, seq, start: int, end: int) -> tuple:
        """seq's part of this step in every group, by group id (the plan's ScheduledRequest.groups); [start, end):
        the tokens it computes, its draft's included."""
        return tuple(g.step_part(seq, start, end) for g in self.managers)

    # ---- growth while decoding (the leading group; the others grow in advance) ----
    def can_append(self, seq) -> bool:
        return self.full.can_append(seq)

    def append_slot(self, seq):
        self.full.append_slot(seq)

    def reserve(self, seq, num_tokens: int):
        """Room for seq's guesses up to num_tokens in every group (the leading group's free blocks bound them)."""
        for g in self.managers:
            g.reserve(seq, num_tokens)

    def trim(self, seq) -> list[int]:
        """Every group gives back what only rejected guesses held; the leading group's blocks are returned."""
        return [g.trim(seq) for g in reversed(self.managers)][-1]

    # ---- leaving ----
    def deallocate(self, seq):
        for g in self.managers:
            g.deallocate(seq)

    def forget(self, seq, written: int | None = None):
        for g in reversed(self.managers):
            g.forget(seq, written)

    def unpublish(self, seq, start: int):
        for g in reversed(self.managers):
            g.unpublish(seq, start)

    def reset(self):
        for g in self.managers:
            g.reset()

    def groups(self, seqs) -> list[GroupInfo]:
        """Every group now, with the tables of `seqs` (running, and waiting ones that hold blocks)."""
        rid = {s.seq_id: s.request_id for s in seqs}
        return [g.info(layers, rid) for g, layers in zip(self.managers, self.layers)]


MANAGERS = {cls.kind: cls for cls in (FullAttentionManager, SlidingWindowManager, RecurrentManager, KVSharedManager)}


def build(pool, block_size: int, caching: bool, events: EventLog | None = None) -> KVCacheCoordinator:
    """The coordinator of a pool (engine/kv_cache/kv_pool.py): one manager per group, numbered as the KV events name
    them (full attention first)."""
    events = events or EventLog(0)
    if not pool.groups:  # a plain model: one full-attention group over every layer
        return KVCacheCoordinator([FullAttentionManager(pool.num_blocks, block_size, caching, events)],
                                  [list(range(len(pool.layer_caches)))])
    managers = [MANAGERS[g.kind].make(g, idx, block_size, caching, events) for idx, g in enumerate(pool.groups.values())]
    return KVCacheCoordinator(managers, [g.layers for g in pool.groups.values()])


def wire_groups(coordinator: KVCacheCoordinator) -> dict[int, tuple[str, int | None]]:
    """group_idx -> (kind, sliding window) of every group, as the KV events name them."""
    return {idx: g.wire() for idx, g in enumerate(coordinator.managers)}
