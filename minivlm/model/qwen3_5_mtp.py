"""Qwen3.5's multi-token-prediction head (the checkpoint's `mtp.*`): it guesses the token after next. At position p
it reads the main model's final hidden state h_p (after the final norm) and the embedding of token p+1:
x = fc([pre_fc_norm_embedding(embed(t_{p+1})); pre_fc_norm_hidden(h_p)]) (embedding first, as vLLM's
qwen3_next_mtp.py and the training script concatenate), then one gated full-attention Qwen3.5 layer with its own
K/V (a layer of KV-cache group 0), then `norm`; the shared lm_head turns it into logits for t_{p+2}. Applied again on
its own output (and its own guess) it guesses further ahead (engine/spec_decode/mtp.py)."""
import torch
import torch.nn.functional as F
from torch import nn

from minivlm.model.decoder import OffsetRMSNorm
from minivlm.model.rope import rotate_partially


def mtp_layers(text_cfg) -> int:
    """The head's depth as published configs name it (0: no head)."""
    return int(getattr(text_cfg, "mtp_num_hidden_layers", 0) or 0)


class Qwen3_5MTP(nn.Module):
    def __init__(self, text_cfg, layer_cls):
        super().__init__()
        hidden, eps = text_cfg.hidden_size, text_cfg.rms_norm_eps
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = OffsetRMSNorm(hidden, eps)
        self.pre_fc_norm_hidden = OffsetRMSNorm(hidden, eps)
        self.layers = nn.ModuleList(layer_cls(text_cfg, "full_attention") for _ in range(mtp_layers(text_cfg)))
        self.norm = OffsetRMSNorm(hidden, eps)

    def combine(self, next_embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat((self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)), dim=-1))

    def forward(self, next_embeds, hidden, cos, sin, kv_caches: list, meta) -> torch.Tensor:
        """Paged: the step's rows (same positions, slots and metadata as the main forward), each layer writing its K/V
        into its own cache of group 0. Returns the normed hidden states [T, hidden]."""
        x = self.combine(next_embeds, hidden)
        for layer, cache in zip(self.layers, kv_caches):
            x = layer(x, cos, sin, cache, meta, None)
        return self.norm(x)

    def dense_step(self, next_embed, hidden, cos, sin, past: list) -> torch.Tensor:
        """One row [1, hidden] past the paged context, attending over `past` (per layer [K, V] of the positions
        before it, [n, kv_heads, head_dim]), to which its own K/V are appended. For guesses 2..k."""
        x = self.combine(next_embed, hidden)
        for layer, kv in zip(self.layers, past):
            x = x + dense_attention(layer.self_attn, layer.input_layernorm(x), cos, sin, kv)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)


def dense_attention(attn, x, cos, sin, kv: list) -> torch.Tensor:
    """GatedAttention's arithmetic on one row over dense past K/V (kv = [K, V], extended in place)."""
    T, h, n_kv, d = x.shape[0], attn.heads, attn.kv_heads, attn.head_dim
    qg, k, v = attn.qkv_proj(x).split([2 * h * d, n_kv * d, n_kv * d], dim=-1)
    q, gate = qg.view(T, h, 2 * d).chunk(2, dim=-1)
    q, k = rotate_partially(attn.q_norm(q), cos, sin), rotate_partially(attn.k_norm(k.view(T, n_kv, d)), cos, sin)
    kv[0], kv[1] = torch.cat((kv[0], k.to(kv[0].dtype))), torch.cat((kv[1], v.view(T, n_kv, d).to(kv[1].dtype)))
    # 4-D with the heads grouped by SDPA itself: no expanded copy of K/V (3-D inputs take SDPA's slow math path)
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kv[0].to(q.dtype).transpose(0, 1)[None],
                                       kv[1].to(q.dtype).transpose(0, 1)[None], scale=d ** -0.5,
                                       enable_gqa=True)  # the last row sees everything before it
    return attn.o_proj(o[0].transpose(0, 1).reshape(T, -1) * torch.sigmoid(gate.reshape(T, -1)))
