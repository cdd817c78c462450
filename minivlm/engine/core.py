"""EngineCore: the KV pool and one step's pipeline. A step admits new requests, has the scheduler write its plan,
has the runner execute it (images, model, sampling), applies the result in one `update` (the only writer of
request progress: progress.py) and builds the snapshot; every stage runs under a guard, so a fault fails exactly the requests
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
from minivlm.engine.execution.runner import ModelRunner
from minivlm.engine.scheduling.scheduler import Scheduler
from minivlm.engine.progress import RequestProgress
from minivlm.engine.sequence import Sequence
from minivlm.engine.step_result import StepResult, isolate
from minivlm.engine.kv_cache.snapshot import SnapshotBuilder, video_spans
from minivlm.engine.spec_decode.ngram import SpecRecorder
from minivlm.engine.encoder.vision_worker import VisionWorker

log = logging.getLogger("minivlm")


class EngineCore(RequestProgress):
    """Single-threaded: the caller (Engine) holds its lock around every call. Its second half, what a step's outcome
    does to its requests (update, finish, abort, fail), is progress.py's."""

    def __init__(self, config: EngineConfig, model: LoadedModel):
        self.config, self.model = config, model
        self.pool = KVPool(config, model)
        self.num_blocks = self.pool.num_blocks
        self.events = EventLog(config.event_log_size)
        caching = config.cache_strategy != "none"
        self.block_manager = coordinator.build(self.pool, config.block_size, caching, self.events)  # every group
        if getattr(model.decoder, "spans_past_window", False):  # Gemma 4 12B: no hit may end inside such an image
            self.block_manager.sliding.spans_reach_back = True
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
        if self.scheduler.speculator is not None:  # the MTP head's guesses go from the runner to the scheduler
            self.scheduler.speculator.proposer = self.runner.proposer
        self.masks = MaskFiller(default_mode(self.runner.device.type), model.eos_ids)  # structured outputs' masks
        self.busy = BusyThreads() if model.device.type == "cpu" else None  # fewer threads while others hold cores
        # a token's text, for the step-through's line on every constrained step (decoding it each time cost more)
        self._token_text = functools.lru_cache(maxsize=4096)(lambda token: model.tokenizer.decode([token]))
        # Sequence -> its pixels (ImageInputs), left by intake on a caller's thread; handed to the runner on admission
        self.image_inputs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._step_time: tuple[int, float] = (0, 0.0)  # the latest step: (decode tokens, seconds), for tower_slice
        self.outputs = OutputProcessor(model.tokenizer, model.eos_ids, config.max_model_len)
        self.speculation = SpecRecorder(self.events, getattr(config.speculative_config, "method", "ngram"))  # speculative decoding's counters and events
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
        return self.scheduler.encoder_cache_stats()

    def backend_info(self) -> dict:
        """The backend in words: its attention and decode paths, and the CPU step's timed choice (or "")."""
        return self.runner.backend_info()

    def memory_report(self):
        """What is allocated now: weights, the KV pool (engine/kv_cache/kv_pool.py), the device's peak."""
        return self.pool.memory_report()

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
        spec = self.scheduler.speculator  # a speculating request's masks fill ahead along its next guesses
        self.masks.ahead([*out.sampled, *out.spec], self.live, spec.upcoming if spec else None)  # as this step ends
        self._written = {}
        self._attach_snapshot([(s, ev) for s, ev in events if s.wants_snapshot], res)
        res.events += [(s, ev) for s, ev in events if ev.finished or self.requests.is_alive(s.seq_id)]
        self._step_time = (sum(r.kind == "decode" for r in plan), self.clock() - start)

    def _execute(self, plan: StepPlan, res: StepResult) -> tuple[RunnerOutput, dict[int, int]]:
        """The runner's two phases; after each, the requests its output says failed are failed here (each once), and
        between them the requests whose forward read K/V never written (a block they hit lost its publisher in this
        step: only a failure unpublishes) are found (seq_id -> first such token), to sample nothing."""
        live, unwritten = self.live, {}  # live: the registry's own seq_id -> request (lifecycle.py)
        masks = self.masks.start((s for r in plan if r.sample and (s := live.get(r.seq_id)) is not None),
                                 {r.seq_id: r.draft for r in plan if r.draft}) if plan.requests else None

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
        return self.scheduler.time_left_after(*self._step_time)

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
                         video_spans=video_spans(seq), submitted=seq.submitted_at)
        self.outputs.start(seq)
        inputs = self.image_inputs.pop(seq, None)
        if inputs is not None:  # its pixels: the runner keeps them until its images are taken
            self.runner.add_inputs(seq.seq_id, inputs)
        self.requests.add(seq)  # WAITING: from here on only update writes its progress

    def snapshot(self) -> KVSnapshot:
        s = self.scheduler
        return self.snapshots.build(list(s.running), list(s.waiting), self.step_count, s.num_preemptions,
                                    last_event_seq=self.events.last_seq)

    def reset_prefix_cache(self):
        """Forget every cached-but-free block and every cached encoder output (the next plan frees them)."""
        self.scheduler.reset_caches()
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
