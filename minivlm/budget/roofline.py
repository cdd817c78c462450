"""The roofline's numerator: what one engine step must read and compute, from the VRAM calculator's own counts.

A step streams every decoder weight once (whatever its batch), the LM head once, each request's context K/V (full
layers: every token; sliding layers: at most the window), and each recurrent layer's state (read and written back
whole); it computes 2 FLOPs per weight per row plus attention's 4 · heads · head_dim per query per key it sees. The
bytes come from the same functions as estimate() (params.text_params, weights.linear_bytes, kv_groups.layer_groups,
activations.vision_peak), so the roofline and the VRAM calculator cannot disagree:

    decoder weights = the calculator's LLM weights less the embedding table (and an untied head): the layers and
                      the final norm (int8 / int4: the Linear weights quantized, the rest bfloat16, as weight_bytes)
    LM head         = vocab × hidden (a tied head is the embedding table, read whole as the head)
    KV reads        = Σ requests Σ attention groups: tokens it attends to × group.bytes_per_token
    recurrent state = Σ requests: 2 × one slot (group.bytes_per_slot): read, then written back
    time bound      = max(bytes / bandwidth, FLOPs / FLOP rate)   (machine.py measures both)

Writes of the step's new K/V rows and the activations of a decode step (a few rows of hidden width) are left out:
next to the weights they are a rounding error. Per image: the tower's weights once and its activation peak
(activations.vision_peak), and 2 FLOPs per tower weight per patch plus attention over the patches."""
from dataclasses import dataclass, field

from minivlm.budget.activations import tiled_vision_peak, vision_peak
from minivlm.budget.kv_groups import STATE_DTYPE, layer_groups
from minivlm.budget.params import text_params, vision_params
from minivlm.budget.shapes import hf_config, model_shape
from minivlm.budget.vision_tokens import image_plan
from minivlm.budget.weights import DTYPE_BYTES, QUANTIZED, dtype_name, weight_bytes

PARTS = ("decoder weights", "LM head", "embedding rows", "KV reads", "recurrent state")
IMAGE_PARTS = ("vision weights", "vision activations")


@dataclass(frozen=True)
class StepCost:
    """One step's traffic and work: bytes by part (PARTS or IMAGE_PARTS), FLOPs, and what it ran."""
    parts: dict[str, int]
    flops: int
    requests: int = 0
    tokens: int = 0       # tokens computed (a decode: one per request)
    context: int = 0      # tokens whose K/V were read, summed over requests (all groups see the same tokens)
    notes: dict = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.parts.values())

    @property
    def intensity(self) -> float:
        """FLOPs per byte read: the roofline's x axis."""
        return self.flops / self.bytes if self.bytes else 0.0


@dataclass(frozen=True)
class ModelCosts:
    """A model's per-step constants for one dtype: weight bytes by part, FLOPs per row, the KV groups."""
    decoder: int
    lm_head: int
    embedding_table: int   # bytes of the table (only its rows are read; read whole as the head when tied)
    vision: int
    row_bytes: int         # one embedding row (a token's input)
    linear_params: int     # decoder parameters one row multiplies (every layer's; norms and biases a rounding error)
    head_params: int       # vocab × hidden
    heads: int
    head_dim: int
    groups: tuple          # kv_groups.GroupShape per cache kind
    kv_dtype: str
    tied: bool

    @property
    def text_bytes(self) -> int:
        """What estimate() calls text_weights_bytes: decoder, final norm, embeddings, and an untied head."""
        return self.decoder + self.embedding_table + (0 if self.tied else self.lm_head)


def model_costs(model_config, dtype="bfloat16", kv_dtype="auto", state_dtype=STATE_DTYPE) -> ModelCosts:
    """Weight bytes by part and the per-row constants, read off a config (preset name, checkpoint dir, dict)."""
    cfg = hf_config(model_config)
    s = model_shape(cfg)
    dtype = dtype_name(dtype)
    act = "bfloat16" if dtype in QUANTIZED else dtype  # as estimate(): int weights compute in bfloat16
    kv_dtype = act if kv_dtype == "auto" else dtype_name(kv_dtype)
    counts = text_params(s)
    plain = 2 if dtype in QUANTIZED else DTYPE_BYTES[dtype]  # what weight_bytes keeps unquantized: embeddings, head
    text, vision = weight_bytes(s, dtype)[:2]
    table = counts["embed_tokens"] * plain
    head = table if s.tied else counts["lm_head"] * plain
    decoder = text - table - (0 if s.tied else head)  # the layers and the final norm: the calculator's bytes
    return ModelCosts(decoder, head, table, vision, s.hidden * plain, counts["decoder_layers"], s.vocab * s.hidden,
                      s.heads, s.head_dim, tuple(layer_groups(cfg, 1, state_dtype)), kv_dtype, s.tied)


def step_cost(costs: ModelCosts, requests: list[tuple[int, int]], sampled: int | None = None) -> StepCost:
    """The cost of one step that computes, for each (cached, new) pair, `new` tokens after `cached` tokens whose
    K/V are already in the pool: a decode is (context − 1, 1), a prefill chunk (tokens before it, its length).
    sampled: rows that go through the LM head (default: one per request, as the engine computes only last rows)."""
    if not requests:
        raise ValueError("a step runs at least one request")
    for cached, new in requests:
        if cached < 0 or new < 1:
            raise ValueError(f"each request needs cached >= 0 and new >= 1 tokens, got ({cached}, {new})")
    sampled = len(requests) if sampled is None else sampled
    tokens = sum(new for _, new in requests)
    kv = state = attention = 0
    for g in costs.groups:
        for cached, new in requests:
            if g.kind == "recurrent":  # the state read, updated per token, written back
                state += 2 * g.bytes_per_slot(costs.kv_dtype)
                heads, dk, dv = g.state_shapes[1]
                attention += len(g.layers) * new * 8 * heads * dk * dv  # decay, read k, write, read q: dk×dv each
                continue
            seen = cached + new if g.window is None else min(cached + new, g.window - 1 + new)  # the union of windows
            kv += seen * g.bytes_per_token(costs.kv_dtype)
            # each group at its own head size (Gemma 4's full layers are wider)
            attention += len(g.layers) * 4 * costs.heads * g.head_dim * keys_seen(cached, new, g.window)
    flops = 2 * costs.linear_params * tokens + 2 * costs.head_params * sampled + attention
    parts = {"decoder weights": costs.decoder, "LM head": costs.lm_head if sampled else 0,  # a mid-prompt chunk: none
             "embedding rows": tokens * costs.row_bytes,
             "KV reads": kv, "recurrent state": state}
    return StepCost(parts, flops, len(requests), tokens, sum(c + n for c, n in requests))


def keys_seen(cached: int, new: int, window: int | None) -> int:
    """Keys the `new` queries attend to, summed: query i (1-based) sees cached + i keys, at most the window."""
    if window is None:
        return new * cached + new * (new + 1) // 2
    return sum(min(cached + i, window) for i in range(1, new + 1))


def decode_cost(costs: ModelCosts, batch: int, context: int) -> StepCost:
    """A decode step of `batch` requests, each `context` tokens long once this step's token is in."""
    if batch < 1 or context < 1:
        raise ValueError(f"a decode step needs batch >= 1 and context >= 1, got batch {batch}, context {context}")
    return step_cost(costs, [(context - 1, 1)] * batch)


def image_cost(model_config, dtype="bfloat16", width=448, height=448) -> StepCost:
    """One image through the vision tower: its weights once, its activation peak, and its FLOPs (2 per weight per
    patch, an upper bound where a merger sees fewer rows; attention over each tile's patches in every block)."""
    cfg = hf_config(model_config)
    s = model_shape(cfg)
    if not s.has_vision:
        raise ValueError(f"{s.family} is a text-only model: it has no vision tower")
    dtype = dtype_name(dtype)
    act = DTYPE_BYTES["bfloat16" if dtype in QUANTIZED else dtype]
    plan = image_plan(model_config, height, width, cfg=cfg, shape=s)
    if s.vision_kind in ("siglip", "internvit", "gemma3_siglip"):
        peak, _ = tiled_vision_peak(s, plan.tiles, plan.patches, act, False)
    else:
        peak, _ = vision_peak(s, plan.patches, act, False)
    per_tile = plan.patches // max(plan.tiles, 1)
    flops = 2 * sum(vision_params(s).values()) * plan.patches + \
        4 * s.vision_width * s.vision_depth * plan.tiles * per_tile ** 2
    return StepCost({"vision weights": weight_bytes(s, dtype)[1], "vision activations": peak}, flops,
                    1, plan.patches, notes={"patches": plan.patches, "tiles": plan.tiles, "resized": plan.resized})
