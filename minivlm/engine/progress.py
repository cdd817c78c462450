"""EngineCore's second half: what a step's outcome does to its requests. `update` is the only writer of request
progress (tokens computed, cache hits, each sampled token down the output path); a request leaves in one of three
ways, each releasing what it held in the scheduler, the KV cache, the encoder cache and the runner: it finishes
(`_finish`), is aborted (`abort`), or fails (`fail`). The first half, the step's pipeline, is core.py."""
import logging

from minivlm.engine.kv_cache.prefix_keys import extend_keys
from minivlm.engine.outputs import StreamEvent
from minivlm.engine.sampling.structured_output import constrained_events
from minivlm.engine.scheduling.plan import RunnerOutput, StepPlan
from minivlm.engine.sequence import Sequence, writing
from minivlm.engine.step_result import RequestFailed, StepResult

log = logging.getLogger("minivlm")


class RequestProgress:
    """Mixed into EngineCore (core.py), whose parts it uses: the registry, the scheduler, the block manager, the
    runner, the output processor, the event log."""

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
        self.scheduler.encoder_outputs_lost(out.lost)
        for seq_id, took in out.encoded.items():
            if took is not None and (seq := self.live.get(seq_id)) is not None:  # async_vision: ran beside the steps
                self.events.emit("vision_encoded", seq.request_id, num_images=took["num_images"],
                                 seconds=round(took["seconds"], 4), arrived_step=seq.arrived_step,
                                 slices=took["slices"])

    def _release_inputs(self, seq: Sequence):
        """seq left the engine: what the runner kept of it goes (its encoder-output references went with the
        scheduler's release)."""
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
        self._release_inputs(seq)  # encoder-output references, pixels, vision thread's job (issue #39 item 4)
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
        self._release_inputs(seq)  # encoder-output references, pixels, vision thread's job (issue #39 item 4)
        try:  # in a step before its update, only the tokens before its planned start have K/V
            self.scheduler.release(seq, computed=False, written=self._written.pop(seq.seq_id, None))
        finally:
            res.failed.append((seq, RequestFailed(seq.request_id, stage, error)))
