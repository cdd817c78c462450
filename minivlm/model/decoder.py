"""The Qwen-VL text decoder over paged KV: one class for Qwen2-VL, Qwen2.5-VL (qkv bias, chunked M-RoPE)
and Qwen3-VL (q/k RMSNorm, interleaved M-RoPE, deepstack). Parameter names match HF checkpoints."""
import platform

import torch
import torch.nn.functional as F
from torch import nn

from minivlm.model.attention import AttentionMetadata, paged_attention
from minivlm.model.rope import MRotaryEmbedding, apply_rope


# oneDNN fast path: measured on x86-64 only, so other CPUs (e.g. Apple silicon) keep plain nn.Linear
ONEDNN = torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")


class Linear(nn.Linear):
    """nn.Linear that runs fp32 CPU inference through oneDNN: PyTorch's default fp32 CPU GEMM (MKL) takes a slower
    code path on some CPUs (AMD EPYC: 2-3x slower here); oneDNN computes the same product with AVX-512."""

    def pack(self):
        """Store the weight in oneDNN's blocked layout: the same numbers (lossless, no extra memory), laid out in
        the order its kernel reads them, which makes memory-bound decode steps ~1.6x faster."""
        self.weight = nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(self.weight.detach()), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.is_mkldnn or (ONEDNN and x.is_cpu and x.dtype == torch.float32 and not torch.is_grad_enabled()):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return super().forward(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()  # normalise in fp32 like HF, then cast back before the weight
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg, qk_norm: bool, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = Linear(cfg.hidden_size, self.heads * self.head_dim, bias=qkv_bias)
        self.k_proj = Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = Linear(self.heads * self.head_dim, cfg.hidden_size, bias=o_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata):
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.heads, self.head_dim)
        k = self.k_proj(x).view(T, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(T, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.head_dim ** -0.5)
        return self.o_proj(o.reshape(T, -1))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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


class QwenVLDecoder(nn.Module):
    """Text decoder: embeddings -> layers (+ deepstack injections) -> norm -> lm_head, on flattened tokens."""

    def __init__(self, model_type: str, text_cfg, tie_word_embeddings: bool):
        super().__init__()
        if getattr(text_cfg, "head_dim", None) is None:
            text_cfg.head_dim = text_cfg.hidden_size // text_cfg.num_attention_heads
        qwen3 = model_type == "qwen3_vl"
        bias = bool(getattr(text_cfg, "attention_bias", False))
        attn_kwargs = dict(qk_norm=qwen3, qkv_bias=bias if qwen3 else True, o_bias=bias if qwen3 else False)
        self.embed_tokens = nn.Embedding(text_cfg.vocab_size, text_cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(text_cfg, **attn_kwargs) for _ in range(text_cfg.num_hidden_layers))
        self.norm = RMSNorm(text_cfg.hidden_size, text_cfg.rms_norm_eps)
        self.lm_head = Linear(text_cfg.hidden_size, text_cfg.vocab_size, bias=False)
        if tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        rope = text_cfg.rope_parameters
        if rope.get("rope_type", "default") not in ("default", "mrope"):
            raise ValueError(f"rope_type {rope.get('rope_type')!r} is not supported (only default M-RoPE)")
        self.rope_args = (text_cfg.head_dim, rope["rope_theta"], list(rope["mrope_section"]),
                          qwen3 or bool(rope.get("mrope_interleaved", False)))
        self.rotary = MRotaryEmbedding(*self.rope_args)

    def load_weights(self, state: dict, tied: bool, device, dtype):
        """Copy checkpoint tensors in (strictly), re-tie the embeddings, rebuild the rotary tables on device."""
        expected = set(self.state_dict()) - {"rotary.inv_freq", "rotary.axis"}
        missing = expected - set(state) - ({"lm_head.weight"} if tied else set())
        unexpected = set(state) - expected
        if missing or unexpected:
            raise ValueError(f"checkpoint does not match its config: missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")
        self.to_empty(device=device)
        self.load_state_dict(state, strict=False, assign=False)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight
        self.to(dtype)
        self.rotary = MRotaryEmbedding(*self.rope_args).to(device)
        if ONEDNN and torch.device(device).type == "cpu" and dtype == torch.float32:
            for m in self.modules():  # the embedding table (tied lm_head) must stay dense for lookups
                if isinstance(m, Linear) and m.weight is not self.embed_tokens.weight:
                    m.pack()

    def forward(self, embeds, positions, kv_caches, meta: AttentionMetadata, deepstack=None) -> torch.Tensor:
        """embeds [T, hidden], positions [3, T]; deepstack = (rows [N], [features [N, hidden] per layer]) or None."""
        cos, sin = self.rotary(positions, embeds.dtype)
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv_caches[i], meta)
            if deepstack is not None and i < len(deepstack[1]):
                x = x.index_add(0, deepstack[0], deepstack[1][i].to(x.dtype))  # ViT layer features at image tokens
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
