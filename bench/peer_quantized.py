"""The llama.cpp peer's precision rows (issue #44 item 5): on a ~340M random checkpoint (workload.PEER_MODEL, too
big for the CPU cache), single-stream decode tok/s after a 224x224 image prompt of engine fp32 / bf16 / int8 / int4
against llama.cpp f32 / f16 / Q8_0 / Q4_K_M in one run, timed by token arrival on both sides, first on a quiet
machine and then beside one busy process (another tenant spinning on a core). Each row says each side's accuracy
against its own fp32: greedy tokens equal and the largest |Δ logprob| of the chosen token while they are."""
import os
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace

import torch

from minivlm import Engine, EngineConfig, Request
from minivlm.inputs.processor import load_processor

from bench import llamacpp_build, llamacpp_server
from bench.gguf_convert import ensure_gguf, ensure_quantized
from bench.quantized import agreement, run
from bench.timing import Row, decode_rate, median, spread
from bench.workload import FAMILY, PEER_MODEL, build_checkpoint, param_count, scene

# (engine variant, its EngineConfig, the llama.cpp type of about the same bytes per weight, goal of the quiet ratio)
# int8 / int4 as dtype="auto" runs them: an fp32 engine, the fused C ops around the quantized products
PAIRS = [("fp32", dict(dtype="float32"), "f32", None),
         ("bf16", dict(dtype="bfloat16"), "f16", 1.0),
         ("int8", dict(quantization="int8"), "q8_0", 1.0),
         ("int4", dict(quantization="int4"), "q4_k_m", None)]
CONVERTER_TYPES = ("f32", "f16", "q8_0")  # convert_hf_to_gguf writes these; Q4_K_M needs llama-quantize
SETTLE = 0.5  # seconds between one side's run and the next: llama.cpp's threads poll for work for a while after a
# request (its --poll), and a run started at once would share the cores with them (both sides get the same pause)
BUSY_KEEP = 0.8  # goal: beside a busy process the engine keeps >= 80 % of its quiet ratio against llama.cpp
# --smoke: the same path on a model that loads in a second, with widths int4's groups and Q4_K's 256-blocks divide
SMOKE_PEER_MODEL = dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512,
                        vision_depth=2, vision_hidden=64, vision_heads=2, tie=True)
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
              "amx_bf16", "amx_int8")  # what decides the int8/bf16 kernels either side can pick


def cpu_flags(path: str = "/proc/cpuinfo") -> str:
    """'avx2 fma ...; absent: avx512f ...': the SIMD features a reader needs to compare the quantized rows."""
    try:
        with open(path) as f:
            flags = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return "unknown (no /proc/cpuinfo)"
    have, absent = [f for f in SIMD_FLAGS if f in flags], [f for f in SIMD_FLAGS if f not in flags]
    return f"{' '.join(have) or 'none of ' + SIMD_FLAGS[0]}; absent: {' '.join(absent) or 'none'}"


def peer_dir(model_dir: str, smoke: bool) -> str:
    """The peer checkpoint's own directory, beside the bench checkpoint's."""
    name = "minivlm-bench-peer-smoke" if smoke else "minivlm-bench-qwen2_5_vl-340m"
    return os.path.join(os.path.dirname(os.path.normpath(model_dir)), name)


def prepare(model_dir: str, log=print) -> dict:
    """Each llama.cpp type's (model, mmproj) GGUF pair; the mmproj is f16 except beside f32 (prefill only)."""
    files = {}
    for _, _, qtype, _ in PAIRS:
        if qtype in CONVERTER_TYPES:
            files[qtype] = ensure_gguf(model_dir, qtype, log=log, mmproj_type="f32" if qtype == "f32" else "f16")
        else:
            files[qtype] = ensure_quantized(model_dir, qtype, llamacpp_build.binary("llama-quantize"), log=log,
                                            threads=torch.get_num_threads())
    return files


@contextmanager
def busy_core():
    """A separate process spinning on one core for as long as the block runs."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it get going before anything is timed
        yield proc
    finally:
        proc.kill()
        proc.wait()


def llama_output(tokens: list[int], logprobs: list[float]):
    """llama.cpp's reply in the shape quantized.agreement reads (token ids, per-token {id: logprob})."""
    probs = [{t: lp} for t, lp in zip(tokens, logprobs)] if len(logprobs) == len(tokens) else None
    return SimpleNamespace(token_ids=tokens, logprobs=probs)


def compare(out, ref) -> tuple[int, float | None]:
    """Greedy tokens equal to ref's and max |Δ logprob| while equal (None where either has no logprobs)."""
    if out.logprobs is None or ref.logprobs is None:
        same = next((i for i, (a, b) in enumerate(zip(out.token_ids, ref.token_ids)) if a != b),
                    min(len(out.token_ids), len(ref.token_ids)))
        return same, None
    return agreement(out, ref)


def timed_phase(engines: dict, servers: dict, request, body: dict, new_tokens: int, repeats: int) -> dict:
    """Interleaved repeats (engine fp32, llama.cpp f32, engine bf16, llama.cpp f16, ...): tok/s and the last
    outputs of each side."""
    res = {"engine": {n: [] for n in engines}, "llama": {q: [] for q in servers}, "outs": {}, "replies": {}}
    res["load"] = [os.getloadavg()[0]]  # other tenants move both sides' rates: the reader sees how busy it was
    for _ in range(repeats):
        for name, _, qtype, _ in PAIRS:
            time.sleep(SETTLE)
            rate, res["outs"][name] = run(engines[name], request, new_tokens)
            res["engine"][name].append(rate)
            logprobs = []
            time.sleep(SETTLE)
            times, tokens, _ = servers[qtype].stream(body, logprobs)
            res["llama"][qtype].append(decode_rate(times))
            res["replies"][qtype] = llama_output(tokens, logprobs)
    res["load"].append(os.getloadavg()[0])
    return res


def fmt_worst(same: int, worst: float | None) -> str:
    if worst is None:
        return "n/a (no logprobs returned)"
    return "n/a (first token differs)" if same == 0 else f"{worst:.3f}"


def fmt_load(phase: dict) -> str:
    return "–".join(f"{x:.1f}" for x in phase["load"])


def quiet_row(label, name, qtype, goal, quiet, engine, gguf_mb, new_tokens) -> Row:
    eng, peer = median(quiet["engine"][name]), median(quiet["llama"][qtype])
    same, worst = compare(quiet["outs"][name], quiet["outs"]["fp32"])
    l_same, l_worst = compare(quiet["replies"][qtype], quiet["replies"]["f32"])
    l_eng, _ = compare(quiet["replies"][qtype], quiet["outs"]["fp32"])
    mine = ("engine fp32 is the reference" if name == "fp32" else
            f"engine greedy = engine fp32 on {same}/{new_tokens}, max |Δ logprob| {fmt_worst(same, worst)} "
            "while equal")
    theirs = ("" if qtype == "f32" else f"llama.cpp greedy = llama.cpp f32 on {l_same}/{new_tokens}, max |Δ logprob| "
              f"{fmt_worst(l_same, l_worst)} while equal; ")
    return Row(f"{label} single-stream decode, engine {name} vs llama.cpp {qtype.upper()}", eng, peer, "tok/s",
               eng / peer, f">= {goal}x" if goal else "(context)", eng / peer >= goal if goal else None,
               f"{new_tokens} tokens after a 224x224 image prompt, both timed by token arrival; {mine}; {theirs}"
               f"llama.cpp = engine fp32 on {l_eng}/{new_tokens}; weights: engine "
               f"{engine.memory_report().weights_bytes / 2**20:.0f} MiB ({engine.linear_backend}), GGUF "
               f"{gguf_mb:.0f} MB; decode: {engine.decode_backend}{calibrated(engine)}; 1-min load average "
               f"{fmt_load(quiet)} over the quiet phase",
               spread=spread(quiet["engine"][name], quiet["llama"][qtype], "tok/s"))


def calibrated(engine) -> str:
    """"; " and the engine's timed choice at load, where it timed one."""
    return f"; {engine.calibration}" if engine.calibration else ""


def busy_row(label, name, qtype, quiet, busy) -> Row:
    eq, pq = median(quiet["engine"][name]), median(quiet["llama"][qtype])
    eb, pb = median(busy["engine"][name]), median(busy["llama"][qtype])
    threshold = BUSY_KEEP * eq / pq
    return Row(f"{label} single-stream decode, engine {name} vs llama.cpp {qtype.upper()}, one busy core", eb, pb,
               "tok/s", eb / pb, f">= {threshold:.2f}x ({BUSY_KEEP} x quiet)", eb / pb >= threshold,
               f"a separate process spins on one core beside both sides; busy/quiet tok/s: engine keeps {eb / eq:.0%}, "
               f"llama.cpp keeps {pb / pq:.0%}; the ratio keeps {eb / pb / (eq / pq):.0%} of its quiet {eq / pq:.2f}x; "
               f"1-min load average {fmt_load(busy)} (quiet {fmt_load(quiet)}; the spinner adds 1)",
               spread=spread(busy["engine"][name], busy["llama"][qtype], "tok/s"))


def measure(ctx, bench_dir: str, new_tokens: int = 48, log=print) -> list[Row]:
    model_dir = build_checkpoint(peer_dir(bench_dir, ctx.smoke), SMOKE_PEER_MODEL if ctx.smoke else PEER_MODEL)
    files = prepare(model_dir, log=log)
    threads, log_dir = torch.get_num_threads(), os.path.dirname(files["f32"][0])
    request = Request(prompt="Describe the image in one sentence.", images=[scene(224, 224, 7)])
    processor = load_processor(model_dir, FAMILY)  # the peer checkpoint's own chat template and image processor
    body = llamacpp_server.request_body(processor, request, new_tokens, logprobs=True)
    with ExitStack() as stack:
        engines = {}
        for name, kw, _, _ in PAIRS:  # all stay loaded (~2.6 GB in all) so that the repeats interleave
            config = EngineConfig(model=model_dir, device="cpu", max_model_len=1024, num_blocks=256, **kw)
            engines[name] = Engine(config)
            stack.callback(engines[name].close)
        servers = {q: stack.enter_context(llamacpp_server.start(llamacpp_build.binary("llama-server"), *files[q],
                                                                threads, 1, log_dir)) for _, _, q, _ in PAIRS}
        for name, _, qtype, _ in PAIRS:  # warm-up: first calls pay one-time costs (allocator, graph set-up)
            run(engines[name], request, 4)
            servers[qtype].stream({**body, "n_predict": 4})
        t = time.perf_counter()
        quiet = timed_phase(engines, servers, request, body, new_tokens, ctx.repeats)
        log(f"[bench] peer precision rows, quiet: {time.perf_counter() - t:.1f}s")
        with busy_core():
            busy = timed_phase(engines, servers, request, body, new_tokens, ctx.repeats)
        log(f"[bench] peer precision rows, one busy core: {time.perf_counter() - t:.1f}s in all")
        params = param_count(model_dir)
        label = f"{params / 1e6:.0f}M"
        ctx.details["peer_llamacpp_precision"] = {
            "model_dir": model_dir, "params": params, "label": label, "cpu_flags": cpu_flags(),
            **{phase: {k: res[k] for k in ("engine", "llama", "load")}
               for phase, res in (("quiet", quiet), ("busy", busy))}}
        rows = []
        for name, _, qtype, goal in PAIRS:
            rows.append(quiet_row(label, name, qtype, goal, quiet, engines[name],
                                  os.path.getsize(files[qtype][0]) / 1e6, new_tokens))
        rows += [busy_row(label, name, qtype, quiet, busy) for name, _, qtype, _ in PAIRS]
        return rows


def header_lines(details: dict) -> str:
    """The header lines the precision rows add: their checkpoint and the CPU's SIMD flags."""
    info = details.get("peer_llamacpp_precision")
    if not info:
        return ""
    return (f"\npeer precision rows ({info['label']} lines): random Qwen2.5-VL architecture, "
            f"{info['params'] / 1e6:.1f}M parameters ({info['model_dir']})\ncpu flags: {info['cpu_flags']}")
