"""EngineCore: the KV pool and one scheduler step. A step admits new requests, schedules, encodes images,
runs the model, samples, advances each request and builds the snapshot; every stage runs under a guard,
so a fault fails exactly the requests it touched and the others carry on."""
import logging
from dataclasses import dataclass, field

import torch

from minivlm.block_manager import BlockManager
from minivlm.config import EngineConfig
from minivlm.events import EventLog
from minivlm.image_layout import runs
from minivlm.kv_pool import KVPool
from minivlm.loader import LoadedModel
from minivlm.output import OutputProcessor
from minivlm.prefix_keys import extend_keys
from minivlm.runner import ModelRunner
from minivlm.scheduler import Scheduler
from minivlm.sequence import Sequence
from minivlm.snapshot import KVSnapshot, SnapshotBuilder, StreamEvent
from minivlm.vision_cache import VisionCache
from minivlm.vision_worker import VisionWorker

log = logging.getLogger("minivlm")


class RequestFailed(RuntimeError):
    """A request's step raised; `stage` says where (admit, schedule, vision encode, model run, sampling,
    advance, snapshot). The engine freed its blocks and keeps serving everyone else."""

    def __init__(self, request_id: str, stage: str, cause: BaseException):
        super().__init__(f"request {request_id} failed during {stage}: {type(cause).__name__}: {cause}")
        self.request_id, self.stage = request_id, stage


@dataclass
class StepResult:
    """What one step produced for the callers: an event per advanced request, an error per failed one."""
    events: list[tuple[Sequence, StreamEvent]] = field(default_factory=list)
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)


class EngineCore:
    """Single-threaded: the caller (Engine) holds its lock around every call."""

    def __init__(self, config: EngineConfig, model: LoadedModel):
        self.config, self.model = config, model
        self.pool = KVPool(config, model)
        self.num_blocks = self.pool.num_blocks
        self.events = EventLog(config.event_log_size)
        self.block_manager = BlockManager(self.num_blocks, config.block_size, config.cache_strategy != "none", self.events)
        self.scheduler = Scheduler(self.block_manager, config, self.events)
        self.snapshots = SnapshotBuilder(self.block_manager)
        self.vision_cache = VisionCache(config.vision_cache_bytes)
        self.runner = ModelRunner(model, self.pool.kv_cache, config.block_size, self.vision_cache)
        # half the CPU threads for the tower's thread, the rest stay with the steps it overlaps
        self.vision_worker = VisionWorker(model.vision, max(1, torch.get_num_threads() // 2)) \
            if config.async_vision and model.vision is not None else None
        self.outputs = OutputProcessor(model.tokenizer, model.eos_ids, config.max_model_len)
        self.step_count = 0
        self.kv_publisher = None
        if config.kv_events is not None and config.kv_events.active:  # zmq is imported only when publishing
            from minivlm.kv_events.publisher import KVEventPublisher
            self.kv_publisher = KVEventPublisher(config.kv_events, config.block_size)
        self.after_step = None  # debug hook: called with the core after every step (tests check invariants)

    def step(self, new: list[Sequence]) -> StepResult:
        """One scheduler step: prefill a batch of waiting requests, or decode one token for every running one
        (chunked prefill: decodes and prefill chunks together, within the step's token budget)."""
        res = StepResult()
        aborted = [s for s in (*self.scheduler.running, *self.scheduler.waiting) if s.aborted]
        if not (new or aborted or self.scheduler.has_work()):
            return res
        if not (new or aborted) and self._only_encoding():
            VisionWorker.wait_any(self.scheduler.waiting, timeout=0.05)  # nothing to run until an image is encoded
            if self._only_encoding():
                return res  # not a step: nothing was decided
        self.step_count += 1
        self.events.step = self.step_count
        for seq in new:
            self._isolate("admit", [seq], lambda b: [self._admit(b[0])], res)
        for seq in aborted + [s for s in new if s.aborted and s.finish_reason is None]:
            res.events.append((seq, self.abort(seq)))
        if self.scheduler.has_work():
            self._run_step(res)
        if self.kv_publisher is not None:
            self.kv_publisher.after_step(self)  # this step's block events, one batch, queued for the sender
        if self.after_step is not None:
            self.after_step(self)
        return res

    def _only_encoding(self) -> bool:
        s = self.scheduler
        return not s.running and all(not seq.vision_ready for seq in s.waiting)

    def _run_step(self, res: StepResult):
        batch = self.scheduler.schedule()
        for seq, e in batch.failed:
            self.fail(seq, "schedule", e, res)
        jobs = {s.seq_id: s.vision_job for s in batch.seqs if s.vision_job is not None}
        seqs, _ = self._isolate("vision encode", batch.seqs, self.runner.encode_step_images, res)
        for seq in seqs:  # async_vision: its tower ran on the vision thread while earlier steps went on
            if seq.seq_id in jobs and seq.vision_job is None:
                todo, job = jobs[seq.seq_id]
                self.events.emit("vision_encoded", seq.request_id, num_images=len(todo),
                                 seconds=round(job.result()[1], 4), arrived_step=seq.arrived_step)
        if not seqs:
            return
        seqs, logits = self._isolate("model run", seqs, lambda b: list(self.runner.forward(b)), res)
        rows = {s.seq_id: row for s, row in zip(seqs, logits)}
        for s in seqs:
            if s.chunk_end < len(s):  # a prefill chunk: its K/V are written, no token to sample yet
                s.num_computed = s.chunk_end
        seqs = [s for s in seqs if s.chunk_end == len(s)]
        seqs, samples = self._isolate("sampling", seqs, lambda b: self.runner.sample_tokens(
            b, torch.stack([rows[s.seq_id] for s in b])), res) if seqs else ([], [])
        events = [(s, ev) for s, (token, lp) in zip(seqs, samples)
                  for ev in self._isolate("advance", [s], lambda b: [self._advance(b[0], token, lp)], res)[1]]
        self._attach_snapshot([(s, ev) for s, ev in events if s.wants_snapshot], res)
        res.events += [(s, ev) for s, ev in events if ev.finished or s.finish_reason is None]

    def _attach_snapshot(self, wants: list[tuple[Sequence, StreamEvent]], res: StepResult):
        """One snapshot per step, shared by every request that asked for one. If building it raises, the
        unfinished requests that asked fail; finished ones still get their final event (without a snapshot)."""
        if not wants:
            return
        try:
            snap = self.snapshot()
        except Exception as e:
            snap = None
            for seq, ev in wants:
                if not ev.finished:
                    self.fail(seq, "snapshot", e, res)
        for _, ev in wants:
            ev.snapshot = snap

    def _isolate(self, stage: str, seqs: list[Sequence], fn, res: StepResult) -> tuple[list[Sequence], list]:
        """fn(batch) -> one result per sequence. If the batch raises, each sequence runs alone, so only the
        ones that fault alone fail. Returns the sequences that went through and their results."""
        try:
            return seqs, fn(seqs)
        except Exception as e:
            if len(seqs) == 1:
                self.fail(seqs[0], stage, e, res)
                return [], []
        kept, results = [], []
        for seq in seqs:
            try:
                results += fn([seq])
                kept.append(seq)
            except Exception as e:
                self.fail(seq, stage, e, res)
        return kept, results

    def _admit(self, seq: Sequence):
        seq.arrived_step = self.step_count
        self.events.emit("arrived", seq.request_id, num_prompt_tokens=seq.num_prompt_tokens,
                         num_images=len(seq.images),  # runs of placeholders: a tiled image is one run per tile
                         image_spans=[(a, b - a) for a, b in runs(seq.token_types[:seq.num_prompt_tokens])])
        self.outputs.start(seq)
        if self.vision_worker is not None:
            self.runner.start_encoding(seq, self.vision_worker)
        self.scheduler.add(seq)

    def _advance(self, seq: Sequence, token: int, logprobs: dict | None) -> StreamEvent:
        """Record a sampled token: publish a block it completed, then the output path (text, stop, finish)."""
        bs = self.config.block_size
        seq.num_computed = len(seq)
        if seq.num_computed % bs == 0:  # the block just completed becomes reusable by later requests
            extend_keys(seq, bs, self.config.cache_strategy, self.model.model_id, self.model.dtype_name)
            self.block_manager.register(seq, seq.num_computed // bs - 1)
        ev, reason = self.outputs.advance(seq, token, logprobs)
        if reason:
            ev.output, ev.finished = self._finish(seq, reason).output, True
        return ev

    def abort(self, seq: Sequence) -> StreamEvent:
        """End a request now (admitted or not); its final event carries what it produced so far."""
        if seq.detokenizer is None:
            self.outputs.start(seq)
        return self._finish(seq, "abort")

    def _finish(self, seq: Sequence, reason: str) -> StreamEvent:
        self.events.emit("finished", seq.request_id, finish_reason=reason)
        self.scheduler.finish(seq)
        seq.finish_reason = reason
        out = self.outputs.output(seq, reason)
        return StreamEvent(seq.request_id, "", out.text, True, None, out)

    def fail(self, seq: Sequence, stage: str, error: BaseException, res: StepResult | None = None):
        """Take a faulted request out (its newest blocks were never written, so they are unpublished); the
        caller's error goes into res (the loop, when it fails a request itself, tells the caller directly)."""
        res = res if res is not None else StepResult()
        log.exception("request %s failed during %s", seq.request_id, stage, exc_info=error)
        seq.finish_reason = "error"
        self.events.emit("finished", seq.request_id, finish_reason="error", stage=stage, error=str(error))
        try:
            self.scheduler.finish(seq, computed=False)
        finally:
            res.failed.append((seq, RequestFailed(seq.request_id, stage, error)))
            self.scheduler.rewind_unwritten_hits()

    def snapshot(self) -> KVSnapshot:
        s = self.scheduler
        return self.snapshots.build(list(s.running), list(s.waiting), self.step_count, s.num_preemptions,
                                    last_event_seq=self.events.last_seq)

    def reset_prefix_cache(self):
        """Forget every cached-but-free block and every cached vision embedding."""
        self.block_manager.reset()
        self.vision_cache.clear()
        if self.kv_publisher is not None:
            self.kv_publisher.after_step(self)  # a reset between steps is its own batch

    def release(self):
        """Drop the KV pool now, not whenever the engine is collected."""
        self.pool.release()
        self.runner.kv_caches = None
        if self.kv_publisher is not None:
            self.kv_publisher.close()  # frees its endpoint for the engine that replaces this one
        if self.vision_worker is not None:
            self.vision_worker.close()
