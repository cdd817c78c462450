"""Engine: the public face. Callers on any thread submit requests; one loop thread steps the scheduler, so
every caller's requests share one running batch (continuous batching), and each caller gets its own events."""
import dataclasses
import itertools
import logging
import queue
import threading
import time

import torch

from minivlm.anatomy import build_anatomy
from minivlm.config import EngineConfig
from minivlm.multimodal import build_prompt
from minivlm.model.rope import mrope_positions
from minivlm.prefix_keys import extend_keys
from minivlm.prefix_tree import prefix_forest
from minivlm.request import Request, SamplingParams
from minivlm.sequence import Sequence
from minivlm.snapshot import StreamEvent
from minivlm.engine_core import EngineCore

log = logging.getLogger("minivlm")


class Engine(EngineCore):
    """A paged-KV Qwen-VL engine. See API.md for the contract."""

    def __init__(self, config: EngineConfig | None = None, share_model_with: "Engine | None" = None, **overrides):
        super().__init__(config or EngineConfig(**overrides), share_model_with)
        self._lock = threading.RLock()              # engine state: held by a whole step
        self._inbox_lock = threading.Lock()         # new requests: held briefly, so callers never wait for a step
        self._wake = threading.Condition(self._inbox_lock)
        self._inbox: list[Sequence] = []
        self._live: dict[str, Sequence] = {}
        self._sinks: dict[str, queue.Queue] = {}
        self._want_snapshot: set[str] = set()
        self._seed_counter = itertools.count()
        self._loop = None
        self._closed = False
        self.step_count = 0

    def isolated(self, **overrides) -> "Engine":
        """A new engine on this one's loaded weights and processor with its own KV pool, prefix cache and loop
        (e.g. isolated(cache_strategy="A", num_blocks=64)); nothing is shared with this engine's cache."""
        fixed = {"model", "device", "dtype"} & set(overrides)
        if fixed:
            raise ValueError(f"an isolated engine shares the loaded model; it cannot change {sorted(fixed)}")
        return Engine(dataclasses.replace(self.config, **overrides), share_model_with=self)

    def close(self):
        """Stop the loop thread (pending requests are aborted); the engine cannot be used afterwards."""
        with self._inbox_lock:
            self._closed = True
            self._wake.notify_all()
        with self._lock:
            self._admit()
            for seq in list(self._live.values()):
                self._finish(seq, "abort")
            self.kv_cache = self.runner.kv_caches = None  # the pool goes now, not whenever the engine is collected
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- submitting -------------------------------------------------------------------------------------
    def make_sequence(self, request: Request, params: SamplingParams) -> Sequence:
        """Validate and render a request (on the caller's thread): processor, positions, length checks."""
        if not isinstance(request, Request):
            raise ValueError(f"expected a minivlm.Request, got {type(request).__name__}")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"expected minivlm.SamplingParams, got {type(params).__name__}")
        prompt = build_prompt(self.processor, request.to_messages(), request.mm_processor_kwargs,
                              self.config.max_images_per_request)
        n = len(prompt.token_ids)
        if n >= self.config.max_model_len:
            raise ValueError(f"prompt is {n} tokens; max_model_len is {self.config.max_model_len} (prompt + output)")
        longest = min(n + params.max_tokens, self.config.max_model_len)
        if self.block_manager.blocks_needed(longest) > self.num_blocks:
            raise ValueError(f"request needs up to {self.block_manager.blocks_needed(longest)} KV blocks but the "
                             f"engine has {self.num_blocks}; lower max_tokens or raise num_blocks")
        positions, delta = mrope_positions(prompt.token_types, [im.grid_thw for im in prompt.images], self.merge)
        generator = None
        if params.temperature > 0:
            seed = params.seed if params.seed is not None else self.config.seed * 1_000_003 + next(self._seed_counter)
            generator = torch.Generator().manual_seed(seed)
        seq = Sequence(request, prompt, params, positions, delta, generator)
        extend_keys(seq, self.config.block_size, self.config.cache_strategy, self.model_id, self.dtype_name)
        return seq

    def _make_sequences(self, requests: list, params) -> list[Sequence]:
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(requests)
        if len(plist) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(plist)} SamplingParams")
        return [self.make_sequence(r, p) for r, p in zip(requests, plist)]  # all validated before any is queued

    def _events(self, seqs: list[Sequence], snapshots: bool):
        """Queue seqs together and yield their events from one queue (one waiting thread, however many requests);
        closing the generator aborts whatever has not finished."""
        sink, pending = queue.Queue(), set()
        with self._inbox_lock:
            if self._closed:
                raise RuntimeError("this engine is closed")
            for seq in seqs:
                base, k = seq.request_id, 1
                while seq.request_id in self._live:  # the same Request submitted twice at once
                    seq.request_id, k = f"{base}#{k}", k + 1
                self._live[seq.request_id] = seq
                self._sinks[seq.request_id] = sink
                if snapshots:
                    self._want_snapshot.add(seq.request_id)
                self._inbox.append(seq)  # the loop moves it into the scheduler at its next step
                pending.add(seq.request_id)
            self._ensure_loop()
            self._wake.notify_all()
        try:
            while pending:
                ev = sink.get()
                if isinstance(ev, BaseException):
                    raise ev
                if ev.finished:
                    pending.discard(ev.request_id)
                yield ev
        finally:
            for request_id in pending:
                self.abort(request_id)

    def generate(self, requests, params: SamplingParams | list[SamplingParams] | None = None):
        """Run requests to completion, batched together; returns one Output per request (or one for one)."""
        single = isinstance(requests, Request)
        seqs = self._make_sequences([requests] if single else list(requests), params)
        outputs = {ev.request_id: ev.output for ev in self._events(seqs, snapshots=False) if ev.finished}
        return outputs[seqs[0].request_id] if single else [outputs[s.request_id] for s in seqs]

    def stream(self, request: Request, params: SamplingParams | None = None, snapshots: bool = True):
        """Yield a StreamEvent per scheduler step that advanced this request; closing the generator aborts it."""
        yield from self._events([self.make_sequence(request, params or SamplingParams())], snapshots)

    def stream_many(self, requests: list[Request], params: SamplingParams | list[SamplingParams] | None = None,
                    snapshots: bool = True):
        """Submit requests at once (all validated first) and yield every event of all of them as steps produce
        them; closing the generator aborts whatever still runs."""
        yield from self._events(self._make_sequences(list(requests), params), snapshots)

    def anatomy(self, request: Request):
        """How `request` becomes tokens, M-RoPE positions, blocks and A/B/C keys (no model run; minivlm.anatomy)."""
        return build_anatomy(self, request)

    def prefix_tree(self):
        """The prefix cache now as a forest of chained keys (list[TreeNode], minivlm.prefix_tree)."""
        with self._lock:
            return prefix_forest(self.block_manager)

    def abort(self, request_id: str):
        """Cancel a request; its blocks are freed at the next step."""
        with self._inbox_lock:
            seq = self._live.get(request_id)
            if seq is not None:
                seq.aborted = True  # read by the loop at its next step
                self._wake.notify_all()

    # ---- the loop ---------------------------------------------------------------------------------------
    def _ensure_loop(self):
        if self._loop is None or not self._loop.is_alive():
            self._loop = threading.Thread(target=self._run_loop, name="minivlm-engine", daemon=True)
            self._loop.start()

    def _run_loop(self):
        while True:
            with self._inbox_lock:
                while not self._inbox and not self.scheduler.has_work() and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            self.step()
            time.sleep(0)  # let a snapshot() caller waiting for the engine lock in between steps

    def _admit(self):
        """Move submitted requests into the scheduler (under the engine lock)."""
        with self._inbox_lock:
            new, self._inbox = self._inbox, []
        for seq in new:
            self.scheduler.add(seq)

    def has_unfinished(self) -> bool:
        with self._lock, self._inbox_lock:
            return self.scheduler.has_work() or bool(self._inbox)

    def step(self) -> list[StreamEvent]:
        """One scheduler step: prefill a batch of waiting requests or decode one token for every running one."""
        with self._lock:
            self._admit()
            for seq in [s for s in list(self._live.values()) if s.aborted]:
                self._finish(seq, "abort")
            if not self.scheduler.has_work():
                return []
            seqs, is_prefill = self.scheduler.schedule()
            if not seqs:
                return []
            try:
                results = self.runner.run(seqs, is_prefill)
            except Exception as e:  # one bad batch must not take the engine down: fail these requests only
                log.exception("step failed")
                for seq in seqs:
                    self.block_manager.forget(seq)
                    self._fail(seq, e)
                return []
            self.step_count += 1
            wants = {s.request_id for s in seqs} & self._want_snapshot  # read before finished ones retire
            events = [self._advance(seq, token, lp) for seq, (token, lp) in zip(seqs, results)]
            snap = self.snapshot() if wants else None  # one snapshot per step, shared by every streaming caller
            for ev in events:
                if ev.request_id in wants:
                    ev.snapshot = snap
                self._deliver(ev)
            return events

    def _retire(self, seq, final):
        self._live.pop(seq.request_id, None)
        self._want_snapshot.discard(seq.request_id)
        if final is not None:
            sink = self._sinks.pop(seq.request_id, None)
            if sink is not None:
                sink.put(final)

    def _deliver(self, ev: StreamEvent):
        sink = self._sinks.get(ev.request_id)
        if sink is not None:
            sink.put(ev)
            if ev.finished:
                self._sinks.pop(ev.request_id, None)
