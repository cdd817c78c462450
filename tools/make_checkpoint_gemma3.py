"""A random-weight Gemma 3 checkpoint (Gemma3ForConditionalGeneration: SigLIP + average-pool projector + Gemma 3's
hybrid decoder) at test size, in the published layout, saved by transformers with its processor. Six text layers so
both kinds appear (sliding_window_pattern 6: layers 0-4 slide, layer 5 is global) and a 24-token window, so that test
prompts outgrow it; a 64-px image in 8-px patches is pooled to 16 tokens."""
import json
import os

# torch and transformers are imported where used, so that a command line listing families answers at once

IMAGE, PATCH, TOKENS_PER_IMAGE = 64, 8, 16   # 8x8 patches average-pooled 2x2 -> a 4x4 grid of soft tokens
SLIDING_WINDOW = 24                          # tokens a sliding layer's query sees, itself included


def build_gemma3(tokenizer, tie: bool = True, full_rope: dict | None = None, **text_overrides):
    """(model class, config, processor) of a test-size Gemma 3. full_rope: the global layers' RoPE (default: linear
    scaling by 8 at theta 1e6, as the published 4B/12B/27B); the sliding layers keep the local base 10,000."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    from transformers.models.gemma3 import Gemma3ImageProcessorPil

    from minivlm.families import get_family
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in
           (("boi", "<start_of_image>"), ("eoi", "<end_of_image>"), ("image", "<image_soft_token>"))}
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                max_position_embeddings=4096, rms_norm_eps=1e-6, sliding_window=SLIDING_WINDOW,
                sliding_window_pattern=6, hidden_activation="gelu_pytorch_tanh",
                rope_parameters={"full_attention": full_rope or {"rope_type": "linear", "factor": 8.0,
                                                                 "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=tie)
    text.update(text_overrides)
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=IMAGE, patch_size=PATCH, layer_norm_eps=1e-6,
                  vision_use_head=False)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=TOKENS_PER_IMAGE,
                          boi_token_index=ids["boi"], eoi_token_index=ids["eoi"], image_token_index=ids["image"],
                          tie_word_embeddings=tie)
    # pan-and-scan's settings are the processor's own (off; crops of 256 px at least): Gemma3Processor's defaults
    # come before an image processor's saved values, so a test image needs 512 px on its long side to be cut
    image_processor = Gemma3ImageProcessorPil(size={"height": IMAGE, "width": IMAGE}, image_mean=[0.5] * 3,
                                              image_std=[0.5] * 3)
    processor = get_family("gemma3").processor_class(image_processor, tokenizer, image_seq_length=TOKENS_PER_IMAGE,
                                                     chat_template=tokenizer.chat_template)
    return Gemma3ForConditionalGeneration, config, processor


def make_gemma3_checkpoint(out_dir: str, seed: int = 0, **kwargs) -> str:
    """Write a random-weight Gemma 3 checkpoint to out_dir (kwargs: build_gemma3's)."""
    import torch

    from tools.make_checkpoint import randomize
    from tools.tiny_tokenizer import family_tokenizer
    torch.manual_seed(seed)
    tokenizer = family_tokenizer("gemma3")
    model_cls, config, processor = build_gemma3(tokenizer, **kwargs)
    model = randomize(model_cls(config).eval())
    with torch.no_grad():  # HF starts the projector at zero: every image would embed to nothing
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.1)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    save_gemma_files(out_dir, tokenizer, processor, "Gemma3Processor", "<end_of_turn>")
    return out_dir


def save_gemma_files(out_dir: str, tokenizer, processor, processor_class: str, end_of_turn_token: str):
    """A Gemma checkpoint's tokenizer, processor (under transformers' class name, as the hub checkpoints say) and
    generation config (published: <eos> and the end of a turn both stop)."""
    tokenizer.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    path = os.path.join(out_dir, "processor_config.json")
    with open(path) as f:
        saved = json.load(f)
    with open(path, "w") as f:
        json.dump({**saved, "processor_class": processor_class}, f, indent=2)
    end_of_turn = tokenizer.convert_tokens_to_ids(end_of_turn_token)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": tokenizer.bos_token_id, "eos_token_id": [tokenizer.eos_token_id, end_of_turn],
                   "pad_token_id": tokenizer.pad_token_id}, f)
