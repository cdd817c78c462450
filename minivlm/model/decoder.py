"""The text decoder over paged KV, one class for every family: Qwen2-VL / Qwen2.5-VL / Qwen2 (qkv bias),
Qwen3-VL / Qwen3 (q/k RMSNorm), Llama (SmolVLM); M-RoPE (chunked or interleaved) or 1-D RoPE, deepstack for
Qwen3-VL. What differs comes from families.py. It reads HF checkpoints as they are; q/k/v and gate/up are fused
into one matrix each at load. This is the reference path, in PyTorch ops: the engine's backend (model/backends/)
picks the attention every layer calls, and may replace parts of this loop with its own kernels (forward's hooks)."""
import torch
import torch.nn.functional as F
from torch import nn

from minivlm.families import decoder_facts, get_family
from minivlm.model.attention import AttentionMetadata
from minivlm.model.rope import MRotaryEmbedding, apply_rope

# checkpoint projections the engine runs as one matrix product each: fewer, larger ops per layer
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # HF's arithmetic in one fused op: x * rsqrt(mean(x²) + eps) * weight
            return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)
        # lower precision: normalise in fp32 like HF, then cast back before the weight
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


class OffsetRMSNorm(nn.Module):
    """RMSNorm whose weight is stored as an offset from 1 (Gemma 3, Qwen3.5): x * rsqrt(mean(x²) + eps) * (1 + weight),
    all in fp32, cast back at the end (HF's order)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (F.rms_norm(x.float(), x.shape[-1:], eps=self.eps) * (1.0 + self.weight.float())).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg, qk_norm: bool, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=o_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata):
        T, h, kv = x.shape[0], self.heads, self.kv_heads
        qkv = self.qkv_proj(x).view(T, h + 2 * kv, self.head_dim)
        qk, v = qkv[:, :h + kv], qkv[:, h + kv:]
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :h]), self.k_norm(qk[:, h:])), dim=1)
        qk = apply_rope(qk, cos, sin)  # q and k rotated together: one set of ops for both
        q, k = qk[:, :h], qk[:, h:]
        o = meta.attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.head_dim ** -0.5)  # the backend's
        return self.o_proj(o.reshape(T, -1))


class MLP(nn.Module):
    """The gated MLP: down(act(gate(x)) * up(x)), gate and up as one matrix product (SiLU; Gemma: GeLU-tanh)."""

    def __init__(self, cfg, act=F.silu):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = act

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, **attn_kwargs):
        super().__init__()
        self.self_attn = Attention(cfg, **attn_kwargs)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, meta):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Text decoder: embeddings -> layers (+ deepstack injections) -> norm -> lm_head, on flattened tokens."""

    def __init__(self, model_type: str, text_cfg, tie_word_embeddings: bool):
        super().__init__()
        family = get_family(model_type)
        if getattr(text_cfg, "head_dim", None) is None:
            text_cfg.head_dim = text_cfg.hidden_size // text_cfg.num_attention_heads
        if getattr(text_cfg, "hidden_act", "silu") != "silu" or getattr(text_cfg, "mlp_bias", False):
            raise ValueError(f"text decoder with hidden_act={text_cfg.hidden_act!r}, mlp_bias="
                             f"{getattr(text_cfg, 'mlp_bias', False)} is not supported (only SiLU-gated MLPs, no bias)")
        sliding = getattr(text_cfg, "use_sliding_window", False) or \
            "sliding_attention" in (getattr(text_cfg, "layer_types", None) or [])
        if sliding:  # every layer here attends to the whole context: a window would change the logits
            raise ValueError("sliding-window attention layers are not supported (every layer attends to the full "
                             "context in minivlm's paged attention)")
        facts = decoder_facts(getattr(text_cfg, "model_type", None) or model_type)
        bias = bool(getattr(text_cfg, "attention_bias", False))
        attn_kwargs = dict(qk_norm=facts.qk_norm, qkv_bias=bias if facts.qkv_bias is None else facts.qkv_bias,
                           o_bias=bias if facts.o_bias is None else facts.o_bias)
        self.embed_tokens = nn.Embedding(text_cfg.vocab_size, text_cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(text_cfg, **attn_kwargs) for _ in range(text_cfg.num_hidden_layers))
        self.norm = RMSNorm(text_cfg.hidden_size, text_cfg.rms_norm_eps)
        self.lm_head = nn.Linear(text_cfg.hidden_size, text_cfg.vocab_size, bias=False)
        if tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        rope = text_cfg.rope_parameters
        if rope.get("rope_type", "default") not in ("default", "mrope"):
            raise ValueError(f"rope_type {rope.get('rope_type')!r} is not supported (only default RoPE / M-RoPE)")
        half = text_cfg.head_dim // 2
        # 1-D RoPE is M-RoPE with every frequency on the first axis (all three axes carry the same position)
        sections = list(rope["mrope_section"]) if family.mrope else [half, 0, 0]
        self.rope_args = (text_cfg.head_dim, rope["rope_theta"], sections,
                          family.mrope and (family.interleaved_mrope or bool(rope.get("mrope_interleaved", False))))
        self.rotary = MRotaryEmbedding(*self.rope_args)

    def load_weights(self, state: dict, tied: bool, device, dtype):
        """Copy checkpoint tensors in (strictly, after fusing q/k/v and gate/up), re-tie the embeddings, rebuild the
        rotary tables on device."""
        load_strictly(self, fuse_projections(state), tied, device, dtype)
        self.rotary = MRotaryEmbedding(*self.rope_args).to(device)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, head_dim]: broadcast over heads, made once per step."""
        cos, sin = self.rotary(positions, dtype)
        return cos[:, None], sin[:, None]

    def forward(self, embeds, positions, kv_caches, meta: AttentionMetadata, deepstack=None,
                last: torch.Tensor | None = None, hooks=None, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """embeds [T, hidden], positions [3, T]; deepstack = (rows [N], [features [N, hidden] per layer]) or None;
        input_ids [T]: the step's token ids, which every family's forward takes (Gemma 4's per-layer embeddings read
        them; these layers need only embeds). Returns the final hidden states [T, hidden], or with `last` (row
        indices [B]) the logits of those rows.
        hooks: a model backend's (backends/base.py's Hooks): its whole_step runs the step in one call where it can
        (else None), its `layers` replace each layer's forward; this loop stays the one loop."""
        if hooks is not None and deepstack is None:
            out = hooks.whole_step(self, embeds, positions, kv_caches, meta, last)
            if out is not None:
                return out
        cos, sin = self.rope(positions, embeds.dtype)
        x = embeds
        for i, layer in enumerate(self.layers if hooks is None else hooks.layers):
            x = layer(x, cos, sin, kv_caches[i], meta)
            if deepstack is not None and i < len(deepstack[1]):
                x = x.index_add(0, deepstack[0], deepstack[1][i].to(x.dtype))  # ViT layer features at image tokens
        x = self.norm(x)
        return x if last is None else self.compute_logits(x[last])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def load_strictly(decoder: nn.Module, state: dict, tied: bool, device, dtype):
    """A decoder built on the meta device gets the checkpoint's tensors (already in the engine's names): every one it
    expects and no other (the rotary tables are made, not loaded), in dtype on device, embeddings re-tied."""
    expected = {k for k in decoder.state_dict() if not k.startswith("rotary.")}
    missing = expected - set(state) - ({"lm_head.weight"} if tied else set())
    unexpected = set(state) - expected
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match its config: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    decoder.to(dtype).to_empty(device=device)  # cast while still on meta: weights are allocated once, in dtype
    decoder.load_state_dict(state, strict=False, assign=False)
    if tied:
        decoder.lm_head.weight = decoder.embed_tokens.weight


def fuse_projections(state: dict) -> dict:
    """Checkpoint names -> the engine's: each layer's q/k/v (and gate/up) weights and biases concatenated along
    the output axis, in FUSED's order; a checkpoint that lacks one of them keeps its names (and fails the check)."""
    state = dict(state)
    for key in [k for k in state if ".q_proj." in k or ".gate_proj." in k]:
        fused, parts = next((f, p) for f, p in FUSED.items() if f".{p[0]}." in key)
        names = [key.replace(f".{parts[0]}.", f".{p}.") for p in parts]
        if all(n in state for n in names):
            state[key.replace(f".{parts[0]}.", f".{fused}.")] = torch.cat([state.pop(n) for n in names])
    return state
