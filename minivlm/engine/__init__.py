"""Engine: the public face. Callers on any thread submit requests; one loop thread steps the core, so every
caller's requests share one running batch (continuous batching), and each caller reads its own queue."""
import dataclasses
import gc

import torch

from minivlm.engine.anatomy import build_anatomy
from minivlm.config import EngineConfig
from minivlm.engine.core import EngineCore
from minivlm.engine.event_log import EngineEvent, to_jsonl, unpack
from minivlm.engine.intake import Intake
from minivlm.loader import LoadedModel
from minivlm.engine.handle import RequestHandle
from minivlm.engine.loop import EngineLoop
from minivlm.engine.outputs import StreamEvent
from minivlm.engine.kv_cache.prefix_tree import prefix_forest
from minivlm.engine.request import Request, SamplingParams
from minivlm.engine.sequence import Sequence
from minivlm.engine.outputs import KVSnapshot, MemoryReport


class Engine:
    """A paged-KV Qwen-VL engine. docs/API.md is the reference."""

    def __init__(self, config: EngineConfig | None = None, share_model_with: "Engine | None" = None, **overrides):
        if config is not None and overrides:  # an override given with a config is applied, never dropped
            unknown = set(overrides) - {f.name for f in dataclasses.fields(EngineConfig)}
            if unknown:
                raise TypeError(f"unknown EngineConfig field(s) {sorted(unknown)}")
            config = dataclasses.replace(config, **overrides)
        self.config = config or EngineConfig(**overrides)
        self.model = share_model_with.model if share_model_with is not None else LoadedModel(self.config)
        self.core = EngineCore(self.config, self.model)
        self.intake = Intake(self.config, self.model, self.core.num_blocks, self.core.image_inputs)
        self.loop = EngineLoop(self.core)
        # what exists now lives as long as the engine: out of the cyclic collector's sight, or every full collection
        # walks it (transformers' and torch's objects, ~360k on the tiny model: a 230 ms stall of every stream).
        # The process's first engine collects everything first; a later one only the young generations (a full
        # walk would stall the engines already serving).
        gc.collect(1 if gc.get_freeze_count() else 2)
        gc.freeze()

    num_blocks = property(lambda self: self.core.num_blocks)
    hf_config = property(lambda self: self.model.hf_config)
    device = property(lambda self: self.model.device)
    model_type = property(lambda self: self.model.model_type)
    family = property(lambda self: self.model.family)  # minivlm.families.Family: how this model takes images
    # which backend runs, in words (str subclasses with a message id and fields: panels/i18n translates by the id)
    attention_backend = property(lambda self: self.core.backend_info()["attention"])
    linear_backend = property(lambda self: self.model.linear_backend)  # the decoder's matrix products
    dtype_reason = property(lambda self: self.model.dtype_reason)  # why dtype="auto" chose it on the CPU ("" if set)
    decode_backend = property(lambda self: self.core.backend_info()["decode"])
    calibration = property(lambda self: self.core.backend_info()["calibration"])  # the CPU step's timed choice, or ""
    processor = property(lambda self: self.model.processor)
    tokenizer = property(lambda self: self.model.tokenizer)

    def isolated(self, **overrides) -> "Engine":
        """A new engine on this one's loaded weights and processor with its own KV pool, prefix cache and loop
        (e.g. isolated(cache_strategy="A", num_blocks=64)); nothing is shared with this engine's cache."""
        fixed = {"model", "device", "dtype"} & set(overrides)
        if fixed:
            raise ValueError(f"an isolated engine shares the loaded model; it cannot change {sorted(fixed)}")
        overrides.setdefault("kv_events", None)  # the endpoint belongs to this engine; an isolated one publishes only if asked
        return Engine(dataclasses.replace(self.config, **overrides), share_model_with=self)

    def close(self):
        """Abort what is pending, stop the loop and free the KV pool; memory_report() still answers."""
        with self.loop.lock:
            self.loop.close()
            self.core.release()
        self.loop.join()  # objects frozen at the start are freed by reference counting only: none may linger
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- submitting -------------------------------------------------------------------------------------
    def make_sequence(self, request: Request, params: SamplingParams) -> Sequence:
        """Validate and render a request on the caller's thread (bad input raises ValueError here)."""
        return self.intake.make_sequence(request, params)

    def _make_sequences(self, requests: list, params) -> list[Sequence]:
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(requests)
        if len(plist) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(plist)} SamplingParams")
        # all validated before any is queued; a request with n > 1 is n sequences, one per choice
        return [seq for r, p in zip(requests, plist) for seq in self.intake.make_choices(r, p)]

    def submit(self, request: Request, params: SamplingParams | None = None, snapshots: bool = False) -> RequestHandle:
        """Validate and queue one request; returns its RequestHandle (`for ev in handle` or `async for ev in
        handle`: a StreamEvent per step that advanced it; its error raised where it is read). A refusal raises here,
        before anything is queued. Closing the handle (or leaving `with handle:`) aborts the request."""
        return self._submit(self.intake.make_choices(request, params or SamplingParams()), snapshots)

    def _submit(self, seqs: list[Sequence], snapshots: bool) -> RequestHandle:
        return self.loop.submit(RequestHandle(self.loop, seqs, snapshots))

    def generate(self, requests, params: SamplingParams | list[SamplingParams] | None = None):
        """Run requests to completion, batched together; returns one Output per request (or one for one)."""
        single = isinstance(requests, Request)
        seqs = self._make_sequences([requests] if single else list(requests), params)
        with self._submit(seqs, snapshots=False) as handle:
            outputs = {seq.seq_id: ev.output for seq, ev in handle.pairs() if ev.finished}
        firsts = []
        for s in seqs:  # n > 1: the first choice's Output lists every choice of its request (choices[0] is itself)
            if s.choice_index == 0:
                firsts.append(outputs[s.seq_id])
            firsts[-1].choices.append(outputs[s.seq_id])
        return firsts[0] if single else firsts

    def stream(self, request: Request, params: SamplingParams | None = None, snapshots: bool = True):
        """Yield a StreamEvent per scheduler step that advanced this request; closing the generator aborts it."""
        with self.submit(request, params, snapshots) as handle:
            yield from handle

    def stream_many(self, requests: list[Request], params: SamplingParams | list[SamplingParams] | None = None,
                    snapshots: bool = True):
        """Submit requests at once (all validated first) and yield every event of all of them as steps produce
        them; closing the generator aborts whatever still runs."""
        with self._submit(self._make_sequences(list(requests), params), snapshots) as handle:
            yield from handle

    def abort(self, request_id: str):
        """Cancel the unfinished submissions labelled request_id; their blocks are freed at the next step."""
        self.loop.abort(request_id)

    def has_unfinished(self) -> bool:
        """Whether any submitted request has not delivered its last event yet."""
        return self.loop.has_unfinished()

    # ---- step-through -----------------------------------------------------------------------------------
    def pause(self):
        """Stop the loop between steps (returns once a step in flight has ended); submissions still queue."""
        self.loop.set_paused(True)

    def resume(self):
        """Let the loop run again; it continues exactly where step() left it."""
        self.loop.set_paused(False)

    def is_paused(self) -> bool:
        """Whether pause() holds the loop between steps (submissions queue; their answers wait for step/resume)."""
        return self.loop.is_paused()

    def step(self) -> list[StreamEvent]:
        """While paused: run exactly one scheduler step and return its StreamEvents (also sent to their callers)."""
        if not self.loop.is_paused():
            raise RuntimeError("step() drives a paused engine; call engine.pause() first")
        return self.loop.step()

    # ---- the event log ----------------------------------------------------------------------------------
    def events(self, since: int = 0) -> list[EngineEvent]:
        """The decisions logged after event `since` (EngineEvent.seq > since), in order; see minivlm.engine.event_log and minivlm.views.events."""
        with self.loop.lock:  # copy the packed records only: the steps wait for the copy, not for the rebuild
            records = self.core.events.records_since(since)
        return unpack(records)

    def events_jsonl(self, since: int = 0) -> str:
        """The same events, one JSON object per line."""
        return to_jsonl(self.events(since))

    @property
    def events_dropped(self) -> int:
        """Events pushed out of the ring log (EngineConfig.event_log_size) so far."""
        return self.core.events.dropped

    # ---- views ------------------------------------------------------------------------------------------
    def kv_events_stats(self) -> dict | None:
        """The KV-event publisher's counters (batches, events, dropped_queue, dropped_hwm, replays), or None when
        this engine does not publish (docs/KV_EVENTS.md)."""
        pub = self.core.kv_publisher
        return None if pub is None else {"next_seq": pub.next_seq, **pub.stats}

    def spec_decode_stats(self):
        """Speculative decoding's counters (a SpecStats: num_drafts, num_draft_tokens, num_accepted_tokens,
        accepted_per_pos), or None when the engine does not speculate."""
        if self.config.speculative_config is None:
            return None
        with self.loop.lock:
            s = self.core.speculation.stats
            return dataclasses.replace(s, accepted_per_pos=list(s.accepted_per_pos))

    def encoder_cache_stats(self) -> dict[str, int]:
        """The encoder cache's counters (minivlm.engine.encoder.encoder_cache): hits and misses (one per image whose request
        took its images, since the engine started), size and used (embeddings: the bound, and those held now),
        in_use (of them, used by live requests) and entries (outputs held)."""
        with self.loop.lock:
            return self.core.encoder_cache_stats()

    def snapshot(self) -> KVSnapshot:
        """KVSnapshot of the pool now (plain data, safe to hand to another thread)."""
        with self.loop.lock:
            return self.core.snapshot()

    def memory_report(self) -> MemoryReport:
        """What is really allocated: weights, the KV pool, and the device's peak where it can tell."""
        return self.core.memory_report()

    def reset_prefix_cache(self):
        """Forget every cached-but-free block and every cached encoder output (those in use stay)."""
        with self.loop.lock:
            self.core.reset_prefix_cache()

    def anatomy(self, request: Request):
        """How `request` becomes tokens, M-RoPE positions, blocks and A/B/C keys (no model run; minivlm.engine.anatomy)."""
        return build_anatomy(self, request)

    def prefix_tree(self):
        """The prefix cache now as a forest of chained keys (list[TreeNode], minivlm.engine.kv_cache.prefix_tree)."""
        with self.loop.lock:
            return prefix_forest(self.core.block_manager)
