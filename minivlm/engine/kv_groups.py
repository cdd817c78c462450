"""KV-cache groups (vLLM v1's hybrid KV-cache manager, in small). A hybrid model's layers do not all keep the same
thing: Gemma 3's sliding layers need only the last `window` tokens, Qwen3.5's Gated DeltaNet layers keep one
fixed-size state per request. Each kind of layer gets a group with its own pool and its own table per request:

    full_attention  BlockManager (block_manager.py): every token's K/V, prefix-cached by block key
    sliding_window  SlidingWindowBlocks: the same paged blocks, but blocks wholly out of every future query's window
                    are given back while the request runs (they stay cached by key until reused)
    recurrent       RecurrentStates: one state slot per running request; for the prefix cache, the state is saved
                    into a checkpoint slot at chosen block boundaries, keyed by the block key there

HybridBlockManager is the full-attention group's manager that also drives the others, so the scheduler and the core
speak to one object. A prefix hit must be valid in every group: the full group offers h blocks, the sliding group
needs the blocks inside the window before h, the recurrent group a checkpoint at exactly h; h shrinks until all agree."""
from minivlm.engine.block_manager import BlockManager
from minivlm.engine.outputs import GroupInfo
from minivlm.engine.recurrent_states import RecurrentStates
from minivlm.engine.sliding_window import SlidingWindowBlocks


class HybridBlockManager(BlockManager):
    """The full-attention group's blocks, and the model's other groups driven with them: admission, each step's
    advance, release. The scheduler and the core speak to this one object, as to a plain BlockManager."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool, events, layers: dict[str, list[int]],
                 sliding: SlidingWindowBlocks | None = None, states: RecurrentStates | None = None):
        super().__init__(num_blocks, block_size, caching, events)
        self.sliding, self.states, self.layers = sliding, states, layers
        self.restore: dict[int, int] = {}  # seq_id -> checkpoint slot its admission restores from (until planned)
        self.saves: dict[int, int] = {}    # this step: seq_id -> slot its state is saved into

    def match_prefix(self, seq) -> list[int]:
        """The full group's hit, shortened until every group can serve it."""
        hits = super().match_prefix(seq)
        n = len(hits)
        while True:
            m = self.sliding.valid_hit(seq, n) if self.sliding else n
            m = self.states.valid_hit(seq, m) if self.states else m
            if m == n:
                return hits[:n]
            n = m

    def allocate(self, seq):
        hits = super().allocate(seq)
        if self.sliding:
            self.sliding.take_hits(seq, len(hits))
        if self.states:
            self.restore[seq.seq_id] = self.states.admit(seq, len(hits))
        return hits

    def begin_step(self):
        self.saves = {}
        if self.states:
            self.states.begin_step()

    def save_points(self, seq) -> list[int]:
        return self.states.save_points(seq) if self.states else []

    def advance(self, seq, start: int, end: int):
        if self.sliding:
            self.sliding.advance(seq, start, end)
        if self.states:
            self.saves[seq.seq_id] = self.states.plan_save(seq, start, end)

    def publish(self, seq, end: int, start: int | None = None) -> list[tuple[int, str]]:
        if self.sliding:
            self.sliding.publish(seq, end, start)
        return super().publish(seq, end, start)

    def register(self, seq, i: int) -> list[tuple[int, str]]:
        if self.sliding and seq.seq_id in self.sliding.tables:
            self.sliding.register(seq, i)
        self.ran(seq)
        return super().register(seq, i)

    def ran(self, seq):
        if self.states:
            self.states.commit(seq)

    def group_inputs(self, seq, start: int, end: int) -> dict:
        out, bs = {}, self.block_size
        if self.sliding:
            table = self.sliding.table(seq)
            out["sliding_table"] = tuple(b if b is not None else 0 for b in table)
            out["sliding_slots"] = tuple(table[t // bs] * bs + t % bs for t in range(start, end))
        if self.states:
            out.update(state_slot=self.states.slot_of[seq.seq_id], restore_from=self.restore.pop(seq.seq_id, -1),
                       save_to=self.saves.get(seq.seq_id, -1))
        return out

    def deallocate(self, seq):
        super().deallocate(seq)
        self._release_others(seq)

    def forget(self, seq, written: int | None = None):
        if self.sliding:
            self.sliding.forget(seq, written)
        super().forget(seq, written)
        self._release_others(seq)

    def _release_others(self, seq):
        if self.sliding:
            self.sliding.deallocate(seq)
        if self.states:
            self.states.release(seq)
        self.restore.pop(seq.seq_id, None)

    def unpublish(self, seq, start: int):
        if self.sliding:
            self.sliding.unpublish(seq, start)
        super().unpublish(seq, start)

    def reset(self):
        super().reset()
        if self.sliding:
            self.sliding.reset()
        if self.states:
            self.states.reset()

    def groups(self, seqs) -> list[GroupInfo]:
        """Every group now, with the tables of `seqs` (running, and waiting ones that hold blocks)."""
        rid = {s.seq_id: s.request_id for s in seqs}
        out = [GroupInfo("full_attention", "full_attention", self.layers["full_attention"], None, len(self.blocks),
                         self.num_free, {rid[k]: list(t) for k, t in self.tables.items() if k in rid})]
        if self.sliding:
            out.append(GroupInfo("sliding_window", "sliding_window", self.layers["sliding_window"], self.sliding.window,
                                 len(self.sliding.blocks), self.sliding.num_free,
                                 {rid[k]: list(t) for k, t in self.sliding.tables.items() if k in rid}))
        if self.states:
            s = self.states
            out.append(GroupInfo("recurrent", "recurrent", self.layers["recurrent"], None, s.num_slots, len(s.free),
                                 {rid[k]: [slot] for k, slot in s.slot_of.items() if k in rid}, dict(s.checkpoints)))
        return out


def manager(pool, block_size: int, caching: bool, events) -> HybridBlockManager:
    """The block manager of a hybrid model's pool (engine/kv_pool.py built one tensor per group)."""
    groups = pool.groups
    sliding = states = None
    if "sliding_window" in groups:
        g = groups["sliding_window"]
        sliding = SlidingWindowBlocks(g.window, g.size, block_size, caching, events, group_idx=1)
    if "recurrent" in groups:
        states = RecurrentStates(groups["recurrent"].size, block_size, caching, events, group_idx=1 + bool(sliding))
    return HybridBlockManager(groups["full_attention"].size, block_size, caching, events,
                              {k: g.layers for k, g in groups.items()}, sliding, states)


def wire_groups(bm) -> dict[int, tuple[str, int | None]]:
    """group_idx -> (kind, sliding window) of every group, as the KV events name them."""
    out = {0: ("full_attention", None)}
    if getattr(bm, "sliding", None):
        out[bm.sliding.group_idx] = ("sliding_window", bm.sliding.window)
    if getattr(bm, "states", None):
        out[bm.states.group_idx] = ("recurrent", None)
    return out
