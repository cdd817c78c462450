"""A random-weight Gemma 4 checkpoint (Gemma4ForConditionalGeneration) at test size, in the published layout, saved by
transformers with its processor: the E2B / E4B layer pattern scaled down. Ten text layers, four sliding then one
full, twice; the last four (num_kv_shared_layers) compute no K/V of their own and read the last earlier layer of
their type (layers 6-8 read layer 5's sliding K/V, layer 9 reads layer 4's full K/V), with double-wide MLPs. The
sliding layers' head size (12) differs from the full layers' (global_head_dim 20), whose RoPE is proportional (a
quarter of the angles rotate); per-layer embeddings (6 wide), a final logit softcap, random layer scalars, a
24-token window so that test prompts outgrow it. The published checkpoints still carry k_proj / v_proj / k_norm for
the shared layers, which transformers ignores: they are written here too, random, so a loader that used them would
give wrong answers. The vision tower is Gemma 4's own (8-px patches, 3x3 pooling, clipped linears with finite
bounds, 70 soft tokens at most per image: the smallest budget its processor takes); the audio tower is present and
small, as the E2B / E4B configs carry one.

The tokenizer's Gemma 4 tokens (<|image|>, <|image>, <image|>, <|audio|>, <|turn>, <turn|>, ...) are this
repository's best reading of the published ones, not checked against a download."""
import os

from tools.make_checkpoint_gemma3 import save_gemma_files

# torch and transformers are imported where used, so that a command line listing families answers at once

PATCH, POOL, SOFT_TOKENS = 8, 3, 70        # 8-px patches pooled 3x3; 70 soft tokens (630 patches) at most per image
SLIDING_WINDOW = 24                        # tokens a sliding layer's query sees, itself included
LAYER_TYPES = (["sliding_attention"] * 4 + ["full_attention"]) * 2
SHARED = 4                                 # num_kv_shared_layers: layers 6-9 read earlier layers' K/V
GEMMA4_TOKENS = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                 "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
GEMMA4_TEMPLATE = (  # Gemma 4's turn format (a system turn is a turn of its own); images as <|image|>
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<|turn>' + role + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<|image|>' }}"
    "{%- elif item['type'] == 'audio' -%}{{ '<|audio|>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<turn|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|turn>model\n' }}{%- endif -%}"
)


def gemma4_tokenizer():
    """The tiny BPE with Gemma's <bos>/<eos>/<pad>, Gemma 4's image and audio markers and turn tokens (and the
    <|video|> token Gemma4Processor adds itself), one token each."""
    from transformers import PreTrainedTokenizerFast

    from tools.tiny_tokenizer import build_tokenizer
    tok = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer().backend_tokenizer, bos_token="<bos>",
                                  eos_token="<eos>", pad_token="<pad>", extra_special_tokens=GEMMA4_TOKENS)
    tok.add_tokens(["<|turn>", "<turn|>", "<|video|>"], special_tokens=True)
    tok.chat_template = GEMMA4_TEMPLATE
    return tok


def build_gemma4(tokenizer, tie: bool = True, **text_overrides):
    """(model class, config, processor) of a test-size Gemma 4 (text_overrides: Gemma4TextConfig fields)."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration
    from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4ImageProcessorPil

    from minivlm.families import get_family
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in GEMMA4_TOKENS.items()}
    text = dict(vocab_size=len(tokenizer), hidden_size=44, intermediate_size=52, num_hidden_layers=len(LAYER_TYPES),
                num_attention_heads=4, num_key_value_heads=2, head_dim=12, global_head_dim=20,
                layer_types=list(LAYER_TYPES), num_kv_shared_layers=SHARED, sliding_window=SLIDING_WINDOW,
                hidden_size_per_layer_input=6, vocab_size_per_layer_input=len(tokenizer), use_double_wide_mlp=True,
                final_logit_softcapping=30.0, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1_000_000.0}},
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=tie)
    text.update(text_overrides)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=PATCH, pooling_kernel_size=POOL,
                  position_embedding_size=256, use_clipped_linears=True,
                  rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    audio = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[8, 4],
                 conv_kernel_size=5, output_proj_dims=24)
    config = Gemma4Config(text_config=text, vision_config=vision, audio_config=audio, boi_token_id=ids["boi_token"],
                          eoi_token_id=ids["eoi_token"], image_token_id=ids["image_token"],
                          video_token_id=tokenizer.convert_tokens_to_ids("<|video|>"), boa_token_id=ids["boa_token"],
                          eoa_token_index=ids["eoa_token"], audio_token_id=ids["audio_token"], tie_word_embeddings=tie)
    image_processor = Gemma4ImageProcessorPil(patch_size=PATCH, pooling_kernel_size=POOL, max_soft_tokens=SOFT_TOKENS)
    processor = get_family("gemma4").processor_class(image_processor, tokenizer, chat_template=tokenizer.chat_template,
                                                     image_seq_length=SOFT_TOKENS)
    return Gemma4ForConditionalGeneration, config, processor


def randomize_gemma4(model):
    """What HF starts at a constant is made random, so that every part is tested: 1-D weights (tools/make_checkpoint
    .randomize), each layer's layer_scalar, the vision tower's position table and its linears' clip bounds (finite,
    so that clipping happens)."""
    import torch

    from tools.make_checkpoint import randomize
    randomize(model)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("layer_scalar"):
                buf.copy_(0.5 + torch.rand_like(buf))
            elif name.endswith(("input_min", "output_min")):
                buf.fill_(-1.5 - torch.rand(()).item())
            elif name.endswith(("input_max", "output_max")):
                buf.fill_(1.5 + torch.rand(()).item())
        model.model.vision_tower.patch_embedder.position_embedding_table.normal_(0.0, 0.5)
    return model


def add_unused_shared_kv(out_dir: str, config, seed: int):
    """The shared layers' k_proj / v_proj / k_norm, as the published checkpoints carry them (transformers skips them
    on load: keys_to_ignore_on_load_unexpected), random, into the saved safetensors."""
    import torch
    from safetensors.torch import load_file, save_file
    text = config.text_config
    gen = torch.Generator().manual_seed(seed + 1)
    path = os.path.join(out_dir, "model.safetensors")
    state = load_file(path)
    for i in range(text.num_hidden_layers - text.num_kv_shared_layers, text.num_hidden_layers):
        layer = text.per_layer_config[i]
        prefix = f"model.language_model.layers.{i}.self_attn."
        width = layer.num_key_value_heads * layer.head_dim
        state[prefix + "k_proj.weight"] = torch.randn(width, text.hidden_size, generator=gen)
        state[prefix + "v_proj.weight"] = torch.randn(width, text.hidden_size, generator=gen)
        state[prefix + "k_norm.weight"] = 1.0 + torch.randn(layer.head_dim, generator=gen)
    save_file(state, path, metadata={"format": "pt"})


def make_gemma4_checkpoint(out_dir: str, seed: int = 0, **kwargs) -> str:
    """Write a random-weight Gemma 4 checkpoint to out_dir (kwargs: build_gemma4's)."""
    return write_checkpoint(out_dir, seed, build_gemma4, randomize_gemma4, "Gemma4Processor", **kwargs)


def write_checkpoint(out_dir: str, seed: int, build, randomize, processor_class: str, **kwargs) -> str:
    """Build (tokenizer -> model class, config, processor), randomize and save a Gemma 4 family checkpoint, the
    shared layers' unused K/V weights added as published checkpoints carry them."""
    import torch
    torch.manual_seed(seed)
    tokenizer = gemma4_tokenizer()
    model_cls, config, processor = build(tokenizer, **kwargs)
    model = randomize(model_cls(config).eval())
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    add_unused_shared_kv(out_dir, config, seed)
    save_gemma_files(out_dir, tokenizer, processor, processor_class, "<turn|>")
    return out_dir
