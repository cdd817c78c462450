"""Prove the CUDA path on a lent GPU in one command: prints a table, exits 1 if any check failed.

    python -m tools.gpu_check --out /tmp/gpu            # on a CUDA machine: sized for < 8 min on an H200
    python -m tools.gpu_check --device cpu --out /tmp/g # dry run: the same code paths at small sizes

Checks: (1) engine vs HF parity for all three families in fp32 and bf16, and the tiny model's answers on 50
fresh scenes vs HF generate; (2) random checkpoints with Qwen2.5-VL-3B's and -7B's exact dimensions (built
here, on the device): memory_report() vs the CUDA allocator, KV pool sized from free memory staying under
gpu_memory_utilization at a full prefill peak, memory returned on close() (3B, then 7B); (3) flash-attn's
paged path at block_size 256 vs SDPA over gathered blocks, FlexAttention in place at block_size 16 (its background
compile time) vs SDPA over gathered blocks, tokens/s of each, and chunked prefill under the adaptive token budget (tokens equal unchunked, the chunk sizes it chose); (4) last, with the time left,
`python -m bench --device cuda --dtype bfloat16` on the 3B-dimension checkpoint. A part that cannot run says why
in the table.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.model.backends import flash as flash_attn, paged_flex
from minivlm.inputs.processor import load_processor
from tools.gpu_chunked import chunked_rows
from tools.gpu_memory import PRESETS, build_real_checkpoint, free_device, memory_checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# Minimum seconds each part needs on an H200 (what is left of --budget-s decides whether it starts).
NEEDS_S = {"parity": 60, "tiny": 30, "memory": 90, "flash": 40, "bench": 150}


@dataclass
class Check:
    """One row of the table: status is pass, FAIL, skip (with the reason) or info (a measurement)."""
    part: str
    name: str
    status: str
    detail: str


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


# ---- (1) parity -------------------------------------------------------------------------------------------------
def parity_requests() -> list[Request]:
    from tools.scenes import sample
    pics = [sample(seed, "color")[0] for seed in (11, 12, 13)]
    return [Request(prompt="What color is the shape?", images=[pics[0]]),
            Request(prompt="Compare the two pictures.", images=pics[1:]),
            Request(prompt="Hello, how are you?")]


def load_hf(path: str, dtype, device: str):
    from transformers import AutoModelForImageTextToText
    return AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).to(device).eval()


@torch.inference_mode()
def teacher_forced(model, processor, request: Request, generated: list[int], device: str) -> torch.Tensor:
    """HF's log-softmax at each generated position, prompt + generated fed at once: [n, vocab] fp32. The prompt
    is rendered by HF's own apply_chat_template (none of the engine's prompt building on this side)."""
    inputs = processor.apply_chat_template(request.to_messages(), tokenize=True, return_dict=True,
                                           add_generation_prompt=True, return_tensors="pt").to(device)
    n = inputs["input_ids"].shape[1]
    new = torch.tensor([generated], device=device)
    ids = torch.cat([inputs["input_ids"], new], dim=1)
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                  mm_token_type_ids=torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(new)], dim=1))
    if "pixel_values" in inputs:
        kwargs.update(pixel_values=inputs["pixel_values"].to(model.dtype), image_grid_thw=inputs["image_grid_thw"])
    logits = model(**kwargs).logits[0].float()
    return torch.log_softmax(logits[n - 1:n - 1 + len(generated)], dim=-1)


def engine_outputs(path, device, dtype, requests, tokens=8, **cfg):
    with Engine(EngineConfig(model=path, device=device, dtype=dtype, max_model_len=1024, **cfg)) as engine:
        return engine.generate(requests, SamplingParams(max_tokens=tokens, ignore_eos=True, logprobs=1))


def chosen_errors(outs, refs) -> list[float]:
    """|engine logprob - reference logprob| of every token the engine chose."""
    return [abs(lp[t] - ref[i, t].item()) for out, ref in zip(outs, refs)
            for i, (t, lp) in enumerate(zip(out.token_ids, out.logprobs))]


def exact_fp32():
    """fp32 means fp32 on both sides: no TF32 in CUDA matmuls or convolutions."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def check_parity(device: str, work: str) -> list[Check]:
    """fp32 engine vs HF fp32 <= 1e-4; bf16 engine's error vs HF fp32 <= 1.5x HF bf16's own error."""
    exact_fp32()
    from tools.make_checkpoint import make_random_checkpoint
    rows, requests = [], parity_requests()
    for i, family in enumerate(FAMILIES):
        path = make_random_checkpoint(family, os.path.join(work, family), seed=i)
        processor = load_processor(path, family)
        hf32, hf16 = load_hf(path, torch.float32, device), load_hf(path, torch.bfloat16, device)
        out32 = engine_outputs(path, device, "float32", requests, num_blocks=256)
        ref32 = [teacher_forced(hf32, processor, r, o.token_ids, device) for r, o in zip(requests, out32)]
        err = max(chosen_errors(out32, ref32))
        rows.append(Check("parity", f"{family} fp32 max |dlogprob| vs HF", "pass" if err <= 1e-4 else "FAIL",
                          f"{err:.2e} (limit 1e-4) over {len(requests)} requests x 8 tokens"))
        out16 = engine_outputs(path, device, "bfloat16", requests, num_blocks=256)
        ref32 = [teacher_forced(hf32, processor, r, o.token_ids, device) for r, o in zip(requests, out16)]
        ref16 = [teacher_forced(hf16, processor, r, o.token_ids, device) for r, o in zip(requests, out16)]
        eng = sum(chosen_errors(out16, ref32)) / (8 * len(requests))
        own = [abs(a[i, t] - b[i, t]).item() for o, a, b in zip(out16, ref16, ref32) for i, t in enumerate(o.token_ids)]
        hf = sum(own) / len(own)
        ok = eng <= 1.5 * hf + 1e-6
        rows.append(Check("parity", f"{family} bf16 mean |dlogprob| vs HF fp32", "pass" if ok else "FAIL",
                          f"engine {eng:.2e}, HF bf16 {hf:.2e} ({eng / max(hf, 1e-12):.2f}x; limit 1.5x)"))
        del hf32, hf16
        free_device(device)
    return rows


def check_tiny_answers(device: str, n: int) -> list[Check]:
    """The shipped tiny model's greedy answers on n fresh scenes: the engine's equal HF generate's (same device)."""
    exact_fp32()
    from tools.eval_tiny import EVAL_SEED, items
    from tools.scenes import QUESTION_TYPES
    model_dir = os.path.join(ROOT, "assets", "tiny-qwen-vl")
    per = math.ceil(n / len(QUESTION_TYPES))
    data = [x for q in QUESTION_TYPES for x in items(q, per, EVAL_SEED + 424_242)][:n]  # unlike any eval run's
    with Engine(EngineConfig(model=model_dir, device=device, dtype="float32")) as engine:
        ours = [o.text.strip() for o in engine.generate([Request(messages=m) for m, _ in data],
                                                        SamplingParams(max_tokens=4))]
    model, processor = load_hf(model_dir, torch.float32, device), load_processor(model_dir, "qwen3_vl")
    theirs = []
    for messages, _ in data:  # one at a time: no padding, the plainest HF generate
        batch = processor.apply_chat_template([messages], add_generation_prompt=True, tokenize=True,
                                              return_dict=True, return_tensors="pt").to(device)
        with torch.inference_mode():
            new = model.generate(**batch, max_new_tokens=4, do_sample=False)[0, batch["input_ids"].shape[1]:]
        theirs.append(processor.tokenizer.decode(new, skip_special_tokens=True).strip())
    same = sum(a == b for a, b in zip(ours, theirs))
    right = sum(a == truth for a, (_, truth) in zip(ours, data))
    return [Check("parity", f"tiny model answers = HF generate ({n} fresh scenes)",
                  "pass" if same == n else "FAIL", f"{same}/{n} equal; engine accuracy {right}/{n}")]


# ---- (2) real dimensions: memory (tools/gpu_memory.py) ------------------------------------------------------------
def check_memory(preset: str, device: str, work: str, num_seqs: int, max_model_len: int) -> list[Check]:
    """See gpu_memory.memory_checks."""
    return [Check("memory", *row) for row in memory_checks(preset, device, work, num_seqs, max_model_len)]


# ---- (3) paged attention: flash-attn vs SDPA ------------------------------------------------------------------------
def decode_tokens_per_s(engine, request: Request, tokens: int = 64) -> float:
    from bench.timing import decode_rate
    engine.reset_prefix_cache()
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    return decode_rate([time.perf_counter() for _ in engine.stream(request, params, snapshots=False)])


def picked(engine, flash: bool, flex: bool = False) -> Engine:
    """An engine on the same weights whose attention backend was picked (once, as every engine's is) with or
    without flash-attn's kernels and FlexAttention's in-place path (paged_flex, compiling in the background)."""
    devices, enabled = set(paged_flex.DEVICES), flash_attn.ENABLED
    flash_attn.ENABLED = flash
    paged_flex.DEVICES = devices | {engine.device.type} if flex else devices - {engine.device.type}
    try:
        return engine.isolated()
    finally:
        flash_attn.ENABLED, paged_flex.DEVICES = enabled, devices


def run_outputs(engine):
    """Outputs of 4 image requests, and single-stream decode tokens/s."""
    requests = parity_requests()[:2] * 2
    engine.reset_prefix_cache()
    outs = engine.generate(requests, SamplingParams(max_tokens=24, ignore_eos=True, logprobs=1))
    return outs, decode_tokens_per_s(engine, requests[0])


def attention_run(engine, flash: bool):
    with picked(engine, flash) as e:
        return run_outputs(e)


def compare_outputs(a, b) -> tuple[int, int, float]:
    """(sequences with equal tokens, sequences, max |dlogprob| of the chosen tokens up to the first difference)."""
    same, worst = 0, 0.0
    for x, y in zip(a, b):
        same += x.token_ids == y.token_ids
        for t, u, lx, ly in zip(x.token_ids, y.token_ids, x.logprobs, y.logprobs):
            if t != u:
                break
            worst = max(worst, abs(lx[t] - ly[t]))
    return same, len(a), worst


def check_attention(device: str, work: str) -> list[Check]:
    """SDPA at block_size 256 equals SDPA at 16; flash-attn at 256 equals SDPA at 256 (where it installs)."""
    cuda = device == "cuda"
    path = build_real_checkpoint(PRESETS[0], os.path.join(work, PRESETS[0]), device, shrink=not cuda)
    dtype = "bfloat16" if cuda else "float32"
    engine = Engine(EngineConfig(model=path, device=device, dtype=dtype, block_size=256, num_blocks=32,
                                 max_model_len=2048))  # loaded once; the block-16 engine shares its weights
    with engine, engine.isolated(block_size=16, num_blocks=512) as small_blocks:
        return attention_rows(engine, small_blocks, dtype) + \
            chunked_rows(small_blocks, lambda name, status, detail: Check("chunked", name, status, detail))


def attention_rows(engine, small_blocks, dtype: str) -> list[Check]:
    tol = 1e-4 if dtype == "float32" else 2e-2
    small, small_rate = attention_run(small_blocks, flash=False)
    sdpa, sdpa_rate = attention_run(engine, flash=False)
    same, n, worst = compare_outputs(small, sdpa)
    rows = [Check("attention", "SDPA over gathered blocks: block_size 256 vs 16", "pass" if worst <= tol else "FAIL",
                  f"tokens equal {same}/{n}; max |dlogprob| {worst:.2e} (limit {tol:g})")]
    rows += flex_rows(small_blocks, small, small_rate, tol)
    if flash_attn.flash_attn_with_kvcache is None:
        why = ("flash-attn is not installed: PyPI has no binary wheel (source only, a long nvcc build), so carry a "
               "wheel built for this torch/CUDA" if engine.device.type == "cuda" else "flash-attn runs on CUDA only")
        rows.append(Check("attention", "flash-attn paged kernels vs SDPA", "skip", why))
        rows.append(Check("attention", "SDPA single-stream decode", "info", f"{sdpa_rate:.1f} tok/s ({dtype})"))
        return rows
    flash, flash_rate = attention_run(engine, flash=True)
    same, n, worst = compare_outputs(sdpa, flash)
    rows.append(Check("attention", "flash-attn paged (block 256) vs SDPA", "pass" if worst <= tol else "FAIL",
                      f"tokens equal {same}/{n}; max |dlogprob| {worst:.2e} (limit {tol:g})"))
    rows.append(Check("attention", "single-stream decode: flash-attn vs SDPA", "info",
                      f"{flash_rate:.1f} vs {sdpa_rate:.1f} tok/s ({flash_rate / sdpa_rate:.2f}x)"))
    return rows


def flex_rows(engine, gathered, gathered_rate: float, tol: float) -> list[Check]:
    """FlexAttention in place at block_size 16 (the default) against SDPA over gathered blocks on the same weights:
    its compile (on the engine's background thread), outputs and single-stream decode rate."""
    with picked(engine, flash=False, flex=True) as flexed:
        return flex_checks(flexed, gathered, gathered_rate, tol)


def flex_checks(engine, gathered, gathered_rate: float, tol: float) -> list[Check]:
    attention = engine.core.runner.backend.attention
    if getattr(attention, "warmup", None) is None:
        return [Check("attention", "FlexAttention in place (block 16)", "skip", engine.attention_backend)]
    attention.warmup.join(timeout=240)
    state = attention.status()
    if state != "ready":
        return [Check("attention", "FlexAttention in place (block 16)", "FAIL", f"not ready after 240 s: {state}")]
    pool = attention.key
    flex, rate = run_outputs(engine)
    same, n, worst = compare_outputs(gathered, flex)
    state = attention.status()  # a bucket that failed its first-use check says so here
    return [Check("attention", "FlexAttention in place vs SDPA gathered (block 16)",
                  "pass" if worst <= tol and state == "ready" else "FAIL",
                  f"tokens equal {same}/{n}; max |dlogprob| {worst:.2e} (limit {tol:g}); status {state}"),
            Check("attention", "FlexAttention: compile, single-stream decode", "info",
                  f"compiled in {paged_flex.compile_s.get(pool, float('nan')):.1f} s on a background thread; "
                  f"{rate:.1f} vs {gathered_rate:.1f} tok/s gathered ({rate / gathered_rate:.2f}x)")]


# ---- (4) the bench -------------------------------------------------------------------------------------------------
def check_bench(device: str, work: str, out: str, budget: Budget) -> list[Check]:
    """python -m bench on the 3B-dimension checkpoint (CPU: the bench's smoke model), its markdown table kept in
    `out` for bench/RESULTS.md; it runs last and gets whatever time is left."""
    path = build_real_checkpoint(PRESETS[0], os.path.join(work, PRESETS[0]), device, shrink=device != "cuda")
    timeout = max(budget.left() - 5, 60)
    md = os.path.join(out, f"bench_{device}.md")
    cmd = [sys.executable, "-m", "bench", "--device", device, "--markdown", md, "--json", md[:-3] + ".json"]
    cmd += (["--dtype", "bfloat16", "--quick", "--only", "throughput", "single_stream", "--checkpoint-dir", path]
            if device == "cuda" else
            ["--smoke", "--repeats", "1", "--only", "throughput", "single_stream",
             "--checkpoint-dir", os.path.join(os.path.dirname(path), "bench-smoke")])
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [Check("bench", " ".join(cmd[1:5]), "FAIL", f"did not finish in {timeout:.0f}s")]
    if done.returncode != 0:
        return [Check("bench", " ".join(cmd[1:5]), "FAIL", done.stderr.strip().splitlines()[-1][:200])]
    print(done.stdout)
    return [Check("bench", " ".join(cmd[1:5]), "pass", f"table in {md}")]


# ---- the command ---------------------------------------------------------------------------------------------------
def run_part(rows: list, budget: Budget, part: str, fn, *args):
    """Run one part if the wall-time budget still allows it; an exception becomes a FAIL row, not a crash."""
    if budget.left() < NEEDS_S[part]:
        rows.append(Check(part, fn.__name__, "skip",
                          f"wall-time budget: {budget.left():.0f}s left, needs ~{NEEDS_S[part]}s"))
        return
    t = time.monotonic()
    try:
        rows += fn(*args)
    except Exception as e:  # noqa: BLE001 -- the table must still print
        rows.append(Check(part, fn.__name__, "FAIL", f"{type(e).__name__}: {e}"[:300]))
    print(f"[gpu_check] {part} {fn.__name__}{args[:1]}: {time.monotonic() - t:.0f}s, {budget.left():.0f}s left",
          flush=True)


def table(rows: list[Check]) -> str:
    lines = ["| part | check | result | detail |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {r.part} | {r.name} | {r.status} | {r.detail} |" for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu = dry run at small sizes")
    ap.add_argument("--budget-s", type=float, default=450, help="wall-time budget; parts that would overrun skip")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "minivlm-gpu-check"), help="reports go here")
    ap.add_argument("--work", help="where checkpoints are built (default: <out>/checkpoints)")
    ap.add_argument("--skip", nargs="*", default=[], choices=list(NEEDS_S), help="parts not to run")
    args = ap.parse_args(argv)
    budget, cuda, rows = Budget(args.budget_s), args.device == "cuda", []
    work = args.work or os.path.join(args.out, "checkpoints")
    os.makedirs(work, exist_ok=True)
    if cuda and not torch.cuda.is_available():
        rows.append(Check("all", "CUDA", "skip",
                          "no CUDA GPU visible to this torch build; `--device cpu` is the dry run"))
    else:
        parts = [("parity", check_parity, args.device, work),
                 ("tiny", check_tiny_answers, args.device, 50 if cuda else 5)]
        seqs, max_len = (128, 32768) if cuda else (2, 2048)  # CUDA: a pool sized by free memory, not by the cap
        parts += [("memory", check_memory, PRESETS[0], args.device, work, seqs, max_len),
                  ("memory", check_memory, PRESETS[1], args.device, work, seqs, max_len),
                  ("flash", check_attention, args.device, work),
                  ("bench", check_bench, args.device, work, args.out, budget)]
        for part, fn, *fn_args in parts:
            if part not in args.skip:
                run_part(rows, budget, part, fn, *fn_args)
    text = table(rows)
    with open(os.path.join(args.out, f"gpu_check_{args.device}.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    failed = [r for r in rows if r.status == "FAIL"]
    print(f"[gpu_check] {len(failed)} failed, {sum(r.status == 'skip' for r in rows)} skipped, "
          f"{budget.left():.0f}s of the budget left")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
