"""The KV side of estimate() for a hybrid model (Qwen3.5, Gemma 3, Gemma 4): the engine's pools from the usable
memory (kv_groups.size_groups), one breakdown row per group (Gemma 4's shared-KV layers: a free row saying what their
own K/V would cost), and how many requests of the workload fit at once, against a model of the same dimensions whose
every layer were full attention.

Requests at once (a hybrid model's memory per request of T tokens, checkpoints included):

    per request = ceil(T / block_size) full blocks + min(ceil(T / block_size), window blocks) sliding blocks
                  + its state slot (and, by default, its 2 checkpoint slots)
    at once     = (usable − fixed checkpoints) // per request        (fixed: state_checkpoints when given)
    all full    = usable // (ceil(T / block_size) · block_size · bytes per token if every layer kept every token)
                  (each attention layer at its own heads and head_dim, a recurrent layer at the full layers' size;
                  Gemma 4's shared layers keep nothing either way)
"""
from dataclasses import dataclass

from minivlm.budget.kv_groups import SHARED, GroupShape, GroupSizes, size_groups, sliding_blocks, window_blocks
from minivlm.budget.weights import DTYPE_BYTES


@dataclass(frozen=True)
class HybridKV:
    sizes: GroupSizes
    kv_bytes_per_token: int          # the full-attention group's: the layers that keep every token
    workload_concurrency: int        # requests of the workload's tokens the usable memory holds at once
    full_attention_concurrency: int  # the same if every layer were full attention
    rows: list[tuple[str, int, str]]  # (item, bytes, formula) per group


def request_bytes(groups: list[GroupShape], dtype: str, tokens: int, block_size: int, chunk: int) -> int:
    """KV bytes one request of `tokens` holds in the attention groups."""
    blocks = -(-tokens // block_size)
    return sum(block_size * g.bytes_per_token(dtype) *
               (sliding_blocks(tokens, g.window, chunk, block_size) if g.kind == "sliding_window" else blocks)
               for g in groups if g.kind not in ("recurrent", SHARED))


def hybrid_kv(groups: list[GroupShape], kv_dtype: str, usable: int, block_size: int, num_seqs: int,
              step_tokens: int, chunked: bool, max_model_len: int, request_tokens: int,
              state_checkpoints: int | None, split_note: str = "", mtp_layers: int = 0) -> HybridKV:
    """Size the groups from the usable bytes and say what each costs (the module doc's rules); mtp_layers: of the
    full group's layers, the last ones are the MTP head's (speculative method mtp), said in its row."""
    sizes = size_groups(groups, kv_dtype, max(usable, 0), block_size, num_seqs, step_tokens, chunked, max_model_len,
                        state_checkpoints)
    chunk = step_tokens if chunked else max_model_len
    recurrent = sizes.group("recurrent")
    slot = recurrent.shape.bytes_per_slot(kv_dtype) if recurrent else 0
    fixed, slots_each = (0, 3) if state_checkpoints is None else (state_checkpoints, 1)
    per_request = request_bytes(groups, kv_dtype, request_tokens, block_size, chunk) + slots_each * slot
    at_once = max(0, (usable - fixed * slot) // per_request) if per_request else 0
    attention = next(g for g in groups if g.kind not in ("recurrent", SHARED))
    recurrent_layers = sum(len(g.layers) for g in groups if g.kind == "recurrent")
    full_token = sum(g.bytes_per_token(kv_dtype) for g in groups if g.kind not in ("recurrent", SHARED)) + \
        2 * recurrent_layers * attention.kv_heads * attention.head_dim * DTYPE_BYTES[kv_dtype]
    all_full = max(0, usable // (-(-request_tokens // block_size) * block_size * full_token))
    full = sizes.group("full_attention")
    per_token = full.shape.bytes_per_token(kv_dtype) if full else 0
    return HybridKV(sizes, per_token, at_once, all_full,
                    [group_row(g, kv_dtype, sizes, num_seqs, chunk, split_note, mtp_layers) for g in sizes.groups])


def group_row(size, kv_dtype: str, sizes: GroupSizes, num_seqs: int, chunk: int, split_note: str,
              mtp_layers: int = 0) -> tuple:
    """One breakdown row: what the group holds and why that many."""
    g, bs, b = size.shape, sizes.block_size, DTYPE_BYTES[kv_dtype]
    per_token = (f"{g.bytes_per_token(kv_dtype):,} B/token (2 · {len(g.layers)} layers · {g.kv_heads} kv heads · "
                 f"{g.head_dim} head_dim · {b} B {kv_dtype}{split_note})")
    if g.kind == SHARED:  # what the layers would keep if each had its own K/V: its source's bytes per token
        owner = {i: o.shape for o in sizes.groups for i in o.shape.layers if o.shape.kind != SHARED}
        saved = sum(owner[j].bytes_per_token(kv_dtype) // len(owner[j].layers) for j in g.sources if j in owner)
        reads = ", ".join(f"{source}" for source in sorted(set(g.sources)))
        return ("KV cache: shared-KV layers (free)", 0,
                f"{len(g.layers)} layers ({g.layers[0]}–{g.layers[-1]}) read the K/V of layers {reads} (the last "
                f"earlier layer of their type) from those layers' blocks: 0 blocks, 0 B; their own K/V would cost "
                f"{saved:,} B/token more")
    if g.kind == "full_attention":
        head = f"; the last {mtp_layers} the MTP head's (speculative method mtp)" if mtp_layers else ""
        return ("KV cache: full-attention layers", size.bytes,
                f"{size.blocks:,} blocks × {bs} tokens × {per_token}{head}")
    if g.kind == "sliding_window":
        most = window_blocks(g.window, chunk, bs)
        return ("KV cache: sliding-window layers", size.bytes,
                f"{size.blocks:,} blocks × {bs} tokens × {per_token}; a request holds at most {most} blocks "
                f"(window {g.window:,} − 1 + a {chunk:,}-token chunk, rounded up, + 1), × {num_seqs} requests = "
                f"{num_seqs * most:,}, and never more than the full-attention blocks")
    names = ("conv", "delta rule") if len(g.state_shapes) == 2 else ("state",) * len(g.state_shapes)
    tensors = " + ".join(f"{name} {'×'.join(map(str, shape))} · {DTYPE_BYTES[dtype or kv_dtype]} B {dtype or kv_dtype}"
                         for name, shape, dtype in zip(names, g.state_shapes, g.state_dtypes))
    return ("Recurrent state (slots)", size.bytes,
            f"{size.slots} slots ({num_seqs} running + {sizes.checkpoints} checkpoints) × "
            f"{g.bytes_per_slot(kv_dtype):,} B ({len(g.layers)} layers × ({tensors})); the same for every request, "
            f"whatever its length; the checkpoints, prefix caching's cost: {sizes.checkpoint_bytes:,} B")
