"""KV-cache groups (vLLM v1's hybrid allocator): a decoder's layers grouped by what they keep between steps, and how
many blocks or state slots each group gets from one memory budget. The engine sizes its pools with size_groups and
the calculator shows the same numbers, so the two cannot disagree.

    full_attention  K/V of every token: per layer per token 2 · kv_heads · head_dim · bytes
    sliding_window  the same per token, but a running request holds at most its window plus the step's chunk
    recurrent       a fixed state per request per layer (Qwen3.5's Gated DeltaNet: a conv state and a delta-rule
                    state), in slots: one per running request plus the checkpoints the prefix cache may reuse
    kv_shared       nothing: Gemma 4's last num_kv_shared_layers read the K/V of the last earlier layer of their
                    type (sliding or full), from that layer's blocks; no blocks, no bytes

Gemma 4's sliding and full groups each have their own KV heads and head_dim (per_layer_config: head_dim on sliding
layers, global_head_dim on full ones). attention_k_eq_v (the full layers of the 12B / 26B / 31B) shares one
projection for keys and values, not the cache: K is normed and rotated, V normed only, so both are kept.

One budget B (bytes), f / s the bytes of one block of the full / sliding group, r one slot of the recurrent group:

    slots    = max_num_seqs + checkpoints            (checkpoints: state_checkpoints, default 2 · max_num_seqs;
               their bytes, checkpoints · r, are checkpoint_bytes: what prefix caching costs a recurrent model)
    cap      = max_num_seqs · (ceil((window − 1 + chunk) / block_size) + 1)   sliding blocks running requests hold
               (chunk: max_num_batched_tokens with chunked prefill, else max_model_len)
    N_full   = the largest n <= max_num_seqs · ceil(max_model_len / block_size) with n·f + min(n, cap)·s <= B − slots·r
               (one sliding group: (B − R)/(f + s) when that is <= cap, else (B − R − cap·s)/f, floored)
    N_slide  = min(N_full, cap): a request never holds more sliding blocks than full ones, so allocation never fails
"""
import math
from dataclasses import dataclass

from minivlm.budget.shapes import HYBRID, hf_config, model_shape
from minivlm.budget.tensor_parallel import kv_heads_per_gpu, split
from minivlm.budget.weights import DTYPE_BYTES, dtype_name

KIND_OF = {"full_attention": "full_attention", "sliding_attention": "sliding_window",
           "linear_attention": "recurrent"}  # HF's layer_types -> the cache kind (model/cache_spec.py's KINDS)
SHARED = "kv_shared"  # the kind of Gemma 4's layers that read another layer's K/V
ORDER = list(KIND_OF.values()) + [SHARED]  # groups in this order, full attention first


@dataclass(frozen=True)
class GroupShape:
    """Layers that keep the same thing: attention kinds per token (kv_heads, head_dim per GPU, the window), the
    recurrent kind per request (one slot's tensors per layer and their dtypes; None: the KV dtype)."""
    kind: str
    layers: tuple[int, ...]
    kv_heads: int = 0
    head_dim: int = 0
    window: int | None = None
    state_shapes: tuple[tuple[int, ...], ...] = ()
    state_dtypes: tuple[str | None, ...] = ()
    sources: tuple[int, ...] = ()  # kv_shared: the layer each one reads K/V from

    def bytes_per_token(self, dtype: str) -> int:
        """K and V of one token in every layer of the group."""
        return 2 * len(self.layers) * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype_name(dtype)]

    def bytes_per_slot(self, dtype: str) -> int:
        """One request's state in every layer of the group."""
        one = sum(math.prod(shape) * DTYPE_BYTES[dtype_name(kind or dtype)]
                  for shape, kind in zip(self.state_shapes, self.state_dtypes))
        return len(self.layers) * one


STATE_DTYPE = "float32"  # what the engine allocates: model/qwen3_5.py keeps both state tensors in float32


def layer_groups(model_config, tensor_parallel_size: int = 1, state_dtype: str = STATE_DTYPE,
                 mtp: bool = False) -> list[GroupShape]:
    """The decoder's layers grouped by kind, from a config (multimodal or text; a preset name or dir too). Qwen3.5's
    recurrent state per layer: a conv state of conv_dim × (kernel − 1) (the inputs the causal conv still needs; HF's
    cache keeps kernel columns) and a delta-rule state of value heads × key dim × value dim, split over the GPUs by
    heads. state_dtype: both tensors in it; default float32, as the engine's decoder allocates them (the delta rule
    returns a float32 state: HF's torch_chunk_gated_delta_rule computes in float32 and its cache keeps that).
    "auto": HF's own split, the conv state in the KV dtype and the delta-rule state in the config's mamba_ssm_dtype
    (else float32). Models that are not hybrid: one full_attention group with every layer (today's formula).
    Gemma 4: each attention group with its own heads and head_dim, and a kv_shared group of the layers that keep
    none. mtp: speculation drafts with Qwen3.5's multi-token-prediction head (method "mtp"): its mtp_num_hidden_layers
    full-attention layers join the full group, numbered after the decoder's, as the engine allocates them."""
    cfg = hf_config(model_config)
    s = model_shape(cfg)
    if s.layer_kv:
        return gemma4_groups(s, tensor_parallel_size)
    t = getattr(cfg, "text_config", None) or cfg
    heads, tp = kv_heads_per_gpu(t.num_key_value_heads or t.num_attention_heads, tensor_parallel_size), \
        tensor_parallel_size
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    types = list(t.layer_types) if cfg.model_type in HYBRID else ["full_attention"] * t.num_hidden_layers
    types = types[:t.num_hidden_layers] + ["full_attention"] * (s.mtp_layers if mtp else 0)
    unknown = sorted(set(types) - set(KIND_OF))
    if unknown:
        raise ValueError(f"layer types {unknown} are not a cache kind the budget knows; known: {sorted(KIND_OF)}")
    groups = []
    for layer_type, kind in KIND_OF.items():
        layers = tuple(i for i, name in enumerate(types) if name == layer_type)
        if not layers:
            continue
        if kind == "recurrent":
            groups.append(GroupShape(kind, layers, **recurrent_state(t, tp, state_dtype)))
        else:
            window = int(t.sliding_window) if kind == "sliding_window" else None
            groups.append(GroupShape(kind, layers, heads, head_dim, window))
    return groups


def kv_sources(s) -> tuple[int, ...]:
    """Each layer's K/V source: itself, or (a shared layer) the last earlier non-shared layer of its type."""
    first = s.layers - s.kv_shared_layers
    sources = []
    for i, kind in enumerate(s.kinds):
        earlier = [j for j in range(min(i, first)) if s.kinds[j] == kind]
        if i >= first and not earlier:
            raise ValueError(f"shared layer {i} ({kind}) has no earlier {kind} layer to read K/V from")
        sources.append(i if i < first else earlier[-1])
    return tuple(sources)


def gemma4_groups(s, tp: int) -> list[GroupShape]:
    """Gemma 4's groups: sliding and full layers that keep their own K/V, at their own (KV heads, head_dim) per GPU,
    and the shared layers (kv_shared: no bytes, each naming its source)."""
    sources, groups = kv_sources(s), []
    for layer_type, kind in KIND_OF.items():
        layers = tuple(i for i, name in enumerate(s.kinds) if name == layer_type and sources[i] == i)
        if layers:
            heads, head_dim = s.layer_kv[layers[0]]
            window = s.sliding_window if kind == "sliding_window" else None
            groups.append(GroupShape(kind, layers, kv_heads_per_gpu(heads, tp), head_dim, window))
    shared = tuple(i for i in range(s.layers) if sources[i] != i)
    if shared:
        groups.append(GroupShape(SHARED, shared, sources=tuple(sources[i] for i in shared)))
    return groups


def recurrent_state(t, tp: int, state_dtype: str) -> dict:
    """One Gated DeltaNet slot per layer on one GPU: conv state [conv_dim, kernel − 1], delta rule [v heads, dk, dv]."""
    k_heads, v_heads = split(t.linear_num_key_heads, tp), split(t.linear_num_value_heads, tp)
    conv_dim = 2 * k_heads * t.linear_key_head_dim + v_heads * t.linear_value_head_dim
    shapes = ((conv_dim, t.linear_conv_kernel_dim - 1), (v_heads, t.linear_key_head_dim, t.linear_value_head_dim))
    if state_dtype == "auto":
        dtypes = (None, dtype_name(getattr(t, "mamba_ssm_dtype", None) or "float32"))
    else:
        dtypes = (dtype_name(state_dtype),) * 2
    return dict(state_shapes=shapes, state_dtypes=dtypes)


def groups_from_specs(specs) -> list[GroupShape]:
    """The groups of a decoder's own layer_specs (model/cache_spec.py's CacheSpec, one per layer), so the engine can
    size its pools from what its decoder really allocates; the same groups layer_groups reads off the config."""
    by_key: dict[tuple, list[int]] = {}
    for i, spec in enumerate(specs):  # shared layers: one group whatever window their source slides over
        by_key.setdefault((spec.kind, None if spec.kind == SHARED else spec.window), []).append(i)
    groups = []
    for (kind, window), layers in by_key.items():
        spec = specs[layers[0]]
        if kind == SHARED:  # keeps nothing; names the layer each one reads
            sources = tuple(getattr(specs[i], "source", -1) for i in layers)
            groups.append(GroupShape(SHARED, tuple(layers), sources=sources))
            continue
        dtype = dtype_name(spec.state_dtype) if spec.state_dtype is not None else None
        groups.append(GroupShape(kind, tuple(layers), spec.kv_heads, spec.head_dim, window,
                                 tuple(tuple(s) for s in spec.state_shapes), (dtype,) * len(spec.state_shapes)))
    return sorted(groups, key=lambda g: ORDER.index(g.kind))


def is_hybrid(groups: list[GroupShape]) -> bool:
    """More than today's one full-attention group."""
    return [g.kind for g in groups] != ["full_attention"]


def window_blocks(window: int, chunk: int, block_size: int) -> int:
    """Sliding blocks a running request holds at most: the window − 1 tokens a chunk's first query sees, the chunk,
    and one more block the window's start may straddle."""
    return -(-(window - 1 + chunk) // block_size) + 1


def sliding_blocks(tokens: int, window: int, chunk: int, block_size: int) -> int:
    """Sliding blocks one request of `tokens` holds at most: window_blocks, never more than its whole length."""
    return min(-(-tokens // block_size), window_blocks(window, chunk, block_size))


@dataclass(frozen=True)
class GroupSize:
    """One group's allocation: blocks (attention kinds) or slots (recurrent), its bytes, and the most blocks one
    request of max_model_len tokens holds in it."""
    shape: GroupShape
    blocks: int
    slots: int
    bytes: int
    per_request_blocks: int = 0


@dataclass(frozen=True)
class GroupSizes:
    """The engine's pools for one budget: per group, and the figures vLLM reports for a hybrid model."""
    groups: tuple[GroupSize, ...]
    block_size: int
    max_model_len: int
    max_num_seqs: int
    checkpoints: int
    full_blocks: int       # N_full
    sliding_blocks: int    # N_slide (0 without a sliding group)
    slots: int             # recurrent state slots (0 without a recurrent group)
    total_bytes: int
    kv_tokens: int         # "KV cache size in tokens": the full group's N_full · block_size, as vLLM reports it
    max_concurrency: float  # requests of max_model_len at once: the least any group allows
    checkpoint_bytes: int = 0  # the recurrent group's checkpoint slots (checkpoints · one slot), within total_bytes

    def group(self, kind: str) -> GroupSize | None:
        return next((g for g in self.groups if g.shape.kind == kind), None)


def size_groups(groups: list[GroupShape], dtype: str, kv_budget_bytes: int | None, block_size: int, max_num_seqs: int,
                max_num_batched_tokens: int, enable_chunked_prefill: bool, max_model_len: int,
                state_checkpoints: int | None = None, num_blocks: int | None = None) -> GroupSizes:
    """Blocks per attention group and slots for the recurrent one (the module doc's rule); num_blocks fixes N_full
    instead of the budget."""
    chunk = max_num_batched_tokens if enable_chunked_prefill else max_model_len
    checkpoints = 2 * max_num_seqs if state_checkpoints is None else state_checkpoints
    by_kind = {g.kind: g for g in groups}
    sliding = [g for g in groups if g.kind == "sliding_window"]
    full = by_kind.get("full_attention")
    f = block_size * full.bytes_per_token(dtype) if full else 0
    caps = [max_num_seqs * window_blocks(g.window, chunk, block_size) for g in sliding]
    slot_bytes = by_kind["recurrent"].bytes_per_slot(dtype) if "recurrent" in by_kind else 0
    slots = max_num_seqs + checkpoints if slot_bytes else 0
    most = max_num_seqs * -(-max_model_len // block_size)  # what max_num_seqs requests could ever use

    def cost(n: int) -> int:
        return n * f + sum(min(n, cap) * block_size * g.bytes_per_token(dtype) for g, cap in zip(sliding, caps))

    if num_blocks is not None:
        n_full = num_blocks
    elif kv_budget_bytes is None:
        raise ValueError("size_groups needs kv_budget_bytes or num_blocks")
    else:
        room, lo, hi = kv_budget_bytes - slots * slot_bytes, 0, most
        while lo < hi:  # the largest n with cost(n) <= room (cost never decreases)
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if cost(mid) <= room else (lo, mid - 1)
        n_full = lo if room >= 0 else 0
        if n_full == 0:  # not one block beside the slots: nothing is allocated (the engine refuses to start)
            slots = 0
    per_request = -(-max_model_len // block_size)
    sized, concurrency = [], []
    for g in groups:
        if g.kind == SHARED:  # reads its sources' blocks: owns none
            sized.append(GroupSize(g, 0, 0, 0))
            continue
        if g.kind == "recurrent":
            sized.append(GroupSize(g, 0, slots, slots * g.bytes_per_slot(dtype)))
            concurrency.append(max_num_seqs if slots else 0)  # a running request needs its slot
            continue
        cap = caps[sliding.index(g)] if g.kind == "sliding_window" else n_full
        blocks, held = min(n_full, cap), per_request
        if g.kind == "sliding_window":
            held = sliding_blocks(max_model_len, g.window, chunk, block_size)
        sized.append(GroupSize(g, blocks, 0, blocks * block_size * g.bytes_per_token(dtype), held))
        concurrency.append(blocks / held if g.kind == "sliding_window" else blocks * block_size / max_model_len)
    n_slide = sum(g.blocks for g in sized if g.shape.kind == "sliding_window")
    return GroupSizes(tuple(sized), block_size, max_model_len, max_num_seqs, checkpoints if slots else 0, n_full,
                      n_slide, slots, sum(g.bytes for g in sized), n_full * block_size if full else 0,
                      min(concurrency) if concurrency else 0.0, checkpoints * slot_bytes if slots else 0)
