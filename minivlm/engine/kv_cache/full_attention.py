"""The full-attention group's manager: physical KV blocks, a free queue, reference counts, and a hash table that lets
freed blocks be revived. Its blocks are the prefix cache's (the block map, the prefix tree, the plan's block table);
the coordinator (coordinator.py) asks the other groups how much of its hit they can serve."""
from collections import deque

from minivlm.engine.event_log import EventLog
from minivlm.engine.kv_cache.group_manager import GroupManager
from minivlm.engine.kv_cache.group_steps import AttentionGroupStep
from minivlm.engine.outputs import CacheHit, GroupInfo
from minivlm.engine.kv_cache.snapshot import block_kind, holds_video, video_spans


class Block:
    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.key: str | None = None       # prefix-cache key under the engine's strategy
        self.truth: str | None = None     # strategy-C key of the content actually stored here
        self.parent: str | None = None    # key of the block before it in its chain (an edge of the prefix tree)
        self.token_ids: list[int] = []
        self.kind = "free"                # text | image | mixed | video, remembered for cached-but-free blocks


class FullAttentionManager(GroupManager):
    """Allocates blocks to sequences. Full blocks are registered by key; a freed block keeps its key (and KV)
    until the free queue hands it out again, so an identical prefix arriving later is served from it. Its blocks come
    at admission (allocate, which the coordinator calls with the hit) and as a decode reaches them (append_slot,
    reserve): nothing to do in admit or advance; every block of a hit is one it offered (match_prefix)."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool, events=None):
        self.block_size = block_size
        self.caching = caching
        self.events = events or EventLog(0)  # every change of a block's owner or key is logged here
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: deque[int] = deque(range(num_blocks))  # left = evicted first
        self.key_to_block: dict[str, int] = {}
        self.stats = {"hits": 0, "true_hits": 0, "false_hits": 0, "lookups": 0}
        self.dirty: set[int] = set()  # blocks whose state changed since the last snapshot
        self.tables: dict[int, list[int]] = {}  # seq_id -> its block table (vLLM's req_to_blocks); only here written
        self.group_idx = 0  # which KV-cache group this pool is (0: the full-attention one; coordinator.py numbers the others)
        # this step, per seq_id: what its part of the plan says (step_part): blocks taken, its table at admission,
        # indices given back out of the window (sliding_window.py)
        self.taken: dict[int, list[int]] = {}
        self.shared: dict[int, list[int]] = {}
        self.dropped: dict[int, list[int]] = {}

    kind = "full_attention"
    speculates = True  # blocks reserved for guesses (reserve), those past the accepted tokens given back (trim)

    @classmethod
    def make(cls, pool, group_idx: int, block_size: int, caching: bool, events):
        """The manager of one group of a pool (kv_pool.GroupPool: its size in blocks)."""
        made = cls(pool.size, block_size, caching, events)
        made.group_idx = group_idx
        return made

    def table(self, seq) -> list[int]:
        """seq's physical block ids in logical order (empty when it holds none); read it, never write it."""
        return self.tables.get(seq.seq_id, [])

    @property
    def num_free(self) -> int:
        return len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def match_prefix(self, seq) -> list[int]:
        """Leading full blocks of seq already in the cache; at least one token is always left to compute."""
        if not self.caching:
            return []
        hits = []
        for i, key in enumerate(seq.block_keys[:(len(seq) - 1) // self.block_size]):
            b = self.key_to_block.get(key)
            if b is None or self.blocks[b].token_ids != seq.block_tokens(i, self.block_size):
                break
            hits.append(b)
        return hits

    def can_allocate(self, seq, hits: list[int] | None = None) -> bool:
        hits = self.match_prefix(seq) if hits is None else hits
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return self.blocks_needed(len(seq)) - len(hits) + revived <= self.num_free

    def allocate(self, seq, hits: list[int] | None = None) -> list[CacheHit]:
        """Give seq a block table for all its tokens: cache hits first (shared; default its match_prefix, the
        coordinator passes the hit every group can serve), fresh blocks for the rest; returns the hits (its first
        len(hits) * block_size tokens need no computing). The scheduler publishes the fresh blocks as the steps that
        fill them are scheduled (publish)."""
        assert seq.seq_id not in self.tables
        hits = self.match_prefix(seq) if hits is None else hits
        cache_hits, table = [], self.tables.setdefault(seq.seq_id, [])
        for i, b in enumerate(hits):
            block = self.blocks[b]
            if block.ref_count == 0:
                self.free.remove(b)  # revive a cached-but-free block
            block.ref_count += 1
            self.dirty.add(b)
            false_hit = block.truth != seq.truth_keys[i]
            cache_hits.append(CacheHit(b, i, false_hit))
            table.append(b)
        cached = len(hits) * self.block_size
        self.events.emit("cache_lookup", seq.request_id, hits=cache_hits, num_cached_tokens=cached)
        if seq.num_output_tokens == 0 and self.caching:  # a re-admission after preemption is not a new prompt lookup
            self.stats["lookups"] += 1
            self.stats["hits"] += len(hits)
            self.stats["false_hits"] += sum(h.false_hit for h in cache_hits)
            self.stats["true_hits"] += sum(not h.false_hit for h in cache_hits)
        fresh = [self._take_free() for _ in range(len(hits), self.blocks_needed(len(seq)))]
        table += fresh
        self.shared[seq.seq_id], self.taken[seq.seq_id] = list(hits), list(fresh)
        self.events.emit("allocated", seq.request_id, block_ids=fresh, **self._group())
        return cache_hits

    def publish(self, seq, end: int, start: int | None = None) -> list[tuple[int, str]]:
        """Register the full blocks that computing seq's tokens [start, end) completes (start: its num_computed);
        returns the (block id, key) of each block newly published."""
        start = seq.num_computed if start is None else start
        return [p for i in range(start // self.block_size, end // self.block_size) for p in self.register(seq, i)]

    def register(self, seq, i: int) -> list[tuple[int, str]]:
        """Publish full block i of seq under its key (its K/V are written in the current step)."""
        if not self.caching or i >= len(seq.block_keys) or self.tables[seq.seq_id][i] is None:
            return []
        block = self.blocks[self.tables[seq.seq_id][i]]
        if block.key == seq.block_keys[i]:
            return []  # already published (a cache hit, or a recomputed block that kept its key)
        block.key, block.truth = seq.block_keys[i], seq.truth_keys[i]
        block.parent = seq.block_keys[i - 1] if i else None
        block.token_ids = seq.block_tokens(i, self.block_size)
        block.kind = self._kind(seq, i)
        self.key_to_block.setdefault(block.key, block.block_id)
        self.dirty.add(block.block_id)
        self.events.emit("BlockStored", seq.request_id, block_ids=[block.block_id], block_hashes=[block.key],
                         parent_block_hash=block.parent, token_ids=block.token_ids,
                         extra_keys=seq.block_extras[i], block_kind=block.kind, **self._group())
        return [(block.block_id, block.key)]

    def _kind(self, seq, i: int) -> str:
        """Block i's kind for the BlockStored event (docs/API.md promises `block_kind`) and the block map of cached
        blocks: the one display fact computed here, kept cheap: a request without images says "text" at once (one
        test per publish, the decode's path); only an image request reads its block's token types and videos."""
        if not seq.images:
            return "text"
        start, end = i * self.block_size, (i + 1) * self.block_size
        return block_kind(seq.token_types[start:end], holds_video(video_spans(seq), start, end))

    def servable(self, ids: list[int]) -> list[int]:
        """The blocks among ids a later prefix lookup finds (published, and the key's indexed block)."""
        return [b for b in ids if self.blocks[b].key is not None and self.key_to_block.get(self.blocks[b].key) == b]

    def _take_free(self) -> int:
        b = self.free.popleft()
        block = self.blocks[b]
        assert block.ref_count == 0
        if block.key is not None:  # evict: its old content is about to be overwritten
            self._unpublish(block)
        block.token_ids = []
        block.ref_count = 1
        self.dirty.add(b)
        return b

    def deallocate(self, seq):
        """Drop seq's references; blocks reaching zero go to the free queue, tail blocks first to be evicted."""
        freed = []
        for step in (self.taken, self.shared, self.dropped):
            step.pop(seq.seq_id, None)
        for b in reversed(self.tables.pop(seq.seq_id, [])):
            if b is None:  # a sliding-window block already given back (sliding_window.py)
                continue
            block = self.blocks[b]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {b} freed twice"
            self.dirty.add(b)
            if block.ref_count == 0:
                self.free.append(b)
                freed.append(b)
        if freed:
            self.events.emit("freed", seq.request_id, block_ids=freed, cached=self.servable(freed), **self._group())

    def forget(self, seq, written: int | None = None):
        """Unpublish blocks whose K/V were never written (a failed step: tokens from `written`, by default its
        num_computed, on), then free them."""
        written = seq.num_computed if written is None else written
        for b in self.table(seq)[written // self.block_size:]:
            if b is not None and self.blocks[b].key is not None:
                self._unpublish(self.blocks[b])
        self.deallocate(seq)

    def unpublish(self, seq, start: int):
        """Unpublish seq's blocks from token `start` on and keep them: their K/V rest on K/V never written (a block it
        hit lost its publisher in the same step), so it computes them again (EngineCore.update rewinds it)."""
        for b in self.table(seq)[start // self.block_size:]:
            if b is None:
                continue
            self.dirty.add(b)
            if self.blocks[b].key is not None:
                self._unpublish(self.blocks[b])

    def _unpublish(self, block: Block):
        if self.key_to_block.get(block.key) == block.block_id:
            del self.key_to_block[block.key]
        self.events.emit("BlockRemoved", block_ids=[block.block_id], block_hashes=[block.key], **self._group())
        block.key = block.truth = None

    def can_append(self, seq) -> bool:
        """Room for the K/V of seq's newest token."""
        return self.blocks_needed(len(seq)) <= len(self.table(seq)) or self.num_free > 0

    def append_slot(self, seq):
        table = self.tables[seq.seq_id]
        if self.blocks_needed(len(seq)) > len(table):
            table.append(self._take_free())
            self.taken.setdefault(seq.seq_id, []).append(table[-1])
            self.events.emit("allocated", seq.request_id, block_ids=table[-1:], **self._group())

    def reserve(self, seq, num_tokens: int):
        """Blocks for seq's first num_tokens tokens (a speculating request's guesses go past its length)."""
        table = self.tables[seq.seq_id]
        while self.blocks_needed(num_tokens) > len(table):
            table.append(self._take_free())
            self.taken.setdefault(seq.seq_id, []).append(table[-1])
            self.events.emit("allocated", seq.request_id, block_ids=table[-1:], **self._group())

    def trim(self, seq) -> list[int]:
        """Give back the blocks past seq's length (where its rejected guesses were); they held nothing published."""
        table, extra = self.tables.get(seq.seq_id, []), []
        while len(table) > self.blocks_needed(len(seq)):
            b = table.pop()
            block = self.blocks[b]
            block.ref_count -= 1
            self.dirty.add(b)
            if block.ref_count == 0:
                self.free.append(b)
                extra.append(b)
        if extra:
            self.events.emit("freed", seq.request_id, block_ids=extra, cached=[], rejected_draft=True,
                             **self._group())
        return extra

    def reset(self):
        """Forget every cached-but-free block (used blocks keep their content)."""
        for b in self.free:
            self.blocks[b].key = self.blocks[b].truth = None
            self.dirty.add(b)
        self.key_to_block = {k: b for k, b in self.key_to_block.items() if self.blocks[b].ref_count > 0}
        if not self.group_idx:
            self.events.emit("AllBlocksCleared")

    # ---- the interface every group's manager answers (coordinator.py) ----
    def begin_step(self):
        """A new plan starts: nothing taken in it yet."""
        self.taken, self.shared, self.dropped = {}, {}, {}

    def step_part(self, seq, start: int, end: int) -> AttentionGroupStep:
        """seq's part of this step in this group: its table's change, and the slot of each token in [start, end)."""
        table, bs, sid = self.table(seq), self.block_size, seq.seq_id
        return AttentionGroupStep(len(table), tuple(self.taken.get(sid, ())), tuple(self.shared.get(sid, ())),
                                  tuple(self.dropped.get(sid, ())),
                                  tuple(table[t // bs] * bs + t % bs for t in range(start, end)))

    def info(self, layers: list[int], rid: dict[int, str]) -> GroupInfo:
        return GroupInfo(self.kind, self.kind, layers, self.window, len(self.blocks), self.num_free,
                         {rid[k]: list(t) for k, t in self.tables.items() if k in rid})

    def _group(self) -> dict:
        """Events of another group than the full-attention one say which (the block map and the prefix tree are
        group 0's; the KV events carry group_idx)."""
        return {"group": self.group_idx} if self.group_idx else {}
