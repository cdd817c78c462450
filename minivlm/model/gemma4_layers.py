"""One Gemma 4 decoder layer (transformers' Gemma4TextDecoderLayer), run over paged KV: sandwich norms that scale by w
(not 1 + w) around attention and a GeLU-tanh gated MLP, then the per-layer input through its gate, then a learned
scalar. Attention normalizes q, k and v (v's norm without a weight) and uses scale 1; its sliding and full layers
have their own head size (the layer's per_layer_config). A KV-shared layer projects only q and attends over its
source layer's K/V of this step and that layer's blocks, writing nothing; an attention_k_eq_v full layer uses its
K as V. The decoder that stacks these layers is gemma4.py."""
import torch
from torch import nn

from minivlm.model.gemma3 import gelu_tanh
from minivlm.model.rope import apply_rope


class ScaleNorm(nn.Module):
    """Gemma 4's RMSNorm: x * (mean(x²) + eps)^-0.5 in fp32, times the weight itself (no weight: v and the
    embedders' norms), cast back (HF's order and its pow, not rsqrt)."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        return (h if self.weight is None else h * self.weight.float()).to(x.dtype)


class Gemma4Attention(nn.Module):
    """q (and, unless shared, k and v) as one matrix product; attention_k_eq_v full layers use k as v."""

    def __init__(self, cfg, layer: int, shared: bool):
        super().__init__()
        lc = cfg.per_layer_config[layer]
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, lc.num_key_value_heads, lc.head_dim
        self.shared = shared
        self.k_is_v = bool(cfg.attention_k_eq_v) and cfg.layer_types[layer] == "full_attention"
        kv_rows = 0 if shared else self.kv_heads * (1 if self.k_is_v else 2)
        bias = bool(cfg.attention_bias)
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.heads + kv_rows) * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = ScaleNorm(self.head_dim, cfg.rms_norm_eps)
        if not shared:
            self.k_norm = ScaleNorm(self.head_dim, cfg.rms_norm_eps)
            self.v_norm = ScaleNorm(self.head_dim, cfg.rms_norm_eps, with_scale=False)

    def forward(self, x, cos, sin, kv_cache, meta, step_kv: tuple | None):
        """step_kv: a shared layer's source K/V of this step's tokens (the source already wrote them to its blocks).
        Returns (output, this layer's step K/V or None)."""
        T, h, kv, d = x.shape[0], self.heads, self.kv_heads, self.head_dim
        out = self.qkv_proj(x).view(T, -1, d)
        q = apply_rope(self.q_norm(out[:, :h]), cos, sin)
        if self.shared:  # read the source's blocks, write nothing
            k, v = step_kv
            o = meta.attention.attend(q, k, v, kv_cache[0], kv_cache[1], meta, 1.0)
            return self.o_proj(o.reshape(T, -1)), None
        raw_k = out[:, h:h + kv]
        k = apply_rope(self.k_norm(raw_k), cos, sin)
        v = self.v_norm(raw_k if self.k_is_v else out[:, h + kv:])
        o = meta.attention(q, k, v, kv_cache[0], kv_cache[1], meta, 1.0)  # scale 1: q and k are normed
        return self.o_proj(o.reshape(T, -1)), (k, v)


class GatedMLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)), gate and up as one matrix product."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(gelu_tanh(gate) * up)


class Gemma4Layer(nn.Module):
    """Sandwich norms around attention and MLP, then the per-layer input through its gate, then the layer scalar."""

    def __init__(self, cfg, layer: int, shared: bool):
        super().__init__()
        eps, hidden = cfg.rms_norm_eps, cfg.hidden_size
        self.self_attn = Gemma4Attention(cfg, layer, shared)
        wide = 2 if cfg.use_double_wide_mlp and shared else 1
        self.mlp = GatedMLP(hidden, cfg.intermediate_size * wide)
        self.input_layernorm = ScaleNorm(hidden, eps)
        self.post_attention_layernorm = ScaleNorm(hidden, eps)
        self.pre_feedforward_layernorm = ScaleNorm(hidden, eps)
        self.post_feedforward_layernorm = ScaleNorm(hidden, eps)
        self.register_buffer("layer_scalar", torch.ones(1))  # in the checkpoint
        self.per_layer = bool(getattr(cfg, "hidden_size_per_layer_input", 0))  # none in gemma4_unified
        if self.per_layer:
            self.per_layer_input_gate = nn.Linear(hidden, cfg.hidden_size_per_layer_input, bias=False)
            self.per_layer_projection = nn.Linear(cfg.hidden_size_per_layer_input, hidden, bias=False)
            self.post_per_layer_input_norm = ScaleNorm(hidden, eps)

    def forward(self, x, per_layer_input, cos, sin, kv_cache, meta, step_kv):
        a, kv = self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta, step_kv)
        x = x + self.post_attention_layernorm(a)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        if self.per_layer:
            gated = gelu_tanh(self.per_layer_input_gate(x)) * per_layer_input
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return x * self.layer_scalar, kv
