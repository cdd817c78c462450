"""python -m bench [--quick]: minivlm against HF transformers on one random Qwen2.5-VL checkpoint, one table.
Each run is recorded in bench/results/<machine>.json (the newest figure of each row per machine);
--markdown bench/RESULTS.md renders the results page from every machine's record."""
import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch
import transformers

from bench import results, results_page, steal
from bench import (busy_machine, chunked_prefill, events_overhead, hybrid_decode, kv_events_overhead, long_context,
                   memory, panel_overhead, peer_llamacpp, prefix_cache, quantized, single_stream, speculative,
                   structured_decode, throughput, timeline_overhead)
from bench import speculative_mtp, step_overhead
from bench.report import machine, text_table
from bench.workload import (BENCH_MODEL, SMOKE_MODEL, build_checkpoint, hf_generate, load_hf, make_engine,
                            mixed_requests, param_count)
from minivlm import SamplingParams

MEASUREMENTS = {"throughput": throughput.measure, "single_stream": single_stream.measure,
                "prefix_cache": prefix_cache.measure, "memory": memory.measure, "panel": panel_overhead.measure,
                "events": events_overhead.measure, "timeline": timeline_overhead.measure,
                "chunked_prefill": chunked_prefill.measure,
                "kv_events": kv_events_overhead.measure, "long_context": long_context.measure,
                "hybrid_decode": hybrid_decode.measure, "speculative": speculative.measure,
                "speculative_mtp": speculative_mtp.measure, "structured_decode": structured_decode.measure,
                "quantized": quantized.measure,
                "busy_machine": busy_machine.measure, "step_overhead": step_overhead.measure}
PEERS = {"llamacpp": peer_llamacpp.measure}  # other engines on the same checkpoint: run only when asked (--peer)
GROUPS = list(MEASUREMENTS) + ["peer " + name for name in PEERS]  # the order of the rows on the results page


@dataclass
class Context:
    """What every measurement gets: the engine, HF's model and processor on the same checkpoint, repeats."""
    engine: object
    hf_model: object
    hf_processor: object
    repeats: int
    details: dict = field(default_factory=dict)
    smoke: bool = False  # the tiny test model: measurements that build models of their own build test-size ones


def run(model_dir: str, repeats: int, only=None, hf_onednn=False, device="cpu", dtype="float32",
        log=print, peers=(), smoke: bool = False) -> tuple[list, dict]:
    """Run the measurements (all, or the names in `only`), then the `peers`, on the checkpoint; returns
    (rows, details)."""
    engine = make_engine(model_dir, device, dtype)
    model, processor = load_hf(model_dir, hf_onednn, device, dtype)
    ctx = Context(engine, model, processor, repeats, smoke=smoke)
    warm = mixed_requests(2)  # first calls pay one-time costs (allocator, kernels): not measured
    engine.generate(warm, SamplingParams(max_tokens=2, ignore_eos=True))
    hf_generate(model, processor, warm, 2)
    rows = []
    for name, fn in MEASUREMENTS.items():
        if only is not None and name not in only:
            continue
        t = time.perf_counter()
        rows += [dataclasses.replace(r, group=name) for r in fn(ctx)]
        log(f"[bench] {name}: {time.perf_counter() - t:.1f}s")
    for name in peers:
        t = time.perf_counter()
        rows += [dataclasses.replace(r, group="peer " + name) for r in PEERS[name](ctx, model_dir, log=log)]
        log(f"[bench] peer {name}: {time.perf_counter() - t:.1f}s")
    return rows, ctx.details


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a few minutes on 2 cores)")
    ap.add_argument("--repeats", type=int, help="repeats per measurement (median taken); default 2 quick, 5 full")
    ap.add_argument("--threads", type=int, default=2, help="torch threads, the same for engine and HF (default 2)")
    ap.add_argument("--only", nargs="*", choices=list(MEASUREMENTS),
                    help="run only these measurements (none if no name is given: the --peer rows only)")
    ap.add_argument("--peer", action="append", default=[], choices=list(PEERS),
                    help="add rows against another engine (llamacpp: builds llama.cpp and converts the checkpoint "
                         "to GGUF on first use, cached in .cache/llamacpp/; then fp32/bf16/int8/int4 against "
                         "f32/f16/Q8_0/Q4_K_M on a ~340M checkpoint built beside the bench one, quiet and busy)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"], help="engine and HF device")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="both sides")
    ap.add_argument("--hf-onednn", action="store_true",
                    help="give HF the engine's CPU GEMM (oneDNN) too: what is left is the engine's design")
    ap.add_argument("--smoke", action="store_true", help="the tiny test model instead of the ~70M benchmark model")
    ap.add_argument("--checkpoint-dir", help="where to build (or reuse) the random checkpoint")
    ap.add_argument("--markdown", help="also write the results page (every machine's record, this run's included) "
                                       "to this file: bench/RESULTS.md")
    ap.add_argument("--results", help="the records' folder (default bench/results/; with --smoke a temporary one, "
                                      "so that the tiny model's figures never reach the page)")
    ap.add_argument("--no-record", action="store_true", help="do not record this run in the results folder")
    ap.add_argument("--json", help="also write every raw timing to this file")
    args = ap.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        raise ValueError("--repeats must be >= 1")
    if args.only == [] and not args.peer:
        raise ValueError("--only with no measurement names runs nothing unless --peer is given")
    if args.hf_onednn and (args.device, args.dtype) != ("cpu", "float32"):
        raise ValueError("--hf-onednn is the engine's fp32 CPU kernel; it needs --device cpu --dtype float32")
    if args.peer and (args.device, args.dtype) != ("cpu", "float32"):
        raise ValueError("--peer compares CPU fp32 engines: it needs --device cpu --dtype float32")
    torch.set_num_threads(args.threads)
    sampler = results.LoadSampler()
    spec = SMOKE_MODEL if args.smoke else BENCH_MODEL
    name = "bench-smoke" if args.smoke else "bench-qwen2_5_vl-70m"
    model_dir = build_checkpoint(args.checkpoint_dir or os.path.join(tempfile.gettempdir(), "minivlm-" + name), spec)
    repeats = args.repeats or (2 if args.quick else 5)
    start = time.perf_counter()
    rows, details = run(model_dir, repeats, args.only, args.hf_onednn, args.device, args.dtype, peers=args.peer,
                        smoke=args.smoke)
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    baseline = f"HF transformers {transformers.__version__}"
    baseline += " + the engine's oneDNN linears" if args.hf_onednn else ""
    header = (f"model: random Qwen2.5-VL architecture, {param_count(model_dir) / 1e6:.1f}M parameters, "
              f"{args.dtype} on {args.device}; baseline: {baseline}\n"
              f"machine: {machine()}\ncommand: {command} (repeats {repeats}, {time.perf_counter() - start:.0f}s)")
    if "llamacpp" in args.peer:  # the precision rows run on their own checkpoint; their kernels hang on CPU flags
        header += peer_llamacpp.header_lines(details)
    print(header + "\n\n" + text_table(rows))
    folder = args.results or (os.path.join(tempfile.gettempdir(), "minivlm-bench-smoke-results") if args.smoke
                              else results.RESULTS_DIR)
    if not args.no_record:
        model = (f"random Qwen2.5-VL architecture, {param_count(model_dir) / 1e6:.1f}M parameters, {args.dtype} on "
                 f"{args.device}; baseline: {baseline}")
        run_info = results.run_stamp(command, args.threads, sampler.first, time.perf_counter() - start, repeats, model,
                                     load_range=sampler.stop())
        if "llamacpp" in args.peer:
            run_info["peer"] = peer_llamacpp.header_lines(details).strip()
        run_info["note"] = f"VM steal {steal.since_start()}"
        variant = " ".join(x for x in ("hf-onednn" if args.hf_onednn else "", args.device if args.device != "cpu"
                                       else "", args.dtype if args.dtype != "float32" else "") if x) or None
        path = results.record_run(folder, results.machine_stamp(args.device, variant=variant), run_info,
                                  [dataclasses.asdict(r) for r in rows], order=GROUPS)
        print(f"[bench] recorded in {path}")
    if args.markdown:
        results_page.write(folder, args.markdown)
        print(f"[bench] results page written to {args.markdown}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(details, f, indent=1, default=str)
    return rows, details


if __name__ == "__main__":
    main()
