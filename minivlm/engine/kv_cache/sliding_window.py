"""The sliding-window group's manager (coordinator.py explains the groups and their one interface)."""
from minivlm.engine.kv_cache.full_attention import FullAttentionManager
from minivlm.inputs.image_layout import runs


class SlidingWindowManager(FullAttentionManager):
    """A sliding-window group's blocks. A query at position p sees keys p - window + 1 .. p, so once a request
    computes from token `start` on, its blocks that end before start - window + 1 are never read again: they leave
    its table (None there) and go back to the free queue, keeping their key for later prefix hits. Blocks are
    allocated as steps reach them, not at admission: a request holds at most ceil((window - 1 + chunk) / block) + 1."""

    def __init__(self, window: int, *args, group_idx: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.window, self.group_idx = window, group_idx

    @classmethod
    def make(cls, pool, group_idx: int, block_size: int, caching: bool, events):
        return cls(pool.window, pool.size, block_size, caching, events, group_idx=group_idx)

    def first_needed(self, start: int) -> int:
        """The first block a query at token `start` (or later) may read."""
        return max(0, start - self.window + 1) // self.block_size

    kind = "sliding_window"
    # guesses: blocks reserved up to the last guessed slot (reserve), given back past the accepted tokens (trim);
    # blocks leave the window only as `advance` reaches a step's first token, the oldest query any guess made
    speculates = True

    def longest_hit(self, seq, n: int) -> int:
        """The most blocks <= n of seq's prefix this group can serve: those inside the window before the hit point
        must be cached (older ones are never read), and (spans_reach_back) it does not end inside an image that
        began before that window."""
        while n > 0 and (not all(self._cached(seq, i) for i in range(self.first_needed(n * self.block_size), n))
                         or self._inside_far_image(seq, n * self.block_size)):
            n -= 1
        return n

    spans_reach_back = False  # Gemma 4 12B: an image's tokens see its first one past the window (set by the engine)

    def _inside_far_image(self, seq, p: int) -> bool:
        """Token p is inside an image whose first token lies before p's window: the image's rest would read blocks
        this group gave back."""
        if not self.spans_reach_back or not seq.images:
            return False
        first = self.first_needed(p) * self.block_size
        return any(a < p < b and a < first for a, b in runs(seq.token_types[:seq.num_prompt_tokens]))

    def _cached(self, seq, i: int) -> bool:
        b = self.key_to_block.get(seq.block_keys[i]) if i < len(seq.block_keys) else None
        return b is not None and self.blocks[b].token_ids == seq.block_tokens(i, self.block_size)

    def admit(self, seq, n: int):
        """seq's table at admission with an n-block hit: None for the blocks out of the window, the cached blocks
        inside it (shared)."""
        table = self.tables.setdefault(seq.seq_id, [])
        first = self.first_needed(n * self.block_size)
        self.taken[seq.seq_id], self.dropped[seq.seq_id] = [], list(range(first))  # never held: before the window
        table += [None] * first
        for i in range(first, n):
            b = self.key_to_block[seq.block_keys[i]]
            if self.blocks[b].ref_count == 0:
                self.free.remove(b)  # revive a cached-but-free block
            self.blocks[b].ref_count += 1
            self.dirty.add(b)
            table.append(b)
        self.shared[seq.seq_id] = [0 if b is None else b for b in table]

    def blocks_to_advance(self, seq, start: int, end: int) -> int:
        """Fresh blocks seq needs to compute tokens [start, end)."""
        return max(0, -(-end // self.block_size) - len(self.table(seq)))

    def advance(self, seq, start: int, end: int) -> list[int]:  # drop what no query can see, take what it will
        """Before seq computes tokens [start, end): give back its blocks out of the window, take blocks up to end."""
        table = self.tables.setdefault(seq.seq_id, [])
        gone = []
        for i in range(min(self.first_needed(start), len(table))):
            if table[i] is not None:
                gone.append(self._drop(table[i]))
                table[i] = None
                self.dropped.setdefault(seq.seq_id, []).append(i)
        if gone:
            left = [b for b in gone if b is not None]
            self.events.emit("freed", seq.request_id, block_ids=left, cached=self.servable(left), group=self.group_idx,
                             window=self.window)  # they left its window; cached: what a later lookup finds
        need = self.blocks_to_advance(seq, start, end)
        if need > self.num_free:  # the pool is sized so that this never happens (budget/kv_groups.py)
            raise RuntimeError(f"sliding-window pool exhausted: {seq.request_id} needs {need} blocks, {self.num_free} free")
        fresh = [self._take_free() for _ in range(need)]
        table += fresh
        self.taken.setdefault(seq.seq_id, []).extend(fresh)
        if fresh:
            self.events.emit("allocated", seq.request_id, block_ids=fresh, group=self.group_idx)
        return fresh

    def reserve(self, seq, num_tokens: int):
        """Blocks for seq's guesses up to num_tokens: as `advance` for a step from its next token (its num_computed,
        the oldest query of the step: what no guess can see goes back first, never what the token itself reads)."""
        self.advance(seq, seq.num_computed, num_tokens)

    def _drop(self, b: int) -> int | None:
        block = self.blocks[b]
        block.ref_count -= 1
        self.dirty.add(b)
        if block.ref_count == 0:
            self.free.append(b)
            return b
        return None

    def register(self, seq, i: int) -> list[tuple[int, str]]:
        return super().register(seq, i) if seq.seq_id in self.tables else []
