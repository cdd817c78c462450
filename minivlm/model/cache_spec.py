"""What each decoder layer keeps between steps (vLLM v1's KVCacheSpec): a decoder lists one CacheSpec per layer, and
the engine groups layers with the same spec into KV-cache groups, each with its own pool and its own table per
request (engine/kv_cache/coordinator.py):

    full_attention  paged K/V blocks for every token, as in every plain transformer
    sliding_window  paged K/V blocks, but a token only sees the `window` tokens before it: older blocks are freed
    recurrent       a fixed-size state per request (Gated DeltaNet: a conv state and a delta-rule state), in slots
    kv_shared       nothing: the layer attends over the K/V its `source` layer writes (Gemma 4's last
                    num_kv_shared_layers), in the source's blocks

A recurrent layer's forward gets StateMetadata: which state slot each sequence of the step reads and updates."""
from dataclasses import dataclass, field

import torch

KINDS = ("full_attention", "sliding_window", "recurrent", "kv_shared")


@dataclass(frozen=True)
class CacheSpec:
    kind: str                                     # one of KINDS
    window: int | None = None                     # sliding_window: tokens a query sees, itself included (HF's)
    kv_heads: int = 0                             # attention kinds: K/V per token per layer
    head_dim: int = 0
    state_shapes: tuple[tuple[int, ...], ...] = ()  # recurrent: one slot's tensors per layer (e.g. conv, delta rule)
    state_dtype: torch.dtype | None = None        # recurrent: None = the model's dtype
    source: int = -1                              # kv_shared: the layer whose K/V it reads

    @property
    def group_key(self) -> tuple:
        """Layers with equal keys share one group (one pool, one table per request)."""
        return (self.kind, self.window)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of one token in one layer (attention kinds)."""
        return 2 * self.kv_heads * self.head_dim * dtype.itemsize

    def bytes_per_slot(self, dtype: torch.dtype) -> int:
        """One request's state in one layer (recurrent)."""
        itemsize = (self.state_dtype or dtype).itemsize
        return sum(int(torch.Size(s).numel()) * itemsize for s in self.state_shapes)


def engine_specs(decoder, speculative_config=None) -> list[CacheSpec] | None:
    """The layers the engine keeps caches for (None: a plain decoder, one full-attention group over its layers): the
    decoder's own layer_specs, then its multi-token-prediction head's (mtp_specs) when speculation drafts with it
    (method "mtp"). Without that the head keeps no K/V, as in vLLM, where it exists only as that method's draft model."""
    specs = getattr(decoder, "layer_specs", None)
    if specs is None:
        return None
    drafting = getattr(speculative_config, "method", None) == "mtp" and getattr(decoder, "mtp", None) is not None
    return list(specs) + (list(getattr(decoder, "mtp_specs", ())) if drafting else [])


def group_layers(specs: list[CacheSpec]) -> dict[str, list[int]]:
    """Layer indices per KV-cache group, full attention first. Layers group by spec (kind and window); the engine
    keeps one pool per kind, so two sliding windows (or two recurrent state shapes) in one decoder are refused by name
    rather than merged under the first layer's spec."""
    layers: dict[str, list[int]] = {k: [] for k in KINDS}
    for i, spec in enumerate(specs):
        if spec.kind not in layers:
            raise ValueError(f"layer {i}: cache kind {spec.kind!r} is not one of {KINDS}")
        layers[spec.kind].append(i)
    for kind, idx in layers.items():
        keys = sorted({(specs[i].window or 0, specs[i].state_shapes) for i in idx})
        if len(keys) > 1:
            what = f"windows {sorted({specs[i].window for i in idx})}" if kind == "sliding_window" else "state shapes"
            raise ValueError(f"{kind} layers with different {what} (layers {idx}): this engine keeps one "
                             f"{kind} group; a decoder with two is not supported")
    return {k: idx for k, idx in layers.items() if idx}


@dataclass
class StateMetadata:
    """A recurrent group's part of a step: sequences in the batch's order, each with its state slot. The engine has
    already zeroed a slot whose sequence starts from nothing, or copied a saved checkpoint into it."""
    slots: torch.Tensor          # [B] state slot of each sequence, on device
    q_lens: list[int]            # tokens each sequence computes in this step (1 = a decode)
    is_prefill: bool             # some sequence computes more than one token
    drafts: list[int] = field(default_factory=list)  # per sequence: guessed tokens it verifies (0: none); its
    # layers keep the state after each of its tokens in `kept` (sequence index -> per layer, per token: the states)
    kept: dict = field(default_factory=dict)

    @property
    def slot_list(self) -> list[int]:
        return self.slots.tolist()
