"""Continuous batching: admit waiting requests while blocks and budgets allow (prefill), otherwise advance
every running request by one token (decode), preempting the newest by recompute when blocks run out. Each step's
decisions come out as one immutable StepPlan (minivlm.engine.scheduling.plan), each request's part written by
runner_inputs.py; the scheduler writes no request progress."""
from collections import deque

from minivlm.engine.kv_cache.coordinator import KVCacheCoordinator
from minivlm.config import EngineConfig
from minivlm.engine.encoder.encoder_cache import DEFAULT_ENCODER_CACHE_SIZE, EncoderCacheManager
from minivlm.engine.event_log import EventLog
from minivlm.engine.lifecycle import RequestRegistry
from minivlm.engine.scheduling.plan import EncodeJob, NewRequestData, Preemption, ScheduledRequest, StepPlan, preemption_reason
from minivlm.engine.scheduling.runner_inputs import image_runs, scheduled_request
from minivlm.engine.sequence import Sequence
from minivlm.engine.spec_decode.ngram import Speculator
from minivlm.engine.scheduling.step_budget import AdaptiveTokenBudget


class Scheduler:
    def __init__(self, block_manager: KVCacheCoordinator, config: EngineConfig, events: EventLog | None = None,
                 requests: RequestRegistry | None = None, whole_spans: bool = False,
                 encoder_cache_size: int = DEFAULT_ENCODER_CACHE_SIZE, fast_rows: int | None = None):
        self.bm = block_manager
        self.requests = requests or RequestRegistry()  # the queues it serves; their moves are lifecycle.py's
        self.events = events or EventLog(0)
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked = config.enable_chunked_prefill
        self.adaptive = AdaptiveTokenBudget(config.max_step_slowdown, config.max_num_batched_tokens) \
            if self.chunked and config.max_step_slowdown is not None else None
        if self.adaptive is not None:  # chunks keep mixed steps within the backend's one fast call
            self.adaptive.fast_rows = fast_rows
        self._budget = None                  # this step: the adaptive budget's decision (plain data), if any
        self._start: dict[int, int] = {}     # this step: seq_id -> first token it computes
        self._planned: dict[int, dict] = {}  # this step: seq_id -> what was decided for it
        self._preempted: list[Preemption] = []
        self.encoder = EncoderCacheManager(encoder_cache_size)  # the runner's encoder outputs, as a book
        self._jobs: dict[int, EncodeJob] = {}  # this step: seq_id -> its images, taken now
        self._in_tower: frozenset[int] = frozenset()  # this step: requests whose images are on the vision thread
        self.whole_spans = whole_spans  # Gemma 3: an image's tokens attend both ways, so a chunk never ends inside one
        self._sent: set[int] = set()  # requests whose NewRequestData a plan carried; until they leave
        self.speculator = Speculator(config.speculative_config, config.max_model_len, self.events) \
            if config.speculative_config is not None else None

    waiting = property(lambda self: self.requests.waiting)
    running = property(lambda self: self.requests.running)
    num_preemptions = property(lambda self: self.requests.num_preemptions)

    def has_work(self) -> bool:
        return self.requests.has_work()

    def schedule(self, step: int = 0, in_tower: frozenset[int] = frozenset()) -> tuple[StepPlan, list]:
        """Pick this step's work (below) and return it as a StepPlan, with the requests whose scheduling raised;
        the `scheduled` event carries the plan's requests as plain data. in_tower: the requests whose images are
        still on the vision thread (async_vision), which wait."""
        self._start, self._planned, self._preempted, self._budget = {}, {}, [], None
        self._in_tower = in_tower
        self.bm.begin_step()
        batch, kind, failed = self._pick()
        self._jobs = {s.seq_id: job for s in batch if (job := self.encode_job(s)) is not None}
        reqs = tuple(self._item(s) for s in batch)
        plan = StepPlan(step, kind, reqs, tuple(self._preempted), tuple(self._jobs.values()), self._budget,
                        free_encoder_keys=self.encoder.end_step(), block_size=self.bm.block_size,
                        new_requests=self._new_requests(batch))
        if reqs:
            counts = {r.request_id: r.num_tokens for r in reqs}
            extra = {"budget": self._budget} if self._budget is not None else {}
            self.events.emit("scheduled", step_kind=kind, request_ids=list(counts),
                             num_tokens=sum(counts.values()), num_scheduled_tokens=counts,
                             sampling=[r.request_id for r in reqs if r.sample],  # chunks don't
                             plan=plan.to_dict(), **extra)
        return plan, failed

    def _item(self, seq: Sequence) -> ScheduledRequest:
        """seq's part of the plan (runner_inputs.py), with each KV-cache group's part, made by its manager."""
        p, job = self._planned[seq.seq_id], self._jobs.get(seq.seq_id)
        return scheduled_request(seq, p, self.bm.step_parts(seq, p["start"], p["end"] + len(p.get("draft", ()))),
                                 job is not None and bool(job.todo), self.whole_spans)

    def _new_requests(self, batch: list[Sequence]) -> tuple[NewRequestData, ...]:
        """What the runner keeps of the batch's requests it has not been sent yet: sent once, until they leave."""
        new = tuple(NewRequestData(s.seq_id, s.request_id, s.params, s.seed, tuple(s.token_ids[:s.num_prompt_tokens]))
                    for s in batch if s.seq_id not in self._sent)
        self._sent.update(n.seq_id for n in new)
        return new

    def encode_job(self, seq: Sequence) -> EncodeJob | None:
        """seq's images, taken by its first chunk with image tokens (EncoderCacheManager.take: hits and misses);
        None when it has none to take in this step."""
        p = self._planned[seq.seq_id]
        if not seq.images or self.encoder.took(seq.seq_id) or not any(seq.token_types[p["start"]:p["end"]]):
            return None
        todo = self.encoder.take(seq.seq_id, seq.vision_keys, [im.num_tokens for im in seq.images])
        return EncodeJob(seq.seq_id, seq.request_id, seq.vision_keys, todo)

    def _pick(self) -> tuple[list[Sequence], str, list]:
        """Chunked: the running requests first (a decode token each, or their prefill's next chunk), then new
        ones, until the token budget is spent. Otherwise: prefill as many waiting requests as fit whole; if
        none, decode every running one. A request whose block bookkeeping raises is dropped (its blocks
        forgotten) and reported as failed; the rest go on."""
        if self.chunked:
            limit = self._step_limit()
            batch, failed = self._continue_running(limit)
            budget = limit - sum(self._count(s) for s in batch)
            batch += self._admit_waiting(budget, failed)
            kinds = {self._is_decode(s) for s in batch}
            return batch, "mixed" if len(kinds) > 1 else "decode" if True in kinds else "prefill", failed
        failed = []
        batch = self._admit_waiting(self.max_num_batched_tokens, failed, whole=True)
        if batch or failed:
            return batch, "prefill", failed
        batch, failed = self._continue_running(None)
        return batch, "decode", failed

    def _step_limit(self) -> int:
        """The step's token budget: the configured one, or (adaptive) the running decodes plus the prompt tokens
        the measured step times allow beside them."""
        if self.adaptive is None:
            return self.max_num_batched_tokens
        decodes = sum(s.num_output_tokens > 0 and s.num_computed == len(s) - 1 for s in self.running)
        decision = self.adaptive.decide(decodes)
        self._budget = decision.to_dict()
        return min(self.max_num_batched_tokens, decodes + decision.prompt_tokens)

    # ---- the encoder cache's book and the adaptive budget, as the core asks them (never reaching through) ----
    def encoder_cache_stats(self) -> dict[str, int]:
        return self.encoder.stats()

    def encoder_outputs_lost(self, keys):  # a plan encoded them but the runner does not hold them
        self.encoder.lost(keys)

    def reset_caches(self):
        """Forget every cached-but-free block and every cached encoder output (the next plan frees them)."""
        self.bm.reset()
        self.encoder.reset()

    def time_left_after(self, decodes: int, seconds: float) -> float:
        """Seconds the adaptive budget leaves of its allowance after a step of `decodes` decode tokens that took
        `seconds` (what the sliced vision tower may run)."""
        return self.adaptive.left_after(decodes, seconds)

    def observe(self, plan: StepPlan, seconds: float):
        """The forward time of a plan that ran whole: what the adaptive budget learns from."""
        if self.adaptive is not None:
            decodes = sum(r.kind == "decode" for r in plan)
            self.adaptive.observe(decodes, sum(r.end - r.start for r in plan if r.kind != "decode"), seconds)

    def _count(self, seq: Sequence) -> int:
        p = self._planned[seq.seq_id]
        return p["end"] - p["start"] + len(p.get("draft", ()))

    def _is_decode(self, seq: Sequence) -> bool:
        return seq.num_output_tokens > 0 and self._planned[seq.seq_id]["start"] == len(seq) - 1

    def _admit_waiting(self, budget: int, failed: list, whole: bool = False) -> list[Sequence]:
        """Admit waiting requests in order while sequence slots, budget and blocks last; whole=True admits
        only prompts that fit the budget whole (always the first one, which the config guarantees fits)."""
        batch, dropped = [], set()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            # async_vision: a request whose images are still in the tower waits; the next one goes first
            seq = next((s for s in self.waiting if s.seq_id not in self._in_tower and s.seq_id not in dropped), None)
            if seq is None:
                break
            if whole and batch and len(seq) > budget:
                break
            try:
                if not self.bm.can_allocate(seq):
                    break
                hits = self.bm.allocate(seq)  # the whole prompt's blocks: a prefill never waits for memory midway
                start = len(hits) * self.bm.block_size
                self._start[seq.seq_id] = start
                self._plan(seq, start, len(seq) - start if whole else budget, hits=hits, admitted=True)
            except Exception as e:
                failed.append((seq, self._drop(seq, e)))
                dropped.add(seq.seq_id)  # the core finishes it after this plan; the next in line goes on
                continue
            budget -= self._count(seq)
            self.requests.run(seq)
            batch.append(seq)
        return batch

    def _continue_running(self, budget: int | None) -> tuple[list[Sequence], list]:
        """Every running request, oldest first, gets its next token or prefill chunk while the budget (None: no
        limit) lasts; a request that needs a block when none is free preempts the newest running one."""
        pending, batch, failed = deque(self.running), [], []
        while pending:
            seq = pending.popleft()
            if budget is not None and budget <= 0:
                continue  # stays running; its turn comes next step
            try:
                while not self.bm.can_append(seq):  # seq needs a block for its next token and none is free
                    if not pending:
                        self.preempt(seq, seq.request_id)  # no other request is running: seq itself
                        break
                    victim = pending.pop()  # newest first: it has the least work to redo
                    self.preempt(victim, seq.request_id)
                else:
                    self.bm.append_slot(seq)
                    start = seq.num_computed
                    draft, at = self.speculator.draft(seq, budget, self.bm, len(pending)) if self.speculator \
                        else ((), -1)
                    self._plan(seq, start, budget if budget is not None else len(seq) - start, draft=draft,
                               draft_at=at)
                    batch.append(seq)
                    if budget is not None:
                        budget -= self._count(seq)
            except Exception as e:
                failed.append((seq, self._drop(seq, e)))
        return batch, failed

    def _plan(self, seq: Sequence, start: int, max_tokens: int, **decided):
        """Schedule up to max_tokens of seq's uncomputed tokens, from `start`, for this step. The full blocks they
        complete are published now: their K/V are written in this step's forward, in every layer before any
        attention reads the cache, so a request that hits them in this same step reads written K/V."""
        bs = self.bm.block_size
        end = self._whole_spans(seq, start, min(len(seq), start + max_tokens))
        end = next((p for p in self.bm.save_points(seq) if start < p < end), end)  # a state is saved after a step
        self.bm.advance(seq, start, end)  # the other KV-cache groups' blocks and state slots (kv_cache/coordinator.py)
        self.bm.dirty.update(self.bm.table(seq)[start // bs:-(-(end + len(decided.get("draft", ()))) // bs)])
        self._planned[seq.seq_id] = {"start": start, "end": end, "publishes": [], **decided}
        self._planned[seq.seq_id]["publishes"] = self.bm.publish(seq, end, start)

    def _whole_spans(self, seq: Sequence, start: int, end: int) -> int:
        """A chunk that would end inside an image span ends before it, or (the span alone larger than the budget, or
        begun in the cache) after it: the span's tokens attend to each other both ways."""
        if not self.whole_spans or end >= len(seq):
            return end
        for a, b in image_runs(seq):
            if a < end < b:
                return a if a > start else b
        return end

    def _drop(self, seq: Sequence, error: Exception) -> Exception:
        """Take a request whose scheduling raised out of the engine: its blocks were never computed."""
        self.bm.forget(seq, self._start.get(seq.seq_id))
        self._planned.pop(seq.seq_id, None)
        return error

    def preempt(self, seq: Sequence, needed_by: str):
        """Free seq's blocks for `needed_by` (the request that needs a block; seq itself when it runs alone) and
        queue it first in line; its tokens so far are recomputed on re-admission."""
        blocks = list(self.bm.table(seq))
        freeing = sum(self.bm.blocks[b].ref_count == 1 for b in blocks)
        self.events.emit("preempted", seq.request_id, block_ids=blocks, needed_by=needed_by, num_freed=freeing,
                         num_tokens=len(seq), reason=preemption_reason(seq.request_id, needed_by, len(blocks),
                                                                        freeing, len(seq)))
        self.bm.deallocate(seq)
        self._preempted.append(Preemption(seq.seq_id, seq.request_id, tuple(blocks), needed_by))
        self.requests.preempt(seq)

    def unwritten(self, ran: list[ScheduledRequest], live: dict) -> dict[int, int]:
        """seq_id -> the first token whose K/V its forward read but nobody wrote, for the requests that ran: a block it
        hit was unpublished since the plan (its publisher failed before writing it), or was published in this step
        by such a request (in plan order, hits only reach back to earlier requests)."""
        bad, unwritten = set(), {}
        for r in ran:
            start = self.unwritten_start(live[r.seq_id], r, bad)
            if start < r.start:
                unwritten[r.seq_id] = start
                bad.update(b for b, _ in r.publishes)
        return unwritten

    def unwritten_start(self, seq: Sequence, req: ScheduledRequest, bad: set[int] = frozenset()) -> int:
        """The first token whose K/V req's forward read but nobody wrote: its first block before req.start that was
        unpublished since it was planned (the request that published it failed before writing it) or is in `bad`
        (published in this step by a request that itself read unwritten K/V); req.start if none."""
        bs = self.bm.block_size
        if not self.bm.caching:
            return req.start
        for i, b in enumerate(self.bm.table(seq)[:req.start // bs]):
            if b in bad or (i < len(seq.block_keys) and self.bm.blocks[b].key != seq.block_keys[i]):
                return i * bs
        return req.start

    def release(self, seq: Sequence, computed: bool = True, written: int | None = None):
        """Release a finished, aborted or failed request's blocks (computed=False: its blocks from token `written`
        on never got their K/V, so they are unpublished too); its references to encoder outputs go too (what no one
        uses stays cached while it fits)."""
        self.encoder.release(seq.seq_id)
        self._sent.discard(seq.seq_id)
        if computed:
            self.bm.deallocate(seq)
        else:
            self.bm.forget(seq, written)
