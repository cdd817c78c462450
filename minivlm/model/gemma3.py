"""Gemma 3's text decoder over paged KV (transformers' Gemma3TextModel as Gemma3ForConditionalGeneration runs it): a
hybrid of sliding-window layers (a query sees the `sliding_window` tokens up to itself; the local RoPE base) and
global layers (the whole context; rope_theta, with linear scaling in the published 4B/12B/27B), five to one. Each
layer names its CacheSpec, so the engine keeps the two kinds in their own pools and frees sliding blocks as the
window moves. Gemma's own arithmetic: embeddings scaled by sqrt(hidden), RMSNorm with a (1 + weight) gain in fp32,
q/k norms, a norm before and after both the attention and the GeLU-tanh MLP, scores scaled by
query_pre_attn_scalar^-0.5. The bidirectional mask over image tokens is the attention's (meta.spans)."""
import torch
import torch.nn.functional as F
from torch import nn

from minivlm.model.cache_spec import CacheSpec
from minivlm.model.decoder import MLP, OffsetRMSNorm, fuse_projections, load_strictly
from minivlm.model.rope import apply_rope

SPEC_KIND = {"sliding_attention": "sliding_window", "full_attention": "full_attention"}  # HF's layer type -> ours
ROPE_TYPES = ("default", "linear")


class ScaledEmbedding(nn.Embedding):
    """Token embeddings times sqrt(hidden), the factor cast to the weights' dtype first as HF does (in bf16 it
    rounds: sqrt(3072) = 55.4256 becomes 55.5)."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__(vocab, hidden)
        self.scale = hidden ** 0.5

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * torch.tensor(self.scale, device=ids.device).to(self.weight.dtype)


class Gemma3Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = bool(cfg.attention_bias)
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = OffsetRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.query_pre_attn_scalar ** -0.5

    def forward(self, x, cos, sin, kv_cache, meta):
        T, h, kv = x.shape[0], self.heads, self.kv_heads
        qkv = self.qkv_proj(x).view(T, h + 2 * kv, self.head_dim)
        qk = apply_rope(torch.cat((self.q_norm(qkv[:, :h]), self.k_norm(qkv[:, h:h + kv])), dim=1), cos, sin)
        o = meta.attention(qk[:, :h], qk[:, h:], qkv[:, h + kv:], kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(o.reshape(T, -1))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class Gemma3Layer(nn.Module):
    """Sandwich norms: each sub-block's output is normed before it joins the residual."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Gemma3Attention(cfg)
        self.mlp = MLP(cfg, act=gelu_tanh)
        eps = cfg.rms_norm_eps
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = OffsetRMSNorm(cfg.hidden_size, eps)
        self.post_feedforward_layernorm = OffsetRMSNorm(cfg.hidden_size, eps)

    def forward(self, x, cos, sin, kv_cache, meta):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


def check_config(cfg):
    """Refuse, naming the setting, what this decoder would compute differently from transformers' Gemma 3.
    (attn_logit_softcapping and final_logit_softcapping need no check: Gemma3ForConditionalGeneration reads
    neither, and neither do we.)"""
    why = []
    if cfg.hidden_activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        why.append(f"hidden_activation={cfg.hidden_activation!r} (only GeLU-tanh)")
    if getattr(cfg, "use_bidirectional_attention", False):
        why.append("use_bidirectional_attention=True (EmbeddingGemma: no causal decoder)")
    unknown = set(cfg.layer_types) - set(SPEC_KIND)
    if unknown:
        why.append(f"layer_types {sorted(unknown)} (only sliding_attention and full_attention)")
    if "sliding_attention" in cfg.layer_types and not cfg.sliding_window:
        why.append("sliding layers without a sliding_window")
    for kind in set(cfg.layer_types) & set(SPEC_KIND):
        rope = cfg.rope_parameters[kind]
        if rope.get("rope_type", "default") not in ROPE_TYPES:
            why.append(f"{kind} rope_type={rope.get('rope_type')!r} (only {' and '.join(ROPE_TYPES)})")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            why.append(f"{kind} partial_rotary_factor={rope['partial_rotary_factor']} (only whole-head RoPE)")
    if why:
        raise ValueError(f"Gemma 3 text config not supported: {'; '.join(why)}")


def inverse_frequencies(cfg, kind: str) -> torch.Tensor:
    """RoPE's inverse frequencies of a layer type, as transformers computes them (linear: divided by its factor)."""
    rope = cfg.rope_parameters[kind]
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float()
                                             / cfg.head_dim))
    return inv_freq / rope["factor"] if rope.get("rope_type", "default") == "linear" else inv_freq


class Gemma3Decoder(nn.Module):
    """Gemma 3's text decoder on flattened tokens; forward takes one metadata per cache kind."""
    bidirectional_images = True  # an image's tokens see each other both ways: the scheduler never splits one

    def __init__(self, model_type: str, text_cfg, tie_word_embeddings: bool):
        super().__init__()
        check_config(text_cfg)
        self.cfg = text_cfg
        self.kinds = [SPEC_KIND[t] for t in text_cfg.layer_types[:text_cfg.num_hidden_layers]]
        self.layer_specs = [CacheSpec(kind, window=text_cfg.sliding_window if kind == "sliding_window" else None,
                                      kv_heads=text_cfg.num_key_value_heads, head_dim=text_cfg.head_dim)
                            for kind in self.kinds]
        self.embed_tokens = ScaledEmbedding(text_cfg.vocab_size, text_cfg.hidden_size)
        self.layers = nn.ModuleList(Gemma3Layer(text_cfg) for _ in self.kinds)
        self.norm = OffsetRMSNorm(text_cfg.hidden_size, text_cfg.rms_norm_eps)
        self.lm_head = nn.Linear(text_cfg.hidden_size, text_cfg.vocab_size, bias=False)
        if tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.inv_freq = {}  # per cache kind, on the device (made at load)

    def load_weights(self, state: dict, tied: bool, device, dtype):
        """Copy checkpoint tensors in (strictly, after fusing q/k/v and gate/up), re-tie the embeddings, make the
        two RoPEs' frequencies on device."""
        load_strictly(self, fuse_projections(state), tied, device, dtype)
        hf_kind = {v: k for k, v in SPEC_KIND.items()}
        self.inv_freq = {kind: inverse_frequencies(self.cfg, hf_kind[kind]).to(device) for kind in set(self.kinds)}

    def rope(self, kind: str, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, head_dim] of one layer kind's RoPE at 1-D positions [T] (HF's fp32 product)."""
        freqs = positions[:, None].float() * self.inv_freq[kind]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]

    def forward(self, embeds, positions, kv_caches, metas: dict, deepstack=None,
                last: torch.Tensor | None = None, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """embeds [T, hidden], positions [3, T] (1-D: three equal rows), metas {cache kind: AttentionMetadata};
        input_ids [T] (every family's forward takes them; Gemma 3 reads only embeds).
        Returns the final hidden states [T, hidden], or with `last` (row indices [B]) the logits of those rows."""
        if deepstack is not None:
            raise ValueError("Gemma 3 has no deepstack features")
        ropes = {kind: self.rope(kind, positions[0], embeds.dtype) for kind in self.inv_freq}
        x = embeds
        for layer, kind, kv_cache in zip(self.layers, self.kinds, kv_caches):
            x = layer(x, *ropes[kind], kv_cache, metas[kind])
        x = self.norm(x)
        return x if last is None else self.compute_logits(x[last])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # no final softcapping: Gemma3ForConditionalGeneration applies none
