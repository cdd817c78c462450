"""Continuous batching: admit waiting requests while blocks and budgets allow (prefill), otherwise advance
every running request by one token (decode), preempting the newest by recompute when blocks run out."""
from collections import deque

from minivlm.block_manager import BlockManager
from minivlm.sequence import Sequence, Status


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int, on_preempt=None):
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0
        self.on_preempt = on_preempt or (lambda seq: None)

    def add(self, seq: Sequence):
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """Returns (sequences to run this step, is_prefill)."""
        batch, tokens = [], 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if batch and tokens + len(seq) > self.max_num_batched_tokens:
                break
            if not self.bm.can_allocate(seq):
                break
            self.bm.allocate(seq)
            tokens += len(seq) - seq.num_computed
            seq.status = Status.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
            batch.append(seq)
        if batch:
            return batch, True
        survivors = deque()
        while self.running:
            seq = self.running.popleft()
            while not self.bm.can_append(seq):
                if self.running:
                    self.preempt(self.running.pop())  # newest first: it has the least work to redo
                else:
                    self.preempt(seq)
                    break
            else:
                self.bm.append_slot(seq)
                survivors.append(seq)
        self.running = survivors
        return list(survivors), False

    def preempt(self, seq: Sequence):
        """Free seq's blocks and queue it first in line; its tokens so far are recomputed on re-admission."""
        self.bm.deallocate(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        self.on_preempt(seq)

    def finish(self, seq: Sequence):
        """Remove a finished or aborted request and release its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.block_table:
            self.bm.deallocate(seq)
        seq.status = Status.FINISHED
