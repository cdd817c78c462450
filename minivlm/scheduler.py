"""Continuous batching: admit waiting requests while blocks and budgets allow (prefill), otherwise advance
every running request by one token (decode), preempting the newest by recompute when blocks run out."""
from collections import deque
from typing import NamedTuple

from minivlm.block_manager import BlockManager
from minivlm.config import EngineConfig
from minivlm.events import EventLog
from minivlm.sequence import Sequence, Status


class Batch(NamedTuple):
    """One step's work: the sequences to run, prefill or decode, and those whose scheduling raised."""
    seqs: list[Sequence]
    is_prefill: bool
    failed: list[tuple[Sequence, Exception]]


class Scheduler:
    def __init__(self, block_manager: BlockManager, config: EngineConfig, events: EventLog | None = None):
        self.bm = block_manager
        self.events = events or EventLog(0)
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence):
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Batch:
        """Prefill as many waiting requests as fit; if none, decode every running one. A request whose block
        bookkeeping raises is dropped (its blocks forgotten) and reported in Batch.failed; the rest go on."""
        batch, failed, tokens = [], [], 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if batch and tokens + len(seq) > self.max_num_batched_tokens:
                break
            try:
                if not self.bm.can_allocate(seq):
                    break
                self.bm.allocate(seq)
            except Exception as e:
                self.waiting.popleft()
                failed.append((seq, self._drop(seq, e)))
                continue
            tokens += len(seq) - seq.num_computed
            seq.status = Status.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
            batch.append(seq)
        if batch or failed:
            return Batch(batch, True, failed)
        survivors = deque()
        while self.running:
            seq = self.running.popleft()
            try:
                while not self.bm.can_append(seq):
                    need = f"{seq.request_id} needs a block for its next token; none is free; "
                    if not self.running:
                        self.preempt(seq, need + f"no other request is running, so {seq.request_id} itself")
                        break
                    victim = self.running.pop()  # newest first: it has the least work to redo
                    self.preempt(victim, need + f"preempting the newest running request, {victim.request_id}")
                else:
                    self.bm.append_slot(seq)
                    survivors.append(seq)
            except Exception as e:
                failed.append((seq, self._drop(seq, e)))
        self.running = survivors
        return Batch(list(survivors), False, failed)

    def _drop(self, seq: Sequence, error: Exception) -> Exception:
        """Take a request whose scheduling raised out of the engine: its blocks were never computed."""
        self.bm.forget(seq)
        seq.status = Status.FINISHED
        return error

    def preempt(self, seq: Sequence, why: str = "preempted"):
        """Free seq's blocks and queue it first in line; its tokens so far are recomputed on re-admission."""
        blocks = list(seq.block_table)
        freeing = sum(self.bm.blocks[b].ref_count == 1 for b in blocks)
        self.events.emit("preempted", seq.request_id, block_ids=blocks,
                         reason=f"{why}, releasing its {len(blocks)} blocks ({freeing} become free); "
                                f"its {len(seq)} tokens will be recomputed")
        self.bm.deallocate(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def rewind_unwritten_hits(self):
        """A request that hit a block published earlier in this step, by a request that then failed before
        writing its K/V (so the block was unpublished), computes that block itself."""
        bs = self.bm.block_size
        for seq in self.running:
            for i, b in enumerate(seq.block_table[:seq.num_computed // bs]):
                if self.bm.caching and i < len(seq.block_keys) and self.bm.blocks[b].key != seq.block_keys[i]:
                    seq.num_computed = i * bs
                    break

    def finish(self, seq: Sequence, computed: bool = True):
        """Remove a finished, aborted or failed request and release its blocks (computed=False: its newest
        blocks never got their K/V, so they are unpublished too)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.block_table:
            (self.bm.deallocate if computed else self.bm.forget)(seq)
        seq.status = Status.FINISHED
