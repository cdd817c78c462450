"""The runner's persistent batch (vLLM's InputBatch, reduced): each request's sampling state, built once from its
NewRequestData and kept across steps (and preemptions) until the request leaves, and its table in every KV-cache group,
kept by each step's per-group delta (the blocks it got, those given back out of the window; a re-admission starts
again from its hits). The plan carries no mutable object and
no whole table: the RNG lives here, and so do the tokens the penalties count, extended by the tokens the runner itself
samples instead of being copied out of the request every step."""
from dataclasses import dataclass, field

import torch

from minivlm.engine.scheduling.plan import NewRequestData
from minivlm.engine.request import SamplingParams


@dataclass(eq=False)
class RequestState:
    """One request's row of the batch: how it samples (params, its own RNG) and, when it asks for penalties, the
    tokens they count (history: prompt + answer so far; the answer from num_prompt)."""
    seq_id: int
    request_id: str
    params: SamplingParams
    generator: torch.Generator | None
    history: list[int]  # empty when no penalty reads it
    num_prompt: int
    tables: list[list[int]] = field(default_factory=list)  # per group id: its KV blocks, kept by the plans' deltas

    @property
    def block_table(self) -> list[int]:
        """Group 0's table (the full-attention group's: the block map's)."""
        return self.tables[0] if self.tables else []

    @classmethod
    def from_new(cls, new: NewRequestData) -> "RequestState":
        p = new.params
        penalized = bool(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0)
        generator = torch.Generator().manual_seed(new.seed) if new.seed is not None else None
        return cls(new.seq_id, new.request_id, p, generator, list(new.prompt_token_ids) if penalized else [],
                   len(new.prompt_token_ids))


class InputBatch:
    """seq_id -> RequestState of every request a plan has sent and that has not left."""

    def __init__(self):
        self.states: dict[int, RequestState] = {}

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.states

    def __getitem__(self, seq_id: int) -> RequestState:
        return self.states[seq_id]

    def add(self, new: NewRequestData):
        self.states[new.seq_id] = RequestState.from_new(new)

    def update_tables(self, reqs):
        """Each scheduled request's table in every group from this step's part of it (AttentionGroupStep.apply:
        admitted, its hits; then what is left of it, the blocks it got now, those that left the window)."""
        for r in reqs:
            tables = self.states[r.seq_id].tables
            while len(tables) < len(r.groups):
                tables.append([])
            for part, table in zip(r.groups, tables):
                part.apply(table, r.admitted)

    def remove(self, seq_id: int):
        self.states.pop(seq_id, None)

    def sampled(self, seq_id: int, tokens):
        """The tokens the runner drew for it: its penalties count them from the next step on."""
        state = self.states.get(seq_id)
        if state is not None and state.history:
            state.history.extend(tokens)
