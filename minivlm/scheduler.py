"""Continuous batching: admit waiting requests while blocks and budgets allow (prefill), otherwise advance
every running request by one token (decode), preempting the newest by recompute when blocks run out."""
from collections import deque
from typing import NamedTuple

from minivlm.block_manager import BlockManager
from minivlm.config import EngineConfig
from minivlm.events import EventLog
from minivlm.sequence import Sequence, Status


class Batch(NamedTuple):
    """One step's work: the sequences to run (each computes tokens [num_computed, chunk_end)), the step's kind
    (prefill, decode, or mixed: decodes and prefill chunks together), and those whose scheduling raised."""
    seqs: list[Sequence]
    kind: str
    failed: list[tuple[Sequence, Exception]]


class Scheduler:
    def __init__(self, block_manager: BlockManager, config: EngineConfig, events: EventLog | None = None):
        self.bm = block_manager
        self.events = events or EventLog(0)
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked = config.enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence):
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Batch:
        """Pick this step's work (below) and log it with each request's token count."""
        batch = self._pick()
        if batch.seqs:
            counts = {s.request_id: s.chunk_end - s.num_computed for s in batch.seqs}
            self.events.emit("scheduled", step_kind=batch.kind, request_ids=list(counts),
                             num_tokens=sum(counts.values()), num_scheduled_tokens=counts,
                             sampling=[s.request_id for s in batch.seqs if s.chunk_end == len(s)])  # chunks don't
        return batch

    def _pick(self) -> Batch:
        """Chunked: the running requests first (a decode token each, or their prefill's next chunk), then new
        ones, until the token budget is spent. Otherwise: prefill as many waiting requests as fit whole; if
        none, decode every running one. A request whose block bookkeeping raises is dropped (its blocks
        forgotten) and reported in Batch.failed; the rest go on."""
        if self.chunked:
            batch, failed = self._continue_running(self.max_num_batched_tokens)
            budget = self.max_num_batched_tokens - sum(s.chunk_end - s.num_computed for s in batch)
            batch += self._admit_waiting(budget, failed)
            kinds = {s.is_decoding for s in batch}
            return Batch(batch, "mixed" if len(kinds) > 1 else "decode" if True in kinds else "prefill", failed)
        failed = []
        batch = self._admit_waiting(self.max_num_batched_tokens, failed, whole=True)
        if batch or failed:
            return Batch(batch, "prefill", failed)
        batch, failed = self._continue_running(None)
        return Batch(batch, "decode", failed)

    def _admit_waiting(self, budget: int, failed: list, whole: bool = False) -> list[Sequence]:
        """Admit waiting requests in order while sequence slots, budget and blocks last; whole=True admits
        only prompts that fit the budget whole (always the first one, which the config guarantees fits)."""
        batch = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = next((s for s in self.waiting if s.vision_ready), None)  # async_vision: skip images in the tower
            if seq is None:
                break
            if whole and batch and len(seq) - seq.num_computed > budget:
                break
            try:
                if not self.bm.can_allocate(seq):
                    break
                self.bm.allocate(seq)  # the whole prompt's blocks: a prefill never waits for memory midway
                self._plan(seq, len(seq) - seq.num_computed if whole else budget)
            except Exception as e:
                self.waiting.remove(seq)
                failed.append((seq, self._drop(seq, e)))
                continue
            budget -= seq.chunk_end - seq.num_computed
            seq.status = Status.RUNNING
            self.waiting.remove(seq)
            self.running.append(seq)
            batch.append(seq)
        return batch

    def _continue_running(self, budget: int | None) -> tuple[list[Sequence], list]:
        """Every running request, oldest first, gets its next token or prefill chunk while the budget (None: no
        limit) lasts; a request that needs a block when none is free preempts the newest running one."""
        survivors, batch, failed = deque(), [], []
        while self.running:
            seq = self.running.popleft()
            if budget is not None and budget <= 0:
                survivors.append(seq)  # stays running; its turn comes next step
                continue
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
                    self._plan(seq, budget if budget is not None else len(seq) - seq.num_computed)
                    survivors.append(seq)
                    batch.append(seq)
                    if budget is not None:
                        budget -= seq.chunk_end - seq.num_computed
            except Exception as e:
                failed.append((seq, self._drop(seq, e)))
        self.running = survivors
        return batch, failed

    def _plan(self, seq: Sequence, max_tokens: int):
        """Schedule up to max_tokens of seq's uncomputed tokens for this step. The full blocks they complete
        are published now: their K/V are written in this step's forward, in every layer before any attention
        reads the cache, so a request that hits them in this same step reads written K/V."""
        bs = self.bm.block_size
        seq.chunk_end = min(len(seq), seq.num_computed + max_tokens)
        self.bm.dirty.update(seq.block_table[seq.num_computed // bs:-(-seq.chunk_end // bs)])  # fills change
        self.bm.publish(seq, seq.chunk_end)

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
