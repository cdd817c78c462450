"""The tiny Qwen3.5 (assets/tiny-qwen3_5-vl): its config, its MTP head in the published `mtp.*` layout, the copy of
the trained tiny Qwen3-VL's vision tower and embeddings into it, and its export with the mtp.* tensors.

The MTP head (vLLM's qwen3_5_mtp / qwen3_next_mtp, the published Qwen3.5 and Qwen3-Next layout): at position t it
takes h_t, the main model's final hidden state (after model.norm, the vector the LM head reads), and e_{t+1}, the
input embedding of the token at t+1 (the image's features where that token is an image pad), and predicts the
token at t+2:
    x = mtp.fc(cat([mtp.pre_fc_norm_embedding(e_{t+1}), mtp.pre_fc_norm_hidden(h_t)]))   # 2H -> H, no bias
    g = mtp.norm(mtp.layers.0(x, rope positions of t))   # a full-attention decoder layer with its own causal KV
    logits = lm_head(g)                                  # the main model's LM head (tied to embed_tokens here)
For k > 1 drafts the same layer runs again with g as the hidden state, the drafted token's embedding and the next
position. transformers skips mtp.* on load; minivlm's engine serves it.
"""
import copy
import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tools.train_tiny import PATCH

HIDDEN = 128
TEXT = dict(hidden_size=HIDDEN, intermediate_size=384, num_hidden_layers=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"],  # Qwen3.5's 3:1 Gated DeltaNet : gated attention
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,  # the Qwen3-VL tiny model's attention shapes
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
            linear_conv_kernel_dim=4, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True,
            mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,  # the published checkpoints' MTP fields
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_section": [2, 1, 1], "mrope_interleaved": True})  # a quarter of 32 dims rotated
VISION = dict(depth=4, hidden_size=128, intermediate_size=256, num_heads=4, out_hidden_size=HIDDEN, patch_size=PATCH,
              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=256, hidden_act="gelu_pytorch_tanh")


def student_config(tokenizer):
    """The Qwen3_5Config of the tiny model over the tiny Qwen-VL tokenizer (its special tokens' ids)."""
    from transformers import Qwen3_5Config
    ids = tokenizer.convert_tokens_to_ids
    text = dict(TEXT, vocab_size=len(tokenizer), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
                bos_token_id=None)
    return Qwen3_5Config(text_config=text, vision_config=VISION, image_token_id=ids("<|image_pad|>"),
                         video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                         vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=True)


class MTPHead(nn.Module):
    """Qwen3.5's multi-token-prediction head; its parameter names are the checkpoint's after `mtp.`."""

    def __init__(self, text_config):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm
        config = copy.deepcopy(text_config)
        config.layer_types = ["full_attention"]  # the head's one layer is a (gated) full-attention layer
        config._attn_implementation = "sdpa"  # causal without a mask (eager would need one)
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(config, 0)])
        self.norm = Qwen3_5RMSNorm(hidden, eps)
        nn.init.normal_(self.fc.weight, std=0.02)
        for name, p in self.layers.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, next_embeds, hidden, position_embeddings):
        """Normed hidden states predicting the token after next; next_embeds[:, i] embeds token i+1, hidden[:, i]
        is the main model's final hidden state at i, position_embeddings the rotary (cos, sin) of position i."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], -1))
        for layer in self.layers:
            x = layer(x, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(x)


def copy_from_teacher(student, teacher, decoder: bool = True):
    """Copy what maps exactly from the trained tiny Qwen3-VL: the whole vision tower but DeepStack's mergers (Qwen3.5
    has none) and the tied embedding; with `decoder`, per decoder layer the MLP and the two norms (Qwen3.5's norms
    scale by 1 + weight), and the last layer's attention, its query's gate rows zero (sigmoid 0.5: o_proj doubled)."""
    t_vis = {k: v for k, v in teacher.model.visual.state_dict().items() if not k.startswith("deepstack")}
    student.model.visual.load_state_dict(t_vis, strict=True)
    s_lm, t_lm = student.model.language_model, teacher.model.language_model
    with torch.no_grad():
        s_lm.embed_tokens.weight.copy_(t_lm.embed_tokens.weight)
        if not decoder:
            return
        s_lm.norm.weight.copy_(t_lm.norm.weight - 1)
        for s, t in zip(s_lm.layers, t_lm.layers):
            s.mlp.load_state_dict(t.mlp.state_dict())
            s.input_layernorm.weight.copy_(t.input_layernorm.weight - 1)
            s.post_attention_layernorm.weight.copy_(t.post_attention_layernorm.weight - 1)
        s, t = s_lm.layers[-1].self_attn, t_lm.layers[-1].self_attn
        dim = s.head_dim
        q = s.q_proj.weight.view(-1, 2 * dim, HIDDEN)
        q[:, :dim] = t.q_proj.weight.view(-1, dim, HIDDEN)
        q[:, dim:] = 0
        for name in ("k_proj", "v_proj"):
            getattr(s, name).weight.copy_(getattr(t, name).weight)
        s.o_proj.weight.copy_(2 * t.o_proj.weight)
        s.q_norm.weight.copy_(t.q_norm.weight - 1)
        s.k_norm.weight.copy_(t.k_norm.weight - 1)


def export(student, mtp, tokenizer, out_dir: str, processor_dir: str):
    """An HF checkpoint dir: transformers' files for the model, the mtp.* tensors added to model.safetensors, and
    the tokenizer, processor settings and chat template of `processor_dir` (the tiny Qwen3-VL's)."""
    import shutil
    os.makedirs(out_dir, exist_ok=True)
    student.save_pretrained(out_dir)
    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    tensors.update({f"mtp.{k}": v.detach().contiguous().clone() for k, v in mtp.state_dict().items()})
    save_file(tensors, path, metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json",
                 "generation_config.json"):
        shutil.copy(os.path.join(processor_dir, name), os.path.join(out_dir, name))


def load_mtp(model_dir: str, text_config) -> MTPHead:
    """The MTP head of an exported checkpoint (its mtp.* tensors), in eval mode."""
    head = MTPHead(text_config)
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    head.load_state_dict({k[len("mtp."):]: v for k, v in tensors.items() if k.startswith("mtp.")})
    return head.eval()
