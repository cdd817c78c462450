"""A random-weight Gemma 4 12B checkpoint (gemma4_unified: Gemma4UnifiedForConditionalGeneration) at test size, in the
published layout, saved by transformers: the 12B's pattern scaled down. Twelve text layers, five sliding then one
full, twice; full layers whose keys are their values (attention_k_eq_v) with one KV head of 20 (global_head_dim),
sliding ones two heads of 12; images attending both ways (use_bidirectional_attention="vision", the 12B's), a final
softcap, random layer scalars, a 24-token window that test prompts outgrow. The last four layers share K/V (8-10 read
layer 7's sliding K/V, 11 reads layer 5's full K/V): the published 12B config says num_kv_shared_layers=0 (assets/
presets/models/gemma-4-12B-it.json), but transformers builds the sharing for this model type and the engine must
serve it, so the test checkpoint has it, with the unread k_proj / v_proj / k_norm of the shared layers present and
random as in gemma4's checkpoints (tools/make_checkpoint_gemma4.py). No vision encoder: the 12B's own 16-px patches
merged 3 x 3 (48 x 48 x 3 = 6912 raw pixels each) through norms and one linear to a 30-wide embedding, its 1120-row
factorized position table, 70 soft tokens at most per image; the audio embedder (raw 640-sample frames) is present,
as the 12B config carries one (audio input is refused). The image processor is minivlm's plain-torch one, saved under
transformers' class name (Gemma4UnifiedImageProcessor), as a published checkpoint names it."""

from tools.make_checkpoint_gemma4 import GEMMA4_TOKENS, write_checkpoint

# torch and transformers are imported where used, so that a command line listing families answers at once

PATCH, POOL, SOFT_TOKENS = 16, 3, 70       # the 12B's 16-px patches merged 3x3; 70 soft tokens at most per image
SLIDING_WINDOW = 24                        # tokens a sliding layer's query sees, itself included
LAYER_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 2
SHARED = 4                                 # num_kv_shared_layers: layers 8-11 read layers 7 and 5


def build_gemma4_unified(tokenizer, tie: bool = True, **text_overrides):
    """(model class, config, processor) of a test-size Gemma 4 12B (text_overrides: Gemma4UnifiedTextConfig fields)."""
    from transformers import Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration

    from minivlm.families import get_family
    from minivlm.inputs.patches_gemma4_unified import Gemma4UnifiedImageProcessorTorch
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in GEMMA4_TOKENS.items()}
    text = dict(vocab_size=len(tokenizer), hidden_size=44, intermediate_size=52, num_hidden_layers=len(LAYER_TYPES),
                num_attention_heads=4, num_key_value_heads=2, head_dim=12, global_head_dim=20,
                attention_k_eq_v=True, num_global_key_value_heads=1, layer_types=list(LAYER_TYPES),
                num_kv_shared_layers=SHARED, sliding_window=SLIDING_WINDOW, use_bidirectional_attention="vision",
                final_logit_softcapping=30.0, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1_000_000.0}},
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=tie)
    text.update(text_overrides)
    vision = dict(patch_size=PATCH, pooling_kernel_size=POOL, mm_embed_dim=30, mm_posemb_size=1120,
                  output_proj_dims=30)
    config = Gemma4UnifiedConfig(text_config=text, vision_config=vision, audio_config=dict(audio_embed_dim=640),
                                 boi_token_id=ids["boi_token"], eoi_token_id=ids["eoi_token"],
                                 image_token_id=ids["image_token"],
                                 video_token_id=tokenizer.convert_tokens_to_ids("<|video|>"),
                                 boa_token_id=ids["boa_token"], eoa_token_index=ids["eoa_token"],
                                 audio_token_id=ids["audio_token"], tie_word_embeddings=tie)
    image_processor = Gemma4UnifiedImageProcessorTorch(patch_size=PATCH, pooling_kernel_size=POOL,
                                                       max_soft_tokens=SOFT_TOKENS)
    processor = get_family("gemma4_unified").processor_class(image_processor, tokenizer,
                                                             chat_template=tokenizer.chat_template,
                                                             image_seq_length=SOFT_TOKENS)
    return Gemma4UnifiedForConditionalGeneration, config, processor


def randomize_gemma4_unified(model):
    """What HF starts at a constant made random, so that every part is tested: 1-D weights (the embedder's
    LayerNorms included: tools/make_checkpoint.randomize), each layer's layer_scalar, the position table."""
    import torch

    from tools.make_checkpoint import randomize
    randomize(model)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("layer_scalar"):
                buf.copy_(0.5 + torch.rand_like(buf))
        for name, p in model.named_parameters():
            if name.endswith(("_ln1.weight", "_ln2.weight")):  # LayerNorm scales whose names lack "norm"
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        model.model.embed_vision.pos_embedding.normal_(0.0, 0.5)
    return model


def make_gemma4_unified_checkpoint(out_dir: str, seed: int = 0, **kwargs) -> str:
    """Write a random-weight Gemma 4 12B checkpoint to out_dir (kwargs: build_gemma4_unified's)."""
    return write_checkpoint(out_dir, seed, build_gemma4_unified, randomize_gemma4_unified, "Gemma4UnifiedProcessor",
                            **kwargs)
