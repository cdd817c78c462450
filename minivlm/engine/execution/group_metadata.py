"""One metadata builder per KV-cache group kind (engine/kv_cache/coordinator.py explains the groups): what a step's
plan becomes for the layers of that group, and what the group's memory needs around the forward. Each builder reads
its group's part of every request (`r.groups[self.group]`, the class it names in `part`: AttentionGroupStep or
StateGroupStep) and its group's table in the runner's batch; a plain model has one builder (full attention), a hybrid
model one per group, and its decoder reads them by kind. A new kind of group is one more builder class here."""
import torch

from minivlm.engine.kv_cache.group_steps import SharedGroupStep
from minivlm.engine.scheduling.plan import AttentionGroupStep, StateGroupStep
from minivlm.model.attention import AttentionMetadata
from minivlm.model.cache_spec import StateMetadata, group_layers


def padded(tables) -> torch.Tensor:
    """Block tables as one [B, max blocks] tensor, padded with block 0."""
    width = max(len(t) for t in tables)
    return torch.tensor([list(t) + [0] * (width - len(t)) for t in tables])


class FullAttentionBuilder:
    """Every token's slot and each request's block table in the group's pool; image spans that attend both ways
    (Gemma 3) go with them."""
    kind, part = "full_attention", AttentionGroupStep

    def __init__(self, group: int, layers: list[int], spec, block_size: int, attention):
        self.group, self.layers, self.block_size, self.attention = group, layers, block_size, attention
        self.window = spec.window if spec is not None else None

    def build(self, plan, batch, dev, spans):
        x, g = plan.inputs, self.group
        slots = torch.tensor([s for r in plan for s in r.groups[g].slots])
        tables = padded([batch[r.seq_id].tables[g] for r in plan])
        return AttentionMetadata.build(slots.to(dev), x.q_lens, x.ctx_lens, tables.to(dev), self.block_size, dev,
                                       self.attention, window=self.window, spans=spans)

    def before(self, plan, caches):
        """Nothing: a request's K/V are written by the forward itself."""

    def after(self, plan, caches):
        """Nothing: the written K/V are the cache."""

    def accepted(self, r, num_accepted: int, caches):
        """Nothing: K/V past the accepted tokens sit beyond the request's length, never read (their blocks go back)."""


class SlidingWindowBuilder(FullAttentionBuilder):
    """The same over the sliding-window pool, under its window (0 in a table where a block left the window: the mask
    never reads it)."""
    kind = "sliding_window"


class RecurrentBuilder:
    """Each request's state slot; before the forward a slot starts from zeros (from token 0) or from the checkpoint
    its prefix hit resumes, after it the states a plan saves are copied into their checkpoint slots. A request that
    verifies guesses (StateGroupStep.draft) has its layers keep the state after each of its tokens (the metadata's
    `kept`, for this step only); once verification says how many it accepted, `accepted` copies the state after the
    last accepted token back into its slot, so a rejected guess leaves the state exactly as if only the accepted
    tokens had been fed. Kept states, not recomputation (copy the state aside, rerun the accepted tokens after a
    rejection), by measurement (tools/bench_spec_state.py, Qwen3.5-0.8B shapes, k = 4): recomputing was 1.07-1.36x
    slower per verify step; keeping costs k states per request (77 MiB for the 0.8B model) only between the forward
    and verification, never in the pool (docs/ENGINE.md, "Speculation on hybrid models")."""
    kind, part = "recurrent", StateGroupStep

    def __init__(self, group: int, layers: list[int], spec=None, block_size: int = 0, attention=None):
        self.group, self.layers = group, layers
        self.kept: dict[int, list] = {}  # this step: seq_id -> per layer, the states after each token but the last

    def build(self, plan, batch, dev, spans):
        parts = [r.groups[self.group] for r in plan]
        meta = StateMetadata(torch.tensor([p.slot for p in parts]).to(dev), plan.inputs.q_lens,
                             max(plan.inputs.q_lens) > 1, [p.draft for p in parts])
        self.kept, self._meta, self._index = {}, meta, {r.seq_id: i for i, r in enumerate(plan)}
        return meta

    def before(self, plan, caches):
        for r in plan:
            part = r.groups[self.group]
            if r.start == 0:
                for i in self.layers:
                    for t in caches[i]:
                        t[part.slot].zero_()
            elif part.restore_from >= 0:
                self.copy(caches, [(part.restore_from, part.slot)])

    def after(self, plan, caches):
        """Saves into checkpoint slots; a verifying request's save is the state after its own token (kept), not
        after its guesses."""
        self.kept = {r.seq_id: self._meta.kept.pop(self._index[r.seq_id]) for r in plan
                     if r.groups[self.group].draft and self._index.get(r.seq_id) in self._meta.kept}
        for r in plan:
            if (p := r.groups[self.group]).save_to < 0:
                continue
            if r.seq_id in self.kept:
                self.put(caches, self.kept[r.seq_id], r.end - r.start - 1, p.save_to)
            else:
                self.copy(caches, [(p.slot, p.save_to)])

    def accepted(self, r, num_accepted: int, caches):
        """r verified its guesses and kept num_accepted of them: its slot gets the state after its last accepted
        token (all accepted: the slot holds it already); the kept states go."""
        kept = self.kept.pop(r.seq_id, None)
        at = r.end - r.start - 1 + num_accepted  # the index of that token among the step's own and guessed
        if kept is not None and at < len(kept[0]):
            self.put(caches, kept, at, r.groups[self.group].slot)

    def put(self, caches, kept: list, at: int, slot: int):
        """Each layer's kept state after token `at` of the step into `slot`."""
        for i, states in zip(self.layers, kept):
            for t, s in zip(caches[i], states[at]):
                t[slot].copy_(s)

    def copy(self, caches, pairs: list[tuple[int, int]]):
        for src, dst in pairs:
            for i in self.layers:
                for t in caches[i]:
                    t[dst].copy_(t[src])


class SharedBuilder(RecurrentBuilder):
    """The kv_shared group (Gemma 4): no metadata of its own, its layers read their source groups' (by kind)."""
    kind, part = "kv_shared", SharedGroupStep

    def build(self, plan, batch, dev, spans):
        return None

    def before(self, plan, caches):
        """Nothing: it keeps no state."""

    def after(self, plan, caches):
        """Nothing: it keeps no state."""

    def accepted(self, r, num_accepted: int, caches):
        """Nothing: it keeps no state."""


BUILDERS = {cls.kind: cls for cls in (FullAttentionBuilder, SlidingWindowBuilder, RecurrentBuilder, SharedBuilder)}


def group_builders(specs: list, num_layers: int, block_size: int, attention) -> list:
    """The builders of a decoder's groups, in group-id order (specs: its layer_specs; none for a plain model: one
    full-attention group over every layer)."""
    if not specs:
        return [FullAttentionBuilder(0, list(range(num_layers)), None, block_size, attention)]
    return [BUILDERS[kind](g, layers, specs[layers[0]], block_size, attention)
            for g, (kind, layers) in enumerate(group_layers(specs).items())]


def step_metadata(builders: list, plan, batch, dev, grouped: bool):
    """Each group's metadata for this plan, by kind (grouped: a hybrid decoder), else the one group's."""
    spans = [list(r.spans) for r in plan] if any(r.spans for r in plan) else None
    if not grouped:
        return builders[0].build(plan, batch, dev, spans)
    return {b.kind: b.build(plan, batch, dev, spans) for b in builders}
