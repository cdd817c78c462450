"""Gemma 4's text decoder over paged KV (transformers' Gemma4TextModel as Gemma4ForConditionalGeneration runs it).
What it adds to Gemma 3's sliding / full hybrid:

- KV-shared layers: the last num_kv_shared_layers compute no K/V; each attends over the K/V of the last earlier layer
  of its own type (its source), read from the source's blocks with the source's metadata. They keep nothing between
  steps (CacheSpec kind "kv_shared", naming the source). The checkpoints' k_proj / v_proj / k_norm of these layers
  are dropped at load, as transformers drops them.
- Sliding and full layers with their own head size (head_dim, global_head_dim) and RoPE (proportional on the full
  layers: only a fraction of the angles rotate), both from transformers' per-layer config.
- Per-layer embeddings: a second table over the vocabulary, num_layers x hidden_size_per_layer_input wide, mixed with
  a projection of the input embeddings and fed to every layer through a gate; image positions read the pad token's row.
  The ids come in as the forward's input_ids (every family's forward takes them; this one reads them).
- Double-wide MLPs on the shared layers where use_double_wide_mlp says, and a final logit softcap.
Gemma 4 12B (gemma4_unified) runs this decoder too: no per-layer embeddings, and its images (under
use_bidirectional_attention="vision") see each other both ways on every layer, as HF's Gemma4UnifiedModel.forward
masks them. One layer (norms, attention, MLP, per-layer gate, scalar) is gemma4_layers.py; this file stacks them."""
import torch
from torch import nn

from minivlm.model.attention import AttentionMetadata
from minivlm.model.cache_spec import CacheSpec
from minivlm.model.decoder import load_strictly
from minivlm.model.gemma3 import ScaledEmbedding
from minivlm.model.gemma4_layers import Gemma4Layer, ScaleNorm

SPEC_KIND = {"sliding_attention": "sliding_window", "full_attention": "full_attention"}  # HF's layer type -> ours
ROPE_TYPES = ("default", "proportional")
SHARED_KEYS = ("k_proj", "v_proj", "k_norm", "v_norm")  # what a shared layer's checkpoint carries and nobody reads


def shared_sources(cfg) -> list[int]:
    """Each layer's K/V source: itself, or (a shared layer) the last earlier non-shared layer of its type."""
    first_shared = cfg.num_hidden_layers - cfg.num_kv_shared_layers
    types = cfg.layer_types[:cfg.num_hidden_layers]
    out = []
    for i, t in enumerate(types):
        if i < first_shared:
            out.append(i)
            continue
        earlier = [j for j in range(first_shared) if types[j] == t]
        if not earlier:
            raise ValueError(f"Gemma 4 text config: shared layer {i} ({t}) has no earlier {t} layer to read K/V from")
        out.append(earlier[-1])
    return out


def check_config(cfg):
    """Refuse, naming the setting, what this decoder would compute differently from transformers' Gemma 4."""
    why = []
    if getattr(cfg, "enable_moe_block", False) or getattr(cfg, "num_experts", None):  # gemma4_unified has neither
        why.append(f"enable_moe_block={cfg.enable_moe_block}, num_experts={cfg.num_experts} (a mixture-of-experts "
                   f"block, e.g. Gemma 4 26B-A4B: minivlm builds dense MLPs only)")
    if cfg.hidden_activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        why.append(f"hidden_activation={cfg.hidden_activation!r} (only GeLU-tanh)")
    if cfg.use_bidirectional_attention == "all":
        why.append("use_bidirectional_attention='all' (no causal decoder)")
    unknown = set(cfg.layer_types) - set(SPEC_KIND)
    if unknown:
        why.append(f"layer_types {sorted(unknown)} (only sliding_attention and full_attention)")
    for kind in set(cfg.layer_types) & set(SPEC_KIND):
        rope_type = (cfg.rope_parameters.get(kind) or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            why.append(f"{kind} rope_type={rope_type!r} (only {' and '.join(ROPE_TYPES)})")
    if why:
        raise ValueError(f"Gemma 4 text config not supported: {'; '.join(why)}")


class Gemma4Decoder(nn.Module):
    """Gemma 4's text decoder on flattened tokens; forward takes one metadata per cache kind."""

    def __init__(self, model_type: str, text_cfg, tie_word_embeddings: bool):
        super().__init__()
        check_config(text_cfg)
        cfg = self.cfg = text_cfg
        n = cfg.num_hidden_layers
        self.sources = shared_sources(cfg)
        self.types = list(cfg.layer_types[:n])
        self.kinds = [SPEC_KIND[t] for t in self.types]
        self.bidirectional_images = cfg.use_bidirectional_attention == "vision"
        # gemma4: both ways on sliding layers only; gemma4_unified (HF's forward): on every layer
        self.causal_full_layers = model_type != "gemma4_unified"
        self.spans_past_window = self.bidirectional_images and not self.causal_full_layers  # a hit never ends inside
        self.model_type = model_type
        self.layer_specs = [self.spec(i) for i in range(n)]
        self.embed_tokens = PlaceholdersAsPad(cfg.vocab_size, cfg.hidden_size, cfg.pad_token_id)
        self.ple = getattr(cfg, "hidden_size_per_layer_input", 0)  # gemma4_unified has no per-layer embeddings
        if self.ple:
            self.embed_tokens_per_layer = ScaledEmbedding(cfg.vocab_size_per_layer_input, n * self.ple)
            self.embed_tokens_per_layer.scale = self.ple ** 0.5
            self.per_layer_model_projection = nn.Linear(cfg.hidden_size, n * self.ple, bias=False)
            self.per_layer_projection_norm = ScaleNorm(self.ple, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(Gemma4Layer(cfg, i, self.sources[i] != i) for i in range(n))
        self.norm = ScaleNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.pad_id = cfg.pad_token_id
        self.inv_freq = {}

    @property
    def placeholder_ids(self) -> tuple[int, ...]:
        """The image / video / audio token ids (set by the loader from the config): they embed as the pad token."""
        return self.embed_tokens.placeholder_ids

    @placeholder_ids.setter
    def placeholder_ids(self, ids):
        self.embed_tokens.placeholder_ids = tuple(ids)

    def spec(self, i: int) -> CacheSpec:
        """Layer i's CacheSpec: its own K/V (sliding or full, with its type's head size), or none (shared)."""
        lc, kind = self.cfg.per_layer_config[i], self.kinds[i]
        if self.sources[i] != i:
            return CacheSpec("kv_shared", source=self.sources[i])
        window = self.cfg.sliding_window if kind == "sliding_window" else None
        return CacheSpec(kind, window=window, kv_heads=lc.num_key_value_heads, head_dim=lc.head_dim)

    def load_weights(self, state: dict, tied: bool, device, dtype):
        """Drop the shared layers' unread K/V weights, fuse q/k/v and gate/up, load strictly, make both RoPEs."""
        state = dict(state)
        for i, src in enumerate(self.sources):
            if src != i:
                for name in SHARED_KEYS:
                    for part in ("weight", "bias"):
                        state.pop(f"layers.{i}.self_attn.{name}.{part}", None)
        load_strictly(self, fuse(state), tied, device, dtype)
        rotary = rotary_class(self.model_type)(self.cfg)  # transformers' own inverse frequencies per layer type
        self.inv_freq = {t: getattr(rotary, f"{t}_inv_freq").to(device) for t in set(self.types)}
        self.rope_scale = {t: getattr(rotary, f"{t}_attention_scaling") for t in set(self.types)}

    def rope(self, layer_type: str, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, head_dim of that type] at 1-D positions [T] (HF's fp32 product)."""
        freqs = positions[:, None].float() * self.inv_freq[layer_type]
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = self.rope_scale[layer_type]
        return (emb.cos() * scale).to(dtype)[:, None], (emb.sin() * scale).to(dtype)[:, None]

    def per_layer_inputs(self, ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[T, layers, ple]: the token's own row (the pad token's at image positions) and a projection of the
        input embeddings (image rows included), each normed or scaled as HF does, averaged by 1/sqrt(2)."""
        n = len(self.layers)
        token = torch.where(torch.isin(ids, torch.tensor(self.placeholder_ids, device=ids.device)), self.pad_id, ids)
        own = self.embed_tokens_per_layer(token).reshape(-1, n, self.ple)
        proj = self.per_layer_model_projection(embeds) * self.cfg.hidden_size ** -0.5
        proj = self.per_layer_projection_norm(proj.reshape(-1, n, self.ple))
        return (proj + own) * 2.0 ** -0.5

    def forward(self, embeds, positions, kv_caches, metas: dict, deepstack=None,
                last: torch.Tensor | None = None, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """embeds [T, hidden] from embed_tokens (image rows written in), positions [3, T] (1-D: three equal rows),
        metas {cache kind: AttentionMetadata}, input_ids [T] the step's token ids (the per-layer embeddings read
        them). Returns the final hidden states, or with `last` the softcapped logits of those rows."""
        if deepstack is not None:
            raise ValueError("Gemma 4 has no deepstack features")
        if self.ple and (input_ids is None or input_ids.shape[0] != embeds.shape[0]):
            raise ValueError("Gemma 4's per-layer embeddings read the step's token ids: pass input_ids, one per "
                             "row of embeds")
        ple = self.per_layer_inputs(input_ids, embeds) if self.ple else None
        ropes = {t: self.rope(t, positions[0], embeds.dtype) for t in self.inv_freq}
        if self.bidirectional_images:
            metas = causal_full_layers(metas) if self.causal_full_layers else spans_past_window(metas)
        x, step_kv = embeds, {}
        for i, layer in enumerate(self.layers):
            src = self.sources[i]
            if src != i and last is not None and 0 < len(last) < x.shape[0] and sequences(metas) == len(last):
                # from the first shared layer on nothing is written: only the rows whose logits are asked go on
                x, ple, ropes = x[last], None if ple is None else ple[last], {t: (c[last], s[last])
                                                                              for t, (c, s) in ropes.items()}
                metas, step_kv = last_rows(metas, last), {j: (k[last], v[last]) for j, (k, v) in step_kv.items()}
                last = torch.arange(len(last), device=x.device)
            x, kv = layer(x, None if ple is None else ple[:, i], *ropes[self.types[i]], kv_caches[src],
                          metas[self.kinds[i]], step_kv.get(src))
            if kv is not None:
                step_kv[i] = kv
        x = self.norm(x)
        return x if last is None else self.compute_logits(x[last])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


class PlaceholdersAsPad(ScaledEmbedding):
    """Token embeddings in which the image / video / audio placeholder ids read the pad token's row, as HF's
    Gemma4Model / Gemma4UnifiedModel embed them: an image's rows are then overwritten by its embeddings, but a
    placeholder id the model generates (a random one does) keeps the pad's row."""

    def __init__(self, vocab: int, hidden: int, pad_id: int):
        super().__init__(vocab, hidden)
        self.pad_id, self.placeholder_ids = pad_id, ()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.placeholder_ids:
            ids = torch.where(torch.isin(ids, torch.tensor(self.placeholder_ids, device=ids.device)), self.pad_id, ids)
        return super().forward(ids)


def rotary_class(model_type: str) -> type:
    """transformers' rotary embedding of the model type (gemma4_unified's is its own class, the same algorithm)."""
    if model_type == "gemma4_unified":
        from transformers.models.gemma4_unified.modeling_gemma4_unified import Gemma4UnifiedTextRotaryEmbedding
        return Gemma4UnifiedTextRotaryEmbedding
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding
    return Gemma4TextRotaryEmbedding


def sequences(metas: dict) -> int:
    """How many sequences the step runs (one row each of `last` when it asks for one logit per sequence)."""
    return len(next(m for m in metas.values() if m is not None).q_lens)


def last_rows(metas: dict, last: torch.Tensor) -> dict:
    """Each attention group's metadata for one query per sequence, its last row, over the same blocks: a decode's
    (that row sees every earlier key, as it did in the whole chunk; it is never inside an image span's middle)."""
    out = {}
    for kind, m in metas.items():
        out[kind] = None if m is None else AttentionMetadata.build(
            m.slot_mapping[last], [1] * len(last), m.ctx_lens, m.block_tables, m.block_size, m.ctx_lens_t.device,
            m.attention, window=m.window)
    return out


def causal_full_layers(metas: dict) -> dict:
    """use_bidirectional_attention='vision': images see each other both ways on the sliding layers only; the full
    layers stay causal (HF's create_masks_for_vision_model), so their metadata drops the spans."""
    import dataclasses
    full = metas.get("full_attention")
    if full is None or full.spans is None:
        return metas
    parts = [(rows, dataclasses.replace(p, spans=None)) for rows, p in full.parts] if full.parts else full.parts
    return {**metas, "full_attention": dataclasses.replace(full, spans=None, parts=parts)}


def spans_past_window(metas: dict) -> dict:
    """gemma4_unified under use_bidirectional_attention='vision': HF's forward ORs the same-image mask onto every
    layer's causal one, the sliding layers' included, so an image's tokens see each other whole, past the window."""
    import dataclasses
    sliding = metas.get("sliding_window")
    if sliding is None or sliding.spans is None:
        return metas
    parts = [(rows, dataclasses.replace(p, spans_past_window=True)) for rows, p in sliding.parts] \
        if sliding.parts else sliding.parts
    return {**metas, "sliding_window": dataclasses.replace(sliding, spans_past_window=True, parts=parts)}


def fuse(state: dict) -> dict:
    """Each layer's q/k/v that it has (a shared layer only q; attention_k_eq_v no v) as one qkv_proj, gate/up as one
    gate_up_proj, in that order."""
    state = dict(state)
    for key in [k for k in state if ".self_attn.q_proj." in k]:
        parts = [key.replace(".q_proj.", f".{p}.") for p in ("q_proj", "k_proj", "v_proj")]
        state[key.replace(".q_proj.", ".qkv_proj.")] = torch.cat([state.pop(p) for p in parts if p in state])
    for key in [k for k in state if ".mlp.gate_proj." in k]:
        up = key.replace(".gate_proj.", ".up_proj.")
        state[key.replace(".gate_proj.", ".gate_up_proj.")] = torch.cat([state.pop(key), state.pop(up)])
    return state
