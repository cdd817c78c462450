"""One metadata builder per KV-cache group kind (engine/kv_cache/coordinator.py explains the groups): what a step's
plan becomes for the layers of that group, and what the group's memory needs around the forward. A plain model has
one builder (full attention); a hybrid model one per group, and its decoder reads them by kind."""
from minivlm.model.attention import AttentionMetadata
from minivlm.model.cache_spec import StateMetadata, group_layers


class FullAttentionBuilder:
    """Every token's slot and each request's block table in the full-attention pool; image spans that attend both
    ways (Gemma 3) go with them."""
    kind = "full_attention"

    def __init__(self, layers: list[int], block_size: int, attention, window: int | None = None):
        self.layers, self.block_size, self.attention, self.window = layers, block_size, attention, window

    def build(self, plan, dev, spans):
        x = plan.inputs
        return AttentionMetadata.build(x.slot_mapping.to(dev), x.q_lens, x.ctx_lens, x.block_tables.to(dev),
                                       self.block_size, dev, self.attention, spans=spans)

    def before(self, plan, caches):
        """Nothing: a request's K/V are written by the forward itself."""

    def after(self, plan, caches):
        """Nothing: the written K/V are the cache."""


class SlidingWindowBuilder(FullAttentionBuilder):
    """The sliding-window pool's slots and tables (0 where a block left the window: the mask never reads it)."""
    kind = "sliding_window"

    def build(self, plan, dev, spans):
        x = plan.inputs
        return AttentionMetadata.build(x.sliding_slots.to(dev), x.q_lens, x.ctx_lens, x.sliding_tables.to(dev),
                                       self.block_size, dev, self.attention, window=self.window, spans=spans)


class RecurrentBuilder:
    """Each request's state slot; before the forward a slot starts from zeros (from token 0) or from the checkpoint
    its prefix hit resumes, after it the states a plan saves are copied into their checkpoint slots."""
    kind = "recurrent"

    def __init__(self, layers: list[int]):
        self.layers = layers

    def build(self, plan, dev, spans):
        x = plan.inputs
        return StateMetadata(x.state_slots.to(dev), x.q_lens, max(x.q_lens) > 1)

    def before(self, plan, caches):
        for r in plan:
            if r.state_slot < 0:
                continue
            if r.start == 0:
                for i in self.layers:
                    for t in caches[i]:
                        t[r.state_slot].zero_()
            elif r.restore_from >= 0:
                self.copy(caches, [(r.restore_from, r.state_slot)])

    def after(self, plan, caches):
        self.copy(caches, [(r.state_slot, r.save_to) for r in plan if r.save_to >= 0])  # checkpoints

    def copy(self, caches, pairs: list[tuple[int, int]]):
        for src, dst in pairs:
            for i in self.layers:
                for t in caches[i]:
                    t[dst].copy_(t[src])


def group_builders(specs: list, num_layers: int, block_size: int, attention) -> list:
    """The builders of a decoder's groups (specs: its layer_specs; none for a plain model: one full group)."""
    if not specs:
        return [FullAttentionBuilder(list(range(num_layers)), block_size, attention)]
    out = []
    for kind, layers in group_layers(specs).items():
        if kind == "recurrent":
            out.append(RecurrentBuilder(layers))
        else:
            cls = SlidingWindowBuilder if kind == "sliding_window" else FullAttentionBuilder
            out.append(cls(layers, block_size, attention, specs[layers[0]].window))
    return out


def step_metadata(builders: list, plan, dev, grouped: bool):
    """Each group's metadata for this plan, by kind (grouped: a hybrid decoder), else the one group's."""
    spans = [list(r.spans) for r in plan] if any(r.spans for r in plan) else None
    metas = {b.kind: b.build(plan, dev, spans) for b in builders}
    return metas if grouped else metas["full_attention"]
