"""Qwen3.5's hybrid text decoder over the engine's caches: per four layers, three Gated DeltaNet layers (linear
attention: a causal depthwise conv, then the gated delta rule, with a fixed-size state per sequence in a state slot)
and one gated full-attention layer (over the paged K/V pool, partial-rotary interleaved M-RoPE, q/k RMSNorm, output
times sigmoid(gate)). The arithmetic is transformers' modeling_qwen3_5.py: its norms (zero-centred: x * (1 + w)),
its conv, and its own torch delta-rule functions, started from the slot's state so that a chunked prefill, a prefill
resumed from a copied state and a decode continue exactly where the last step stopped."""
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3_5.modeling_qwen3_5 import (torch_chunk_gated_delta_rule,
                                                          torch_recurrent_gated_delta_rule)

from minivlm.model.attention import AttentionMetadata
from minivlm.model.cache_spec import CacheSpec, StateMetadata
from minivlm.model.decoder import MLP, OffsetRMSNorm, fuse_projections, load_strictly
from minivlm.model.delta_rule_steps import gated_delta_steps
from minivlm.model.qwen3_5_mtp import Qwen3_5MTP, mtp_layers
from minivlm.model.rope import MRotaryEmbedding, rotate_partially

IGNORED = re.compile(r"^mtp\.")  # the multi-token-prediction head: skipped unless speculation drafts with it
STATE_DTYPE = torch.float32  # the delta rule returns an fp32 state (HF's cache keeps it so); conv inputs fit exactly
# the DeltaNet's four input projections, run as one matrix product (split back in this order)
IN_PROJ = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")


class GatedRMSNorm(nn.Module):
    """The DeltaNet's output norm: RMSNorm per value head (plain weight), times silu(z)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        normed = self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)
        return (normed * F.silu(gate.float())).to(x.dtype)


class GatedAttention(nn.Module):
    """Full attention whose q_proj also yields a per-channel output gate; rotary on the first rotary_dim channels."""

    def __init__(self, cfg):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = bool(cfg.attention_bias)
        # q_proj's rows are [query, gate] per head; k and v follow: fused into one matrix at load
        self.qkv_proj = nn.Linear(cfg.hidden_size, (2 * self.heads + 2 * self.kv_heads) * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = OffsetRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata):
        T, h, kv, d = x.shape[0], self.heads, self.kv_heads, self.head_dim
        qg, k, v = self.qkv_proj(x).split([2 * h * d, kv * d, kv * d], dim=-1)
        q, gate = qg.view(T, h, 2 * d).chunk(2, dim=-1)
        q, k = rotate_partially(self.q_norm(q), cos, sin), rotate_partially(self.k_norm(k.view(T, kv, d)), cos, sin)
        o = meta.attention(q, k, v.view(T, kv, d), kv_cache[0], kv_cache[1], meta, d ** -0.5)
        return self.o_proj(o.reshape(T, -1) * torch.sigmoid(gate.reshape(T, -1)))


@dataclass
class StateRows:
    """A step's recurrent sequences as rows of the batch, made once per step for every DeltaNet layer (no host sync:
    slots stay on device): the one-token sequences batched, then each longer chunk with its slot, then each sequence
    that verifies guesses (speculative decoding) with its slot and the list its states after each token go into."""
    decode_rows: torch.Tensor | None
    decode_slots: torch.Tensor | None
    prefills: list[tuple[slice, torch.Tensor]]
    verifies: list[tuple[slice, torch.Tensor, dict, int]] = ()

    @classmethod
    def of(cls, meta: StateMetadata) -> "StateRows":
        starts = [0]
        for n in meta.q_lens:
            starts.append(starts[-1] + n)
        drafts = meta.drafts or [0] * len(meta.q_lens)
        one = [i for i, n in enumerate(meta.q_lens) if n == 1]
        device = meta.slots.device
        decode_rows = torch.tensor([starts[i] for i in one], device=device) if one else None
        decode_slots = meta.slots[torch.tensor(one, device=device)] if one else None
        prefills = [(slice(starts[i], starts[i + 1]), meta.slots[i:i + 1])
                    for i, n in enumerate(meta.q_lens) if n > 1 and not drafts[i]]
        verifies = [(slice(starts[i], starts[i + 1]), meta.slots[i:i + 1], meta.kept, i)
                    for i, n in enumerate(meta.q_lens) if n > 1 and drafts[i]]
        return cls(decode_rows, decode_slots, prefills, verifies)


class GatedDeltaNet(nn.Module):
    """Linear attention with the gated delta rule. A sequence's state: the conv's last kernel-1 inputs
    [conv_dim, kernel-1] and the delta-rule state [v_heads, k_dim, v_dim], read from its slot and written back."""

    def __init__(self, cfg):
        super().__init__()
        self.k_heads, self.v_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.k_dim, self.v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_size, self.value_size = self.k_heads * self.k_dim, self.v_heads * self.v_dim
        self.conv_dim, self.kernel = 2 * self.key_size + self.value_size, cfg.linear_conv_kernel_dim
        self.splits = [self.conv_dim, self.value_size, self.v_heads, self.v_heads]  # IN_PROJ's outputs
        self.in_proj = nn.Linear(cfg.hidden_size, sum(self.splits), bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.v_heads))
        self.norm = GatedRMSNorm(self.v_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_size, cfg.hidden_size, bias=False)

    @property
    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        return (self.conv_dim, self.kernel - 1), (self.v_heads, self.k_dim, self.v_dim)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], rows: StateRows):
        qkv, z, b, a = self.in_proj(x).split(self.splits, dim=-1)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # log decay per token and value head
        out = torch.empty(x.shape[0], self.v_heads, self.v_dim, dtype=x.dtype, device=x.device)
        if rows.decode_rows is not None:  # decodes (and 1-token chunks): one batch over their slots, a token each
            r = rows.decode_rows
            out[r] = self.advance(qkv[r, None], g[r, None], beta[r, None], state, rows.decode_slots)[:, 0]
        for r, slot in rows.prefills:  # prefill chunks: one at a time, each from its own slot
            out[r] = self.advance(qkv[None, r], g[None, r], beta[None, r], state, slot)[0]
        for r, slot, kept, i in rows.verifies:  # guesses: token by token, as a decode, each state kept
            kept.setdefault(i, []).append(self.verify(qkv[r], g[r], beta[r], state, slot, out[r]))
        core = self.norm(out.reshape(-1, self.v_dim), z.reshape(-1, self.v_dim))
        return self.out_proj(core.reshape(x.shape[0], self.value_size))

    def verify(self, qkv, g, beta, state, slot: torch.Tensor, out: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """A speculating sequence's L tokens (its last one, then its guesses) with a decode's own arithmetic, token
        by token where it matters (so its accepted tokens are bit for bit those of decoding without guesses): the
        conv once over all L (each output column reads only its own window: the same numbers as L calls), the delta
        rule a token at a time (model/delta_rule_steps.py). out gets each token's output; returns the slot's (conv,
        delta-rule) state after each token but the last, from which the engine copies the one after the last
        accepted token back into the slot (engine/execution/group_metadata.py). The slot is left holding the state
        after all L (every guess accepted: nothing to copy)."""
        conv_state, rule_state = state
        L, keep = qkv.shape[0], self.kernel - 1
        seen = torch.cat((conv_state[slot].to(qkv.dtype), qkv.T[None]), dim=-1)  # [1, conv_dim, keep + L]
        convs = seen[0].to(conv_state.dtype)  # after token t the conv keeps columns t+1 .. t+keep
        conv_state[slot] = convs[None, :, L:]
        mixed = F.silu(F.conv1d(seen.to(self.conv1d.weight.dtype), self.conv1d.weight, groups=self.conv_dim))
        q, k, v = mixed[0].to(qkv.dtype).T.split([self.key_size, self.key_size, self.value_size], dim=-1)
        o, rules = gated_delta_steps(q.reshape(L, self.k_heads, self.k_dim), k.reshape(L, self.k_heads, self.k_dim),
                                     v.reshape(L, self.v_heads, self.v_dim), g, beta, rule_state[slot][0])
        out.copy_(o)
        rule_state[slot] = rules[-1][None].to(rule_state.dtype)
        return [(convs[:, t + 1:t + 1 + keep], rules[t]) for t in range(L - 1)]

    def advance(self, qkv, g, beta, state, slots: torch.Tensor) -> torch.Tensor:
        """B sequences of L tokens each ([B, L, ...]) from their slots' states: the conv, then the delta rule; the
        slots are left holding the states after the last token. Returns [B, L, v_heads, v_dim]."""
        conv_state, rule_state = state
        B, L = qkv.shape[:2]
        # the conv sees the kept inputs then the new ones: HF's causal_conv1d_update (its zero padding for a start)
        seen = torch.cat((conv_state[slots].to(qkv.dtype), qkv.transpose(1, 2)), dim=-1)  # [B, conv_dim, k-1+L]
        conv_state.index_copy_(0, slots, seen[..., seen.shape[-1] - (self.kernel - 1):].to(conv_state.dtype))
        mixed = F.silu(F.conv1d(seen.to(self.conv1d.weight.dtype), self.conv1d.weight, groups=self.conv_dim))
        q, k, v = mixed.to(qkv.dtype).transpose(1, 2).split([self.key_size, self.key_size, self.value_size], dim=-1)
        q, k = q.reshape(B, L, self.k_heads, self.k_dim), k.reshape(B, L, self.k_heads, self.k_dim)
        v = v.reshape(B, L, self.v_heads, self.v_dim)
        rule = torch_recurrent_gated_delta_rule if L == 1 else torch_chunk_gated_delta_rule  # HF's choice
        o, final = rule(q, k, v, g=g, beta=beta, initial_state=rule_state[slots], output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
        rule_state.index_copy_(0, slots, final.to(rule_state.dtype))
        return o


class HybridLayer(nn.Module):
    def __init__(self, cfg, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache, attention: AttentionMetadata, rows: StateRows):
        h = self.input_layernorm(x)
        if self.kind == "linear_attention":
            h = self.linear_attn(h, cache, rows)
        else:
            h = self.self_attn(h, cos, sin, cache, attention)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3_5Decoder(nn.Module):
    """Text decoder: embeddings -> hybrid layers -> norm -> lm_head, on flattened tokens; layer_specs says what each
    layer keeps between steps (the engine's KV-cache groups)."""

    def __init__(self, model_type: str, text_cfg, tie_word_embeddings: bool):
        super().__init__()
        if getattr(text_cfg, "hidden_act", "silu") != "silu":
            raise ValueError(f"Qwen3.5 with hidden_act={text_cfg.hidden_act!r} is not supported (only SiLU)")
        kinds = list(text_cfg.layer_types)[:text_cfg.num_hidden_layers]
        unknown = set(kinds) - {"linear_attention", "full_attention"}
        if unknown:
            raise ValueError(f"Qwen3.5 layer types {sorted(unknown)} are not supported")
        self.embed_tokens = nn.Embedding(text_cfg.vocab_size, text_cfg.hidden_size)
        self.layers = nn.ModuleList(HybridLayer(text_cfg, kind) for kind in kinds)
        self.norm = OffsetRMSNorm(text_cfg.hidden_size, text_cfg.rms_norm_eps)
        self.lm_head = nn.Linear(text_cfg.hidden_size, text_cfg.vocab_size, bias=False)
        if tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.layer_specs = [
            CacheSpec("recurrent", state_shapes=layer.linear_attn.state_shapes, state_dtype=STATE_DTYPE)
            if layer.kind == "linear_attention" else
            CacheSpec("full_attention", kv_heads=text_cfg.num_key_value_heads, head_dim=text_cfg.head_dim)
            for layer in self.layers]
        # the MTP head (speculative decoding's drafter), kept only when speculation drafts with it (drop_mtp): then
        # its layers' K/V join group 0, after the decoder's layers (model/cache_spec.py's engine_specs)
        self.mtp = Qwen3_5MTP(text_cfg, HybridLayer) if mtp_layers(text_cfg) else None
        self.mtp_specs = [CacheSpec("full_attention", kv_heads=text_cfg.num_key_value_heads,
                                    head_dim=text_cfg.head_dim)] * mtp_layers(text_cfg)
        self.hidden = None  # the last forward's final hidden states [T, hidden], kept only with an MTP head
        self.rope = None  # and its rotary tables (cos, sin [T, 1, rotary_dim]): the head's rows sit at its positions
        rope = text_cfg.rope_parameters
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type {rope.get('rope_type')!r} is not supported (only default M-RoPE)")
        rotary_dim = int(text_cfg.head_dim * rope.get("partial_rotary_factor", 1.0))
        # HF's Qwen3.5 rotary always interleaves t/h/w, with [11, 11, 10] when the config names no sections
        self.rope_args = (rotary_dim, rope["rope_theta"], list(rope.get("mrope_section", [11, 11, 10])), True)
        self.rotary = MRotaryEmbedding(*self.rope_args)

    def drop_mtp(self):
        """No head: speculation does not draft with it (vLLM loads it only as method "mtp"'s draft model), so it has
        no weights and no K/V; called before load_weights, while the head is still on the meta device."""
        self.mtp, self.mtp_specs = None, []

    def load_weights(self, state: dict, tied: bool, device, dtype):
        """Copy checkpoint tensors in (strictly, after fusing projections; the mtp.* head only when it is kept and the
        checkpoint has it), re-tie the embeddings, rebuild the rotary tables on device."""
        if self.mtp is not None and not any(IGNORED.match(k) for k in state):  # a config that names a head not saved
            self.drop_mtp()
        keep = self.mtp is not None
        state = fuse_in_proj(fuse_projections({k: v for k, v in state.items() if keep or not IGNORED.match(k)}))
        load_strictly(self, state, tied, device, dtype)
        self.rotary = MRotaryEmbedding(*self.rope_args).to(device)

    def forward(self, embeds, positions, kv_caches, metas: dict, deepstack=None,
                last: torch.Tensor | None = None, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """embeds [T, hidden], positions [3, T]; kv_caches[i]: layer i's (k_cache, v_cache) or (conv state, delta
        state) slots; metas: {"full_attention": AttentionMetadata, "recurrent": StateMetadata}; input_ids [T] (every
        family's forward takes them; Qwen3.5 reads only embeds). Returns the final
        hidden states [T, hidden], or with `last` (row indices [B]) the logits of those rows."""
        if deepstack is not None and deepstack[1]:
            raise ValueError("Qwen3.5 has no deepstack layers, but the step carries deepstack features")
        cos, sin = self.rotary(positions, embeds.dtype)
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        rows = StateRows.of(metas["recurrent"]) if "recurrent" in metas else None
        attention = metas.get("full_attention")
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv_caches[i], attention, rows)
        x = self.norm(x)
        if self.mtp is not None:
            self.hidden, self.rope = x, (cos, sin)  # the MTP head reads them after sampling (engine/spec_decode/mtp.py)
        return x if last is None else self.compute_logits(x[last])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def fuse_in_proj(state: dict) -> dict:
    """Each DeltaNet's four input projections concatenated along the output axis, in IN_PROJ's order."""
    state = dict(state)
    for key in [k for k in state if k.endswith(".linear_attn.in_proj_qkv.weight")]:
        names = [key.replace(".in_proj_qkv.", f".{p}.") for p in IN_PROJ]
        if all(n in state for n in names):
            state[key.replace(".in_proj_qkv.", ".in_proj.")] = torch.cat([state.pop(n) for n in names])
    return state
