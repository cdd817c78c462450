"""10. Hybrid models: single-stream decode of a random Qwen3.5 (Gated DeltaNet state in 3 of 4 layers) and a random
Gemma 3 (sliding windows in 5 of 6 layers), the engine over its KV-cache groups against HF generate on the same
checkpoint, side by side. Bench-sized (512 wide, 8 layers / 12 layers), so the step is the weights, not Python."""
import glob
import os
import tempfile
import time

import torch

from minivlm import Engine, EngineConfig, Request, SamplingParams

from bench.timing import Row, TokenClock, decode_rate, median, spread
from bench.workload import scene

# the text decoders at bench size (the vision towers stay at test size: decode never runs them)
SIZES = {"qwen3_5": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
                         linear_key_head_dim=64, linear_value_head_dim=64),
         "gemma3": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=8,
                        num_key_value_heads=2, head_dim=64, sliding_window=128)}


def build(family: str, out_dir: str) -> str:
    """The bench checkpoint of `family` (reused once written): the test recipe, its text config at bench size."""
    if glob.glob(os.path.join(out_dir, "*.safetensors")):
        return out_dir
    from tools.make_checkpoint import randomize
    from tools.make_checkpoint_matrix import published_processor_class
    from tools.tiny_tokenizer import family_tokenizer
    torch.manual_seed(0)
    if family == "qwen3_5":
        from tools.make_checkpoint_qwen3_5 import build_qwen3_5
        tokenizer = family_tokenizer("qwen3_vl")
        model_cls, config, processor = build_qwen3_5(tokenizer, layers=8)
        config.text_config.layer_types = (["linear_attention"] * 3 + ["full_attention"]) * 2
    else:
        from tools.make_checkpoint_gemma3 import build_gemma3
        tokenizer = family_tokenizer("gemma3")
        model_cls, config, processor = build_gemma3(tokenizer, num_hidden_layers=12)
        config.text_config.layer_types = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    for k, v in SIZES[family].items():
        setattr(config.text_config, k, v)
    if family == "qwen3_5":  # the tower's merger projects into the text width
        config.vision_config.out_hidden_size = SIZES[family]["hidden_size"]
    model = randomize(model_cls(config).eval())
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    published_processor_class(out_dir, {"qwen3_5": "Qwen3VLProcessor", "gemma3": "Gemma3Processor"}[family])
    return out_dir


def rates(path: str, repeats: int, new_tokens: int) -> tuple[list, list, bool, int]:
    """Decode tok/s of one request, engine and HF interleaved; whether their greedy tokens agree; prompt length."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from minivlm.inputs.processor import PROCESSORS  # transformers' processors minus the video slot
    engine = Engine(EngineConfig(model=path, device="cpu", dtype="float32", num_blocks=256))
    hf = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    processor = PROCESSORS[AutoConfig.from_pretrained(path).model_type][1].from_pretrained(path)
    messages = [{"role": "user", "content": [{"type": "image", "image": scene(224, 224, 7)},
                                             {"type": "text", "text": "Describe the image in one sentence."}]}]
    inputs = processor.apply_chat_template(messages, tokenize=True, return_dict=True, add_generation_prompt=True,
                                           return_tensors="pt")
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    out = {"engine": [], "hf": []}
    same = True
    for _ in range(repeats + 1):  # the first round warms both up (allocator, one-time setup): not counted
        times = []
        engine.reset_prefix_cache()
        for ev in engine.stream(Request(messages=messages), params, snapshots=False):
            times.append(time.perf_counter())
        mine = ev.output.token_ids
        clock = TokenClock()
        with torch.inference_mode():
            ids = hf.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=None, streamer=clock)[0, inputs["input_ids"].shape[1]:].tolist()
        out["engine"].append(decode_rate(times))
        out["hf"].append(decode_rate(clock.times))
        same &= mine == ids
    engine.close()
    return out["engine"][1:], out["hf"][1:], same, inputs["input_ids"].shape[1]


def measure(ctx, new_tokens: int = 64) -> list[Row]:
    rows = []
    for family, title in (("qwen3_5", "Qwen3.5"), ("gemma3", "Gemma 3")):
        if ctx.smoke:  # the test checkpoints: the same code path in seconds
            new_tokens = 8
            path = os.path.join(tempfile.gettempdir(), f"minivlm-smoke-{family}")
            if not glob.glob(os.path.join(path, "*.safetensors")):
                from tools.make_checkpoint_gemma3 import make_gemma3_checkpoint
                from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
                (make_qwen3_5_checkpoint if family == "qwen3_5" else make_gemma3_checkpoint)(path)
        else:
            path = build(family, os.path.join(tempfile.gettempdir(), f"minivlm-bench-{family}"))
        eng, hf, same, prompt = rates(path, ctx.repeats, new_tokens)
        ctx.details[f"hybrid_{family}"] = {"engine": eng, "hf": hf, "prompt_tokens": prompt}
        e, h = median(eng), median(hf)
        rows.append(Row(f"hybrid decode vs HF generate: {title}", e, h, "tok/s", e / h, ">= 1.0x", e >= h,
                        f"{new_tokens} tokens after a {prompt}-token image prompt; random {title}"
                        + ("" if ctx.smoke else f", {SIZES[family]['num_hidden_layers']} layers x "
                           f"{SIZES[family]['hidden_size']}"),
                        same=f"{int(same)}/1", spread=spread(eng, hf, "tok/s")))
    return rows
