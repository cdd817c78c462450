"""The step plan: everything one scheduler step decided, as immutable plain data (vLLM's SchedulerOutput). The
scheduler writes it, the runner executes it, EngineCore.update applies it, and the `scheduled` event carries it,
so the log is the very object that drove the step."""
import itertools
from dataclasses import dataclass, field, replace

import torch

from minivlm.engine.kv_cache.group_steps import AttentionGroupStep, StateGroupStep  # noqa: F401 (the plan's parts)
from minivlm.engine.outputs import CacheHit
from minivlm.engine.request import SamplingParams


@dataclass(frozen=True)
class NewRequestData:
    """What the runner keeps of a request from the first plan that schedules it until it leaves (vLLM's
    NewRequestData): sent once, as plain data; the runner's InputBatch builds its sampling state from it (its RNG from
    `seed`, the tokens its penalties count from the prompt on). Later plans carry only what changes per step."""
    seq_id: int
    request_id: str
    params: SamplingParams
    seed: int | None                      # its RNG's seed (temperature > 0), else None: greedy
    prompt_token_ids: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class ScheduledRequest:
    """One request's part of a step (vLLM's per-step CachedRequestData): it computes the K/V of tokens [start, end)
    and, when `sample`, the next token. Plain data: its sampling state is the runner's (NewRequestData, input_batch)."""
    seq_id: int
    request_id: str
    start: int
    end: int
    sample: bool                          # end is the sequence's length: a token is sampled after it
    kind: str                             # prefill (whole or its rest) | chunk (more prefill follows) | decode
    hits: tuple[CacheHit, ...] = ()       # blocks shared from the prefix cache (admissions only)
    publishes: tuple[tuple[int, str], ...] = ()  # (block id, key) of the full blocks this step's K/V complete
    admitted: bool = False                # it left the waiting queue in this step
    encode: bool = False                  # the tower encodes some of its images in this step (see StepPlan.encodes)
    # what the runner needs of it, computed once when planned
    token_ids: tuple[int, ...] = ()
    positions: torch.Tensor | None = None  # [3, end - start] M-RoPE positions
    image_at: tuple[int, ...] = ()         # offsets in [0, end - start) of its image placeholder tokens
    image_rows: tuple[tuple[str, int, int], ...] = ()  # their rows, in runs: (vision key, first row, rows) of an output
    # each KV-cache group's part, indexed by group id (vLLM's per-group block ids): an AttentionGroupStep or a
    # StateGroupStep, made by that group's manager (engine/kv_cache/coordinator.py)
    groups: tuple = ()
    spans: tuple[tuple[int, int], ...] = ()  # image token ranges that attend both ways (Gemma 3), overlapping the step
    # speculative decoding (engine/spec_decode/ngram.py): guesses of the next tokens, computed after [start, end) and
    # verified by this step's logits at every one of them; slots past `end` hold them until accepted or given back
    draft: tuple[int, ...] = ()
    draft_at: int = -1                     # where in its tokens the guess was found

    @property
    def num_tokens(self) -> int:
        """Tokens this step computes: its own, and its draft's."""
        return self.end - self.start + len(self.draft)

    @property
    def num_logits(self) -> int:
        """Rows of logits it needs: one, or (speculating) one at its last token and one at each guess."""
        return 1 + len(self.draft)

    # group 0's part as the plan and the `scheduled` event have always named it (the full-attention group: the block
    # map's, coordinator.py says why it leads)
    num_blocks = property(lambda self: self.groups[0].num_blocks)
    new_blocks = property(lambda self: self.groups[0].new_blocks)
    slots = property(lambda self: self.groups[0].slots)

    def group_fields(self) -> dict:
        """A hybrid model's groups in the `scheduled` event, so a replay rebuilds each group's table at any step:
        `groups`, every group's part (by group id), and, as before, the recurrent state's slot (and the checkpoint it
        resumes from) and, on admission, the sliding table."""
        out = {}
        if self.draft:  # the guesses and the slots that hold them until accepted or given back
            out.update(draft=list(self.draft), draft_slots=list(self.slots[-len(self.draft):]))
        if len(self.groups) < 2:
            return out
        for g in self.groups[1:]:  # the older names (docs/API.md keeps them): one sliding and one recurrent group
            if isinstance(g, StateGroupStep):
                out["state_slot"] = g.slot
                if g.restore_from >= 0:
                    out["restore_from"] = g.restore_from
            elif self.admitted and "sliding_table" not in out:
                out["sliding_table"] = g.apply([], True)
        out["groups"] = [g.to_dict(self.admitted) for g in self.groups]
        return out


@dataclass(frozen=True)
class Preemption:
    """A running request sent back to the waiting queue by recompute, with the blocks it released, for the request
    that needed a block (itself when it ran alone)."""
    seq_id: int
    request_id: str
    block_ids: tuple[int, ...]
    needed_by: str


def preemption_reason(victim: str, needed_by: str, blocks: int, freed: int, tokens: int) -> str:
    """The `preempted` event's `reason`, the English sentence docs/API.md promises its readers; the views and the
    Chinese page say it from the event's fields (needed_by, num_freed, num_tokens)."""
    chosen = f"no other request is running, so {victim} itself" if victim == needed_by else \
        f"preempting the newest running request, {victim}"
    return (f"{needed_by} needs a block for its next token; none is free; {chosen}, releasing its {blocks} blocks "
            f"({freed} become free); its {tokens} tokens will be recomputed")


@dataclass(frozen=True, eq=False)
class EncodeJob:
    """A request's images, taken in this step (its first chunk with image tokens): each image's output is held by
    the runner's encoder cache from now on, and those of `todo` are encoded in this step (engine/encoder/encoder_cache.py).
    The runner has the pixels (it got them when the request was admitted) and drops them once the job has run."""
    seq_id: int
    request_id: str
    keys: tuple[str, ...]                 # each image's vision key
    todo: tuple[int, ...] = ()            # the images whose outputs the tower (or the vision thread's job) gives now


NO_ROWS = torch.zeros(0, dtype=torch.long)  # a step without image tokens (most decode steps): no tensor to build


@dataclass(frozen=True, eq=False)
class StepInputs:
    """The flat tensors of a step's forward that every group shares, built once from its requests (on the CPU; the
    runner moves them). Each group's slots and tables are its metadata builder's (engine/execution/group_metadata.py)."""
    input_ids: torch.Tensor               # [T]
    positions: torch.Tensor               # [3, T]
    q_lens: list[int]
    ctx_lens: list[int]
    image_at: torch.Tensor                # [I] rows of T that hold image placeholders
    image_rows: list[tuple[str, int, int]]  # their encoder-output rows, in runs: (vision key, first row, rows)
    last: torch.Tensor                    # each request's last row in T (its logits); a speculating one's k + 1 rows

    @classmethod
    def build(cls, reqs) -> "StepInputs":
        """From the requests' per-step data."""
        q_lens = [r.num_tokens for r in reqs]
        ends = list(itertools.accumulate(q_lens))  # where each request's rows end in T
        at = [end - q + i for r, q, end in zip(reqs, q_lens, ends) for i in r.image_at]
        return cls(torch.tensor([t for r in reqs for t in r.token_ids]), torch.cat([r.positions for r in reqs], dim=1),
                   q_lens, [r.end + len(r.draft) for r in reqs], torch.tensor(at, dtype=torch.long) if at else NO_ROWS,
                   [run for r in reqs for run in r.image_rows],
                   torch.tensor([row for r, end in zip(reqs, ends) for row in range(end - r.num_logits, end)]))


@dataclass(frozen=True, eq=False)
class StepPlan:
    """One step: who computes which tokens, the blocks it allocates and publishes, the preemptions with their
    reason, the images to encode and the encoder outputs to free; `inputs` are the flat tensors of the forward.
    Iterating yields the requests."""
    step: int
    kind: str                             # prefill | decode | mixed (decodes and prefill chunks together)
    requests: tuple[ScheduledRequest, ...]
    preemptions: tuple[Preemption, ...] = ()
    encodes: tuple[EncodeJob, ...] = ()
    budget: dict | None = None            # the adaptive token budget's decision and its measurements, if adaptive
    free_encoder_keys: tuple[str, ...] = ()  # encoder outputs evicted since the last plan: the runner deletes them first
    new_requests: tuple[NewRequestData, ...] = ()  # requests scheduled for the first time: the runner keeps them
    block_size: int = 16                  # tokens per KV block (to_dict names the blocks that hold only guesses)
    _inputs: list = field(default_factory=list, repr=False)  # built on first use, once

    def __iter__(self):
        return iter(self.requests)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def inputs(self) -> StepInputs:
        """The forward's flat tensors, once the runner has built them (build_inputs)."""
        if not self._inputs:
            raise RuntimeError(f"step {self.step}: the runner builds a plan's inputs (build_inputs) before reading them")
        return self._inputs[0]

    def build_inputs(self) -> StepInputs:
        """The flat tensors every group shares, built once from the requests."""
        if not self._inputs:
            self._inputs.append(StepInputs.build(self.requests))
        return self._inputs[0]

    def only(self, reqs) -> "StepPlan":
        """The same step restricted to some of its requests (a stage retried one request at a time)."""
        keep = {r.seq_id for r in reqs}
        return replace(self, requests=tuple(reqs), encodes=tuple(e for e in self.encodes if e.seq_id in keep),
                       _inputs=[])

    def to_dict(self) -> list[dict]:
        """The requests as plain data (what the `scheduled` event carries): no tensors, no RNG."""
        return [{"request_id": r.request_id, "kind": r.kind, "start": r.start, "end": r.end, "sample": r.sample,
                 "admitted": r.admitted, "hits": [h.block_id for h in r.hits], "new_blocks": list(r.new_blocks),
                 "published": [b for b, _ in r.publishes], "slots": [r.slots[0], r.slots[-1]] if r.slots else [],
                 "encode": r.encode, **r.group_fields(), **self.guess_blocks(r)} for r in self.requests]

    def guess_blocks(self, r: ScheduledRequest) -> dict:
        """A speculating request's blocks that hold only its guesses (those past its own tokens' blocks: the last of
        its table, allocated in this step since the guesses of the step before were given back)."""
        if not r.draft:
            return {}
        n = r.num_blocks + (r.end // -self.block_size)  # blocks past ceil(end / block size)
        return {"draft_blocks": list(r.new_blocks[len(r.new_blocks) - n:]) if n > 0 else []}


@dataclass
class RunnerOutput:
    """What executing a plan produced (engine/execution/execute.py), as plain results the core applies: the requests whose
    images were taken (with what the vision thread's job took, under async_vision), the outputs the plan encoded
    that the runner does not hold (every request that needed them failed), the requests whose forward ran, the token
    (with its logprobs) each sampling request drew, a speculating request's emitted tokens, the grammar masks its
    sampling applied, and the requests that failed, by stage: (seq_id, stage, error), in the order they failed."""
    encoded: dict[int, dict | None] = field(default_factory=dict)
    lost: tuple[str, ...] = ()
    ran: set[int] = field(default_factory=set)
    sampled: dict[int, tuple[int, dict | None]] = field(default_factory=dict)
    spec: dict[int, list[tuple[int, dict | None]]] = field(default_factory=dict)  # speculating: the tokens it emits
    masks: object | None = None  # the grammar masks its sampling applied (engine/grammar_masks.BatchMasks)
    failed: list[tuple[int, str, BaseException]] = field(default_factory=list)
    logits: tuple | None = field(default=None, repr=False)  # between the phases: (requests that ran, their rows)

    @property
    def dead(self) -> set[int]:
        return {seq_id for seq_id, _, _ in self.failed}

    def fail(self, stage: str):
        """isolate's `fail` for one stage: the item's request failed there (recorded, not acted on)."""
        return lambda item, error: self.failed.append((item.seq_id, stage, error))
