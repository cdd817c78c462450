"""Random-weight checkpoints of the families beyond Qwen-VL, in their published layout: SmolVLM2 / Idefics3 (SigLIP
+ pixel shuffle + Llama, tiles + a global view), InternVL3.5 (InternViT + pixel-shuffle MLP + Qwen3 or Qwen2,
448-px crops + a thumbnail, scaled down) and text-only Qwen2 / Qwen3, each saved by transformers with its processor;
the CLI also makes the hybrid ones (tools/make_checkpoint_qwen3_5.py, tools/make_checkpoint_gemma3.py,
tools/make_checkpoint_gemma4.py, tools/make_checkpoint_gemma4_unified.py)."""
import json
import os

# torch and transformers are imported where used, so that `--help` answers at once

TILE, PATCH = 64, 8           # a tile of 64 px in 8-px patches: 64 patches, 16 tokens after a 2x pixel shuffle
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // 4


def text_config(tokenizer, decoder: str, tie: bool, **overrides) -> dict:
    """A small decoder of the family's text architecture (llama, qwen2 or qwen3)."""
    cfg = dict(model_type=decoder, vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=tie,
               rope_parameters={"rope_type": "default", "rope_theta": 100000.0 if decoder == "llama" else 1e6},
               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    cfg.update(overrides)
    return cfg


def build(family: str, tokenizer, decoder: str | None, tie: bool):
    """(model class, config, processor) for one family, at test size."""
    from transformers import (Idefics3Config, Idefics3ForConditionalGeneration, InternVLConfig,
                              InternVLForConditionalGeneration, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM, SmolVLMConfig, SmolVLMForConditionalGeneration)
    from transformers.models.got_ocr2 import GotOcr2ImageProcessorPil
    from transformers.models.idefics3 import Idefics3ImageProcessorPil
    from transformers.models.smolvlm import SmolVLMImageProcessorPil

    from minivlm.families import get_family
    processor_class = get_family(family).processor_class
    if family in ("smolvlm", "idefics3"):
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      image_size=TILE, patch_size=PATCH)
        cfg_cls, model_cls, ip_cls = ((SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil)
                                      if family == "smolvlm" else
                                      (Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil))
        config = cfg_cls(text_config=text_config(tokenizer, "llama", tie), vision_config=vision, scale_factor=2,
                         image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=tie)
        image_processor = ip_cls(size={"longest_edge": 2 * TILE}, max_image_size={"longest_edge": TILE},
                                 do_image_splitting=True, image_mean=[0.5] * 3, image_std=[0.5] * 3)
        processor = processor_class(image_processor, tokenizer, image_seq_len=TOKENS_PER_TILE,
                                    chat_template=tokenizer.chat_template)
        return model_cls, config, processor
    if family == "internvl":
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      image_size=TILE, patch_size=PATCH, use_mean_pooling=True)
        extra = {"qwen3": {}, "qwen2": {"head_dim": 16}}[decoder]
        config = InternVLConfig(text_config=text_config(tokenizer, decoder, tie, **extra), vision_config=vision,
                                image_token_id=tokenizer.context_image_token_id, image_seq_length=TOKENS_PER_TILE,
                                downsample_ratio=0.5, tie_word_embeddings=tie)
        image_processor = GotOcr2ImageProcessorPil(size={"height": TILE, "width": TILE}, crop_to_patches=True,
                                                   min_patches=1, max_patches=6, image_mean=[0.5] * 3,
                                                   image_std=[0.5] * 3)
        processor = processor_class(image_processor, tokenizer, image_seq_length=TOKENS_PER_TILE,
                                    chat_template=tokenizer.chat_template)
        return InternVLForConditionalGeneration, config, processor
    if family in ("qwen2", "qwen3"):
        cfg = text_config(tokenizer, family, tie)
        cfg.pop("model_type")
        return ((Qwen2ForCausalLM, Qwen2Config(**cfg), None) if family == "qwen2"
                else (Qwen3ForCausalLM, Qwen3Config(**cfg), None))
    raise ValueError(f"no checkpoint recipe for {family!r}")


def published_processor_class(out_dir: str, name: str):
    """processor_config.json names transformers' class (SmolVLMProcessor, ...) as the hub checkpoints do, not ours."""
    path = os.path.join(out_dir, "processor_config.json")
    with open(path) as f:
        saved = json.load(f)
    saved["processor_class"] = name
    with open(path, "w") as f:
        json.dump(saved, f, indent=2)


def make_matrix_checkpoint(family: str, out_dir: str, seed: int = 0, decoder: str | None = None,
                           tie: bool = False) -> str:
    """Write a random-weight checkpoint of `family` (decoder: InternVL's text model, qwen3 or qwen2) to out_dir."""
    import torch

    from tools.make_checkpoint import randomize
    from tools.tiny_tokenizer import family_tokenizer
    torch.manual_seed(seed)
    tokenizer = family_tokenizer(family)
    model_cls, config, processor = build(family, tokenizer, decoder or "qwen3", tie)
    model = randomize(model_cls(config).eval())
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if processor is not None:
        processor.save_pretrained(out_dir)
        published_processor_class(out_dir, type(processor).__mro__[1].__name__)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}, f)
    return out_dir


# every family a test checkpoint can be made of: name -> (what it is, how it is built)
CLI_FAMILIES = {
    "qwen2_vl": "Qwen2-VL: native-resolution patches, M-RoPE, video",
    "qwen2_5_vl": "Qwen2.5-VL: as Qwen2-VL, windowed ViT, time in M-RoPE seconds",
    "qwen3_vl": "Qwen3-VL: deepstack, q/k norm, video with timestamps",
    "smolvlm": "SmolVLM2: SigLIP tiles + a global view, pixel shuffle, Llama",
    "idefics3": "SmolVLM (Idefics3): as SmolVLM2, Idefics3's classes",
    "internvl": "InternVL3.5 (-HF): InternViT crops + a thumbnail; --decoder qwen3 (default) or qwen2",
    "qwen3_5": "Qwen3.5: Gated DeltaNet (recurrent state) in 3 of 4 layers, Qwen3-VL's tower without deepstack",
    "gemma3": "Gemma 3: sliding-window layers (window 24) and a global one, SigLIP, images attend both ways",
    "gemma4": "Gemma 4 (E2B-like): shared-KV layers, sliding + full layers with their own head sizes, per-layer "
              "embeddings, its variable-resolution tower (70 soft tokens), an audio tower (audio input refused)",
    "gemma4_unified": "Gemma 4 12B-like: no vision encoder (merged 48-px patches through norms and one linear), "
                      "sliding + full layers (keys as values), the last 4 sharing K/V, images both ways",
    "qwen2": "Qwen2 / Qwen2.5 text-only (no images)",
    "qwen3": "Qwen3 text-only (no images)",
}
VIDEO_LAYOUTS = {  # tools.make_checkpoint.VIDEO_LAYOUTS, in a word each (tests/test_make_checkpoint_cli.py: same keys)
    "file": "video_preprocessor_config.json (the default)",
    "nested": "processor_config.json's \"video_processor\" (transformers 5's save_pretrained)",
    "published": "only the image processor's preprocessor_config.json (published Qwen2/2.5-VL)",
}


def main(argv=None) -> str:
    """python -m tools.make_checkpoint_matrix FAMILY OUT_DIR [--seed N] [--decoder ...] [--tie] [--video-layout ...]"""
    import argparse
    width = max(map(len, CLI_FAMILIES))
    parser = argparse.ArgumentParser(
        prog="python -m tools.make_checkpoint_matrix", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write a random-weight test checkpoint of one family, scaled down but in its published layout "
                    "(config, safetensors, tokenizer, chat template, processor), offline; then run "
                    "`python app.py --model OUT_DIR`. Its answers are noise: it is for trying the engine, the "
                    "app and the tests on a family without downloading one.",
        epilog="families:\n" + "\n".join(f"  {k:<{width}}  {v}" for k, v in CLI_FAMILIES.items())
               + "\n\nvideo layouts (Qwen-VL families):\n"
               + "\n".join(f"  {k:<{width}}  {v}" for k, v in VIDEO_LAYOUTS.items()))
    parser.add_argument("family", choices=list(CLI_FAMILIES), metavar="FAMILY", help="one of the families below")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.add_argument("--decoder", choices=("qwen3", "qwen2"), default=None,
                        help="InternVL's text model (default qwen3)")
    parser.add_argument("--tie", action="store_true", default=None,
                        help="tie the input and output embeddings (the Qwen-VL test checkpoints always do)")
    parser.add_argument("--video-layout", choices=list(VIDEO_LAYOUTS), default="file",
                        help="where a Qwen-VL checkpoint keeps its video processor (default file)")
    args = parser.parse_args(argv)
    if args.decoder and args.family != "internvl":
        parser.error("--decoder is InternVL's text model; other families have one decoder")
    qwen_vl = args.family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
    if args.tie is not None and qwen_vl:
        parser.error("--tie: the Qwen-VL test checkpoints always tie their embeddings")
    if args.video_layout != "file" and not qwen_vl:
        parser.error("--video-layout is for the Qwen-VL families (the others take no video)")
    if qwen_vl:
        from tools.make_checkpoint import make_random_checkpoint
        path = make_random_checkpoint(args.family, args.out_dir, seed=args.seed, video_layout=args.video_layout)
    elif args.family == "qwen3_5":
        from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
        path = make_qwen3_5_checkpoint(args.out_dir, seed=args.seed, tie=bool(args.tie))
    elif args.family == "gemma3":
        from tools.make_checkpoint_gemma3 import make_gemma3_checkpoint
        path = make_gemma3_checkpoint(args.out_dir, seed=args.seed, **({} if args.tie is None else {"tie": args.tie}))
    elif args.family == "gemma4":
        from tools.make_checkpoint_gemma4 import make_gemma4_checkpoint
        path = make_gemma4_checkpoint(args.out_dir, seed=args.seed, **({} if args.tie is None else {"tie": args.tie}))
    elif args.family == "gemma4_unified":
        from tools.make_checkpoint_gemma4_unified import make_gemma4_unified_checkpoint
        path = make_gemma4_unified_checkpoint(args.out_dir, seed=args.seed,
                                              **({} if args.tie is None else {"tie": args.tie}))
    else:
        path = make_matrix_checkpoint(args.family, args.out_dir, seed=args.seed, decoder=args.decoder,
                                      tie=bool(args.tie))
    print(f"wrote a random {args.family} checkpoint to {path}; try it: python app.py --model {path}")
    return path


if __name__ == "__main__":
    main()
