"""The recurrent group's manager: state slots and their checkpoints (coordinator.py explains the groups and their
one interface)."""
from collections import OrderedDict, deque

from minivlm.engine.kv_cache.group_manager import GroupManager
from minivlm.engine.kv_cache.group_steps import StateGroupStep
from minivlm.engine.outputs import GroupInfo


class RecurrentManager(GroupManager):
    """A recurrent group's state slots: one per running request, the rest hold checkpoints (a state saved at a
    block boundary, keyed by the block key there, least recently used evicted first). A hit can only resume where a
    state was saved, so where to save decides what a later request reuses (docs/ENGINE.md, "Where recurrent state is
    saved"): every block boundary from the prompt's last one at or before its generation prompt to its last one before its
    last token (save_points; one or two): a follow-up turn keeps the conversation before the generation prompt
    (Qwen3.5's `<think>\\n` or `<think>\\n\\n</think>\\n\\n` is not in its history), so it resumes at the last full
    block it shares, and the same prompt again at the last one; and, while a request decodes, its latest block
    boundary (one per request, moved forward: a follow-up that quotes the answer resumes further on). Saving needs
    the step to end there: the scheduler ends a prefill chunk at each save point."""
    kind = "recurrent"
    rewinds = False  # a state holds every token before it: it cannot go back to an earlier one
    # guesses are verified with the state after each of them kept for the step, and the one after the last accepted
    # guess copied back into the slot (StateGroupStep.draft; docs/ENGINE.md, "Speculation on hybrid models")
    speculates = True

    def __init__(self, num_slots: int, block_size: int, caching: bool, events, group_idx: int):
        self.num_slots, self.block_size, self.caching, self.events = num_slots, block_size, caching, events
        self.group_idx = group_idx
        self.free: deque[int] = deque(range(num_slots))
        self.slot_of: dict[int, int] = {}             # seq_id -> its running slot
        self.checkpoints: OrderedDict[str, int] = OrderedDict()  # block key -> slot, least recently used first
        self.pending: dict[int, tuple[int, int]] = {}  # seq_id -> (token boundary, slot) saved by its current step
        self.latest: dict[int, str] = {}               # seq_id -> key of its moving decode checkpoint
        self.pinned: set[int] = set()                  # this step: slots restored from or saved into (not evicted)
        self.restore: dict[int, int] = {}  # seq_id -> checkpoint slot its admission restores from (until planned)
        self.saves: dict[int, int] = {}    # this step: seq_id -> slot its state is saved into
        self.stats = {"checkpoints_saved": 0, "checkpoint_hits": 0}

    @classmethod
    def make(cls, pool, group_idx: int, block_size: int, caching: bool, events):
        """The manager of the pool's recurrent group (kv_pool.GroupPool: its size in state slots)."""
        return cls(pool.size, block_size, caching, events, group_idx)

    def begin_step(self):
        self.pinned, self.saves = set(), {}

    def longest_hit(self, seq, n: int) -> int:
        """The most blocks <= n whose boundary has a checkpoint (0 always works: start from a zero state)."""
        while n > 0 and seq.block_keys[n - 1] not in self.checkpoints:
            n -= 1
        return n

    def last_boundary(self, seq) -> int:
        """The prompt's last block boundary before its last token: a save past it is a decode checkpoint."""
        return (seq.num_prompt_tokens - 1) // self.block_size * self.block_size

    def save_points(self, seq) -> list[int]:
        """The prompt's block boundaries whose state is saved: from the last one at or before its generation prompt
        (a follow-up turn parts from this prompt there or later) to the last one before its last token."""
        if not self.caching:
            return []
        bs, last = self.block_size, self.last_boundary(seq)
        first = max(0, seq.num_prompt_tokens - max(seq.generation_tokens, 1)) // bs * bs
        return list(range(max(first, bs), last + 1, bs))

    def admit(self, seq, n: int):
        """seq's running slot; with an n-block hit, the checkpoint it restores from (else it starts from zeros)."""
        source = -1
        if n:
            key = seq.block_keys[n - 1]
            self.checkpoints.move_to_end(key)
            self.stats["checkpoint_hits"] += 1
            source = self.checkpoints[key]
            self.pinned.add(source)
        slot = self._take()
        if slot < 0:  # the slots are sized so that this never happens (budget/kv_groups.py)
            raise RuntimeError(f"recurrent state slots exhausted: {self.num_slots} slots, all in use")
        self.slot_of[seq.seq_id] = slot
        self.restore[seq.seq_id] = source

    def advance(self, seq, start: int, end: int):
        """Before seq computes tokens [start, end): where its state is saved after the step, if anywhere."""
        self.saves[seq.seq_id] = self.plan_save(seq, start, end)

    def plan_save(self, seq, start: int, end: int) -> int:
        """The slot seq's state is copied to after this step (-1: none): at one of the prompt's save points, or at a
        block boundary the prompt's end or a decode reaches (a follow-up that keeps the whole prompt resumes there)."""
        if not self.caching or end % self.block_size or end == 0 or end <= start:
            return -1
        if end < seq.num_prompt_tokens and end not in self.save_points(seq):
            return -1
        i = end // self.block_size - 1
        if i < len(seq.block_keys) and seq.block_keys[i] in self.checkpoints:
            return -1  # the same content is saved already
        slot = self._take()
        if slot < 0:
            return -1
        self.pinned.add(slot)
        self.pending[seq.seq_id] = (end, slot)
        return slot

    def ran(self, seq):
        """seq's step ran and its key for the boundary exists: the saved state becomes a checkpoint."""
        end, slot = self.pending.get(seq.seq_id, (-1, -1))
        if end < 0 or seq.num_computed < end or len(seq.block_keys) < end // self.block_size:
            return
        del self.pending[seq.seq_id]
        key = seq.block_keys[end // self.block_size - 1]
        if key in self.checkpoints:
            self.free.append(slot)
            return
        if end > self.last_boundary(seq):  # a decode checkpoint moves: the request's previous one goes
            old = self.latest.pop(seq.seq_id, None)
            if old in self.checkpoints:
                self.free.append(self.checkpoints.pop(old))
            self.latest[seq.seq_id] = key
        self.checkpoints[key] = slot
        self.stats["checkpoints_saved"] += 1
        i = end // self.block_size - 1
        self.events.emit("state_saved", seq.request_id, slot=slot, token=end, group=self.group_idx, block_hash=key,
                         parent_block_hash=seq.block_keys[i - 1] if i else None,
                         token_ids=seq.block_tokens(i, self.block_size), extra_keys=seq.block_extras[i])

    def deallocate(self, seq):
        """seq leaves (finished, preempted, failed): its running slot and any unsaved checkpoint slot go back."""
        slot = self.slot_of.pop(seq.seq_id, None)
        if slot is not None:
            self.free.append(slot)
        pending = self.pending.pop(seq.seq_id, None)
        if pending is not None:  # its step never completed the save
            self.free.append(pending[1])
        self.latest.pop(seq.seq_id, None)
        self.restore.pop(seq.seq_id, None)

    def register(self, seq, i: int) -> list:
        self.ran(seq)  # a decode completed a block: the state saved at its end is a checkpoint now
        return []  # a state is no block: nothing published (nor to unpublish: it is saved only after a whole step)

    def step_part(self, seq, start: int, end: int) -> StateGroupStep:
        """seq's part of this step in this group: its slot, the checkpoint it restores from, the slot it saves to, and
        how many guesses past its own tokens [start, end) covers (their states are kept only for the step: a save
        planned by advance is the state after its own tokens)."""
        return StateGroupStep(self.slot_of[seq.seq_id], self.restore.pop(seq.seq_id, -1), self.saves.get(seq.seq_id, -1),
                              max(0, end - len(seq)))

    def info(self, layers: list[int], rid: dict[int, str]) -> GroupInfo:
        return GroupInfo(self.kind, self.kind, layers, None, self.num_slots, len(self.free),
                         {rid[k]: [slot] for k, slot in self.slot_of.items() if k in rid}, dict(self.checkpoints))

    def _take(self) -> int:
        if self.free:
            return self.free.popleft()
        for key, slot in self.checkpoints.items():  # evict the least recently used checkpoint not in use now
            if slot not in self.pinned:
                del self.checkpoints[key]
                self.events.emit("state_evicted", slot=slot, group=self.group_idx, block_hash=key)
                return slot
        return -1

    def reset(self):
        self.free.extend(self.checkpoints.values())
        self.checkpoints.clear()
        self.latest.clear()

    def held(self) -> dict[int, int]:
        return dict(self.slot_of)
