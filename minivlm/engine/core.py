"""EngineCore: the KV pool and one step's pipeline. A step admits new requests, has the scheduler write its plan,
has the runner execute it (images, model, sampling), applies the result in one `update` (the only writer of
request progress) and builds the snapshot; every stage runs under a guard, so a fault fails exactly the requests
it touched and the others carry on."""
import functools
import logging
import time
import weakref

from minivlm.engine.execution.busy_threads import BusyThreads
from minivlm.engine.encoder.encoder_cache import encoder_cache_size
from minivlm.config import EngineConfig
from minivlm.engine.event_log import EventLog
from minivlm.inputs.image_layout import runs
from minivlm.engine.kv_cache import coordinator
from minivlm.engine.kv_cache.kv_pool import KVPool
from minivlm.engine.lifecycle import RequestRegistry
from minivlm.loader import LoadedModel
from minivlm.engine.sampling.output_processor import OutputProcessor
from minivlm.engine.outputs import KVSnapshot, StreamEvent
from minivlm.engine.execution.execute import execute_model, sample_tokens
from minivlm.engine.sampling.grammar_masks import MaskFiller, default_mode
from minivlm.engine.scheduling.plan import RunnerOutput, StepPlan
from minivlm.engine.kv_cache.prefix_keys import extend_keys
from minivlm.engine.execution.runner import ModelRunner
from minivlm.engine.scheduling.scheduler import Scheduler
from minivlm.engine.sequence import Sequence, writing
from minivlm.engine.step_result import RequestFailed, StepResult, isolate
from minivlm.engine.kv_cache.snapshot import SnapshotBuilder, video_spans
from minivlm.engine.spec_decode.ngram import SpecRecorder
from minivlm.engine.sampling.structured_output import constrained_events
from minivlm.engine.encoder.vision_worker import VisionWorker

log = logging.getLogger("minivlm")


class EngineCore:
    """Single-threaded: the caller (Engine) holds its lock around every call."""

    def __init__(self, config: EngineConfig, model: LoadedModel):
        self.config, self.model = config, model
        self.pool = KVPool(config, model)
        self.num_blocks = self.pool.num_blocks
        self.events = EventLog(config.event_log_size)
        caching = config.cache_strategy != "none"
        self.block_manager = coordinator.build(self.pool, config.block_size, caching, self.events)  # every group
        self.requests = RequestRegistry()  # every admitted, unfinished request; its status moves only there
        self.snapshots = SnapshotBuilder(self.block_manager, model.text_config.num_hidden_layers)
        # with the adaptive budget the tower runs in the time each step leaves of its allowance; else beside the steps
        self.vision_worker = VisionWorker(model.vision, sliced=config.max_step_slowdown is not None) \
            if config.async_vision and model.vision is not None else None
        self.runner = ModelRunner(model, self.pool.layer_caches, config, self.vision_worker)  # picks the backend, once
        self.scheduler = Scheduler(  # chunks keep mixed steps within the backend's one fast call (fast_rows)
            self.block_manager, config, self.events, self.requests,
            whole_spans=bool(getattr(model.decoder, "bidirectional_images", False)),
            encoder_cache_size=encoder_cache_size(config, model),  # in embeddings (engine/encoder/encoder_cache.py)
            fast_rows=self.runner.limits.fast_rows)
        self.masks = MaskFiller(default_mode(self.runner.device.type))  # structured outputs' masks
        self.busy = BusyThreads() if model.device.type == "cpu" else None  # fewer threads while others hold cores
        # a token's text, for the step-through's line on every constrained step (decoding it each time cost more)
        self._token_text = functools.lru_cache(maxsize=4096)(lambda token: model.tokenizer.decode([token]))
        # Sequence -> its pixels (ImageInputs), left by intake on a caller's thread; handed to the runner on admission
        self.image_inputs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._step_time: tuple[int, float] = (0, 0.0)  # the latest step: (decode tokens, seconds), for tower_slice
        self.outputs = OutputProcessor(model.tokenizer, model.eos_ids, config.max_model_len)
        self.speculation = SpecRecorder(self.events)  # speculative decoding's counters and events
        self.step_count = 0
        self.last_plan: StepPlan | None = None   # the plan of the latest step that ran something
        self._written: dict[int, int] = {}       # this step, before its update: seq_id -> tokens whose K/V exist
        self._step_seqs: dict[int, Sequence] = {}  # this step: every request it may touch, failed ones included
        self.kv_publisher = None
        if config.kv_events is not None and config.kv_events.active:  # zmq is imported only when publishing
            from minivlm.kv_events.publisher import KVEventPublisher
            self.kv_publisher = KVEventPublisher(config.kv_events, config.block_size)
            self.kv_publisher.groups = coordinator.wire_groups(self.block_manager)
        self.after_step = None  # debug hook: called with the core after every step (tests check invariants)
        self.clock = time.perf_counter  # what step times are measured with (a test may give a clock of its own)

    live = property(lambda self: self.requests.requests)  # seq_id -> every admitted, unfinished request
    clock = property(lambda self: self.events.clock, lambda self, c: setattr(self.events, "clock", c))  # stamps events

    # ---- what the engine's facade asks (docs/API.md): answered here, never by reaching into the parts ----------
    def has_work(self) -> bool:  # a request waits or runs
        return self.requests.has_work()

    def encoder_cache_stats(self) -> dict[str, int]:
        return self.scheduler.encoder.stats()

    def backend_info(self) -> dict:
        """The backend in words: its attention and decode paths, and the CPU step's timed choice (or "")."""
        return {**self.runner.backend.describe(), "calibration": self.runner.backend.calibration}

    def step(self, new: list[Sequence], aborts: set[int] = frozenset()) -> StepResult:
        """One scheduler step: prefill a batch of waiting requests, or decode one token for every running one
        (chunked prefill: decodes and prefill chunks together, within the step's token budget). aborts: seq_ids the
        callers cancelled since the last step (new ones among them are admitted, then aborted)."""
        res = StepResult()
        aborted = [self.live[i] for i in aborts if i in self.live]
        if not (new or aborted or self.has_work()):
            return res
        self._step_time = (0, 0.0)
        if not (new or aborted) and self._only_encoding():
            if not self.vision_worker.sliced:  # sliced: the loop lends the tower its time right after this
                self.runner.wait_for_tower(timeout=0.05)  # nothing to run until an image is encoded
            if self._only_encoding():
                return res  # not a step: nothing was decided
        self.step_count += 1
        self.events.step = self.step_count
        for seq in new:
            self._isolate("admit", [seq], lambda b: [self._admit(b[0])], res)
        for seq in aborted + [s for s in new if s.seq_id in aborts and self.requests.is_alive(s.seq_id)]:
            res.events.append((seq, self.abort(seq)))
        if self.has_work():
            self._run_step(res)
        self.events.end_step()  # when this step ended: its tokens' time (minivlm/views/timeline.py)
        if self.kv_publisher is not None:
            self.kv_publisher.after_step(self)  # this step's block events, one batch, queued for the sender
        if self.after_step is not None:
            self.after_step(self)
        if self.busy is not None:
            self.busy.after_step()
        return res

    def _only_encoding(self) -> bool:
        """Nothing to run but requests whose images are on the vision thread (async_vision)."""
        s, in_tower = self.scheduler, self.runner.in_tower()
        return not s.running and all(seq.seq_id in in_tower for seq in s.waiting)

    def _run_step(self, res: StepResult):
        """The pipeline: plan, execute (images, model, sampling), update, snapshot."""
        self._step_seqs = dict(self.live)
        plan, dropped = self.scheduler.schedule(self.step_count, self.runner.in_tower())
        self._written = {r.seq_id: r.start for r in plan}
        for seq, e in dropped:
            self.fail(seq, "schedule", e, res)
        if plan.requests:
            self.last_plan = plan
        start = self.clock()
        out, unwritten = self._execute(plan, res)  # images, model, sampling (engine/execution/execute.py)
        if not any(j.todo for j in plan.encodes) and len(out.ran) == len(plan):  # whole, no tower: a clean measurement
            self.scheduler.observe(plan, self.clock() - start)
        events = self.update(plan, out, res, unwritten)
        self.masks.ahead(out.sampled, self.live)  # the next step's masks fill while this step ends
        self._written = {}
        self._attach_snapshot([(s, ev) for s, ev in events if s.wants_snapshot], res)
        res.events += [(s, ev) for s, ev in events if ev.finished or self.requests.is_alive(s.seq_id)]
        self._step_time = (sum(r.kind == "decode" for r in plan), self.clock() - start)

    def _execute(self, plan: StepPlan, res: StepResult) -> tuple[RunnerOutput, dict[int, int]]:
        """The runner's two phases; after each, the requests its output says failed are failed here (each once), and
        between them the requests whose forward read K/V never written (a block they hit lost its publisher in this
        step: only a failure unpublishes) are found (seq_id -> first such token), to sample nothing."""
        live, unwritten = self.live, {}  # live: the registry's own seq_id -> request (lifecycle.py)
        masks = self.masks.start(s for r in plan if r.sample and (s := live.get(r.seq_id)) is not None) \
            if plan.requests else None

        def fail_all():
            for i, stage, e in out.failed:
                if self.requests.is_alive(i):
                    self.fail(self._step_seqs[i], stage, e, res)

        try:  # the masks fill beside the forward, or are left for sampling
            out = execute_model(self.runner, plan, live)
            fail_all()
            if res.failed:
                unwritten = self.scheduler.unwritten([r for r in plan if r.seq_id in out.ran], live)
            sample_tokens(self.runner, out, set(unwritten) | out.dead, masks)
            fail_all()
        finally:
            if masks is not None:
                masks.wait()  # a step never ends with a fill running: update advances these matchers
        return out, unwritten

    def tower_slice(self) -> float:
        """Seconds the sliced vision tower may run after the latest step (0: none, or no job waiting for it)."""
        worker = self.vision_worker
        if worker is None or not worker.sliced or not worker.slices.pending():
            return 0.0
        return self.scheduler.adaptive.left_after(*self._step_time)

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

    def _isolate(self, stage: str, seqs: list, fn, res: StepResult) -> tuple[list, list]:
        """fn over the batch; if it raises, item by item, so only the requests that fault alone fail."""
        return isolate(seqs, fn, lambda seq, e: self.fail(seq, stage, e, res))

    def _admit(self, seq: Sequence):
        seq.arrived_step = self.step_count
        self.events.emit("arrived", seq.request_id, num_prompt_tokens=seq.num_prompt_tokens,
                         num_images=len(seq.images),  # runs of placeholders: a tiled image is one run per tile
                         image_spans=[(a, b - a) for a, b in runs(seq.token_types[:seq.num_prompt_tokens])],
                         video_spans=video_spans(seq))
        self.outputs.start(seq)
        inputs = self.image_inputs.pop(seq, None)
        if inputs is not None:  # its pixels: the runner keeps them until its images are taken
            self.runner.add_inputs(seq.seq_id, inputs)
        self.requests.add(seq)  # WAITING: from here on only update writes its progress

    def update(self, plan: StepPlan, out: RunnerOutput, res: StepResult,
               unwritten: dict[int, int]) -> list[tuple[Sequence, StreamEvent]]:
        """The only writer of request progress. Preempted requests restart from token 0; every request whose forward
        ran has its tokens [start, end) computed (and, the first time, its cache hits), unless it read K/V never
        written: then it is rewound to the first such token, its blocks from there unpublished, and the next plan
        computes them again. Each sampled token is appended, completes and publishes a block when it fills one, and
        goes down the output path (text, stop, finish)."""
        bs = self.config.block_size
        self._images_taken(plan, out)
        with writing():
            for p in plan.preemptions:
                if p.seq_id in self.live:
                    self.live[p.seq_id].num_computed = 0  # recomputed from the start on re-admission
            for r in plan:
                seq = self.live.get(r.seq_id)
                if seq is None or r.seq_id not in out.ran:
                    continue
                if r.admitted and seq.num_output_tokens == 0:  # a re-admission is not a new prompt lookup
                    seq.cache_hits, seq.num_cached_tokens = list(r.hits), len(r.hits) * bs
                seq.num_computed = unwritten.get(r.seq_id, r.end)
                if r.seq_id in unwritten:  # what it computed rests on K/V nobody wrote: not to be reused
                    if not self.block_manager.rewinds:
                        seq.num_computed = 0  # a recurrent state cannot be rewound: recomputed from a zero state
                    self.block_manager.unpublish(seq, seq.num_computed)
                self.block_manager.ran(seq)  # a state it saved becomes a checkpoint
                self._written.pop(r.seq_id, None)
            if out.masks is not None:  # the step-through's line for each grammar-constrained request
                constrained_events(self.events, out.masks, out.sampled, self.live, self._token_text)
            return [(seq, ev) for r in plan if (r.seq_id in out.sampled or r.seq_id in out.spec)
                    and (seq := self.live.get(r.seq_id))
                    for ev in self._isolate("advance", [seq], lambda b: self._emit(b[0], r, out), res)[1]]

    def _emit(self, seq: Sequence, r, out: RunnerOutput) -> list[StreamEvent]:
        """The token its step sampled, or (speculating) its accepted guesses and the token after them."""
        if r.seq_id in out.sampled:
            return [self._advance(seq, *out.sampled[r.seq_id])]
        return self.speculation.emit(seq, r, out.spec[r.seq_id], self._advance, self.block_manager)

    def _images_taken(self, plan: StepPlan, out: RunnerOutput):
        """The encoder cache's book after the encode stage: outputs the plan encoded that the runner does not hold
        are forgotten; a request whose images the vision thread encoded says so in the log."""
        self.scheduler.encoder.lost(out.lost)
        for seq_id, took in out.encoded.items():
            if took is not None and (seq := self.live.get(seq_id)) is not None:  # async_vision: ran beside the steps
                self.events.emit("vision_encoded", seq.request_id, num_images=took["num_images"],
                                 seconds=round(took["seconds"], 4), arrived_step=seq.arrived_step,
                                 slices=took["slices"])

    def _release_images(self, seq: Sequence):
        """seq left the engine: its references to encoder outputs go (what no one uses stays cached, as long as it
        fits), and so do its pixels and its vision thread's job in the runner."""
        self.scheduler.encoder.release(seq.seq_id)
        self.runner.remove_request(seq.seq_id)  # its pixels, its vision thread's job and its sampling state
        self.image_inputs.pop(seq, None)  # never admitted (aborted by a close before its first step)

    def _advance(self, seq: Sequence, token: int, logprobs: dict | None) -> StreamEvent:
        """Record a sampled token: publish the block its computed tokens completed, then the output path."""
        bs = self.config.block_size
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
        self.scheduler.release(seq)
        self._release_images(seq)  # encoder-output references, pixels, vision thread's job (issue #39 item 4)
        self.requests.finish(seq, reason)
        out = self.outputs.output(seq, reason)
        return StreamEvent(seq.request_id, "", out.text, True, None, out, index=seq.choice_index)

    def fail(self, seq: Sequence, stage: str, error: BaseException, res: StepResult | None = None):
        """Take a faulted request out (its newest blocks were never written, so they are unpublished); the
        caller's error goes into res (the loop, when it fails a request itself, tells the caller directly)."""
        res = res if res is not None else StepResult()
        log.exception("request %s failed during %s", seq.request_id, stage, exc_info=error)
        self.events.emit("finished", seq.request_id, finish_reason="error", stage=stage, error=str(error))
        self.requests.finish(seq, "error")
        self._release_images(seq)  # encoder-output references, pixels, vision thread's job (issue #39 item 4)
        try:  # in a step before its update, only the tokens before its planned start have K/V
            self.scheduler.release(seq, computed=False, written=self._written.pop(seq.seq_id, None))
        finally:
            res.failed.append((seq, RequestFailed(seq.request_id, stage, error)))

    def snapshot(self) -> KVSnapshot:
        s = self.scheduler
        return self.snapshots.build(list(s.running), list(s.waiting), self.step_count, s.num_preemptions,
                                    last_event_seq=self.events.last_seq)

    def reset_prefix_cache(self):
        """Forget every cached-but-free block and every cached encoder output (the next plan frees them)."""
        self.block_manager.reset()
        self.scheduler.encoder.reset()
        if self.kv_publisher is not None:
            self.kv_publisher.after_step(self)  # a reset between steps is its own batch

    def release(self):
        """Drop the KV pool now, not whenever the engine is collected."""
        self.pool.release()
        self.runner.release()
        self.masks.close()
        if self.busy is not None:
            self.busy.close()
        if self.kv_publisher is not None:
            self.kv_publisher.close()  # frees its endpoint for the engine that replaces this one
        if self.vision_worker is not None:
            self.vision_worker.close()
