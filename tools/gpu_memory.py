"""tools/gpu_check.py's part (2): random-weight checkpoints with a real model's exact dimensions, built on the
device itself (no large uploads), and the engine's memory on them: memory_report() vs the CUDA allocator, a
KV pool sized from free memory staying under gpu_memory_utilization at a full prefill peak, close()."""
import gc
import json
import os
import time

import torch

from minivlm import Engine, EngineConfig, Request, SamplingParams

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = ("Qwen2.5-VL-3B-Instruct", "Qwen2.5-VL-7B-Instruct")
REAL_MAX_PIXELS = 12845056  # the Qwen2.5-VL processor's own limit, so a 1024x768 image keeps its ~970 tokens


def sync(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


def free_device(device: str):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def real_config(preset: str, tokenizer, shrink: bool):
    """The hub config of `preset` (exact dimensions) with the tiny tokenizer's special-token ids; shrink=True
    keeps its structure but makes it small (the CPU dry run)."""
    from transformers import Qwen2_5_VLConfig
    with open(os.path.join(ROOT, "assets", "presets", "models", preset + ".json")) as f:
        raw = {k: v for k, v in json.load(f).items() if not k.startswith("_") and k != "model_type"}
    if shrink:
        raw.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=len(tokenizer))
        raw["vision_config"].update(depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
                                    out_hidden_size=128, fullatt_block_indexes=[1])
        raw["rope_scaling"]["mrope_section"] = [4, 6, 6]
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in
           (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
            ("eos_token_id", "<|im_end|>"), ("pad_token_id", "<|endoftext|>"))}
    raw.update(ids, bos_token_id=None)
    return Qwen2_5_VLConfig(**raw)


def build_real_checkpoint(preset: str, out_dir: str, device: str, shrink: bool) -> str:
    """Random bf16 weights with the preset's dimensions, initialised on `device` and saved (one shard)."""
    from transformers import Qwen2_5_VLForConditionalGeneration
    from tools.make_checkpoint import save_processor
    from tools.tiny_tokenizer import build_tokenizer
    if os.path.isfile(os.path.join(out_dir, "model.safetensors")):
        return out_dir
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration._from_config(real_config(preset, tokenizer, shrink),
                                                                dtype=torch.bfloat16)
    model.save_pretrained(out_dir, max_shard_size="1000GB")
    tokenizer.save_pretrained(out_dir)
    save_processor(out_dir, "qwen2_5_vl", tokenizer, max_pixels=REAL_MAX_PIXELS)
    del model
    free_device(device)
    return out_dir


def within(a: float, b: float, tol: float = 0.05) -> bool:
    return abs(a - b) <= tol * max(abs(b), 1)


def planned_activation_peak(engine) -> int:
    """The prefill/vision activation peak the memory plan reserved for this engine (minivlm.budget.estimate)."""
    from minivlm.budget import estimate
    cfg = engine.config
    return estimate(engine.hf_config, dtype=engine.model.dtype_name, kv_dtype=engine.model.dtype_name,
                    max_model_len=cfg.max_model_len, num_seqs=cfg.max_num_seqs,
                    max_num_batched_tokens=cfg.max_num_batched_tokens, block_size=cfg.block_size,
                    device_memory_bytes=2 ** 40, weights_bytes=engine.model.weights_bytes()).activation_peak_bytes


def memory_checks(preset: str, device: str, work: str, num_seqs: int, max_model_len: int) -> list[tuple]:
    """Load; compare memory_report() with the allocator; prefill num_seqs 1024x768-image requests at once with a
    pool sized from free memory: the activation peak (max_memory_allocated) stays within the plan and the device
    under gpu_memory_utilization; close() returns the pool. Returns (check, status, detail) rows."""
    from PIL import Image
    t0 = time.monotonic()
    path = build_real_checkpoint(preset, os.path.join(work, preset), device, shrink=device != "cuda")
    built = time.monotonic() - t0
    cuda, util, label = device == "cuda", 0.9, preset + ("" if device == "cuda" else " (shrunk: CPU dry run)")
    if cuda:
        free, total = torch.cuda.mem_get_info()
        base, others = torch.cuda.memory_allocated(), total - free - torch.cuda.memory_reserved()
    engine = Engine(EngineConfig(model=path, device=device, dtype="bfloat16", gpu_memory_utilization=util,
                                 max_num_seqs=num_seqs, max_model_len=max_model_len, cpu_memory_budget_bytes=2 ** 30))
    report = engine.memory_report()
    static = report.weights_bytes + report.kv_cache_bytes
    rows = [(f"{label}: load", "info", f"built {built:.0f}s; weights {report.weights_bytes / 2**30:.3g} GiB; KV pool "
             f"{report.num_blocks} blocks = {report.kv_cache_bytes / 2**30:.3g} GiB")]
    if cuda:
        allocated = torch.cuda.memory_allocated() - base
        rows.append((f"{label}: weights + KV (memory_report) vs memory_allocated",
                     "pass" if within(static, allocated) else "FAIL",
                     f"{static / 2**30:.3f} vs {allocated / 2**30:.3f} GiB (limit 5 %)"))
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    images = [Image.new("RGB", (1024, 768), (i * 7 % 256, 90, 160)) for i in range(num_seqs)]
    t = time.monotonic()
    engine.generate([Request(prompt=f"Describe picture {i}.", images=[im]) for i, im in enumerate(images)],
                    SamplingParams(max_tokens=1, ignore_eos=True))
    sync(device)
    rows.append((f"{label}: prefill {num_seqs} x 1024x768 image requests", "pass", f"{time.monotonic() - t:.1f}s"))
    planned = planned_activation_peak(engine)
    if not cuda:
        rows.append((f"{label}: activation peak planned", "info", f"{planned / 2**20:.0f} MiB"))
    if cuda:
        measured = torch.cuda.max_memory_allocated() - before
        rows.append((f"{label}: activation peak (max_memory_allocated) within the plan",
                     "pass" if measured <= 1.05 * planned else "FAIL",
                     f"{measured / 2**30:.2f} GiB measured, {planned / 2**30:.2f} GiB planned"))
        used = others + torch.cuda.max_memory_reserved()
        rows.append((f"{label}: device use at peak <= gpu_memory_utilization",
                     "pass" if used <= util * total else "FAIL",
                     f"{used / total:.1%} of {total / 2**30:.0f} GiB (limit {util:.0%}; "
                     f"others {others / 2**30:.2f} GiB)"))
    engine.close()
    if cuda:
        freed = (base + static) - torch.cuda.memory_allocated()
        kv = report.kv_cache_bytes
        rows.append((f"{label}: close() returns the KV pool", "pass" if freed >= 0.95 * kv else "FAIL",
                     f"{freed / 2**30:.2f} GiB freed of a {kv / 2**30:.2f} GiB pool"))
    else:
        rows.append((f"{label}: allocator comparisons", "skip", "CPU has no allocator counters (CUDA only)"))
    del engine
    free_device(device)
    return rows
