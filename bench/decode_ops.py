"""python -m bench.decode_ops: a single-stream decode step three ways, side by side in one process on the bench
checkpoint: each layer one C call (minivlm/model/backends/cpu_kernels/decode_layer.c), the layer's small ops fused
but called from Python (decode_ops.c), and PyTorch ops around the same matrix products: three engines on the same
weights, each with its backend picked by the MINIVLM_* switches. Interleaved repeats of the same request; the
median step of each, where its time goes (what the Python path can time: the matrix products, attention, the rest)
and its op count."""
import argparse
import os
import statistics
import tempfile
import time

import torch

from minivlm import Request, SamplingParams
from minivlm.model.backends.cpu_kernels import gemv, paged_cpu

from bench.long_context import decode_steps
from bench.workload import BENCH_MODEL, build_checkpoint, make_engine, scene


class Clock:
    """Wall time spent inside one function, summed (the function is swapped for a timed one while measuring)."""

    def __init__(self, owner, name: str):
        self.owner, self.name, self.real, self.total = owner, name, getattr(owner, name), 0.0
        self.own = name in vars(owner)  # a module's function, or an instance's method (restored by deleting)

    def __enter__(self):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return self.real(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - t
        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc):
        if self.own:
            setattr(self.owner, self.name, self.real)
        else:
            delattr(self.owner, self.name)


MODES = {"decode_layer.c": {}, "decode_ops.c": {"MINIVLM_DECODE_LAYER": "0"}, "PyTorch": {"MINIVLM_DECODE_OPS": "0"}}


def engine_for(engine, mode: str):
    """An engine on the same weights whose backend was picked with this mode's switches."""
    saved = {name: os.environ.pop(name, None) for name in ("MINIVLM_DECODE_LAYER", "MINIVLM_DECODE_OPS")}
    os.environ.update(MODES[mode])
    try:
        return engine.isolated(num_blocks=128)
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def one_run(engine, request: Request, new_tokens: int) -> dict:
    """Per decode step (ms): the whole step as the caller sees it; the engine's step, its model forward, and the
    matrix products and attention in that."""
    engine.reset_prefix_cache()
    stream = engine.stream(request, SamplingParams(max_tokens=new_tokens, ignore_eos=True), snapshots=False)
    next(stream), next(stream)  # the prefill and the first decode step are not timed
    with Clock(gemv, "linear") as mm, Clock(paged_cpu, "paged_decode") as attn, \
            Clock(engine.core.runner, "forward") as fwd, Clock(engine.core, "step") as core:
        t, steps = time.perf_counter(), sum(1 for _ in stream)
        wall = time.perf_counter() - t
    return {k: v / steps * 1e3 for k, v in (("step", wall), ("core", core.total), ("forward", fwd.total),
                                             ("matmul", mm.total), ("attention", attn.total))}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.decode_ops", description=__doc__)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = build_checkpoint(os.path.join(tempfile.gettempdir(), "minivlm-bench-qwen2_5_vl-70m"), BENCH_MODEL)
    engine = make_engine(model_dir)
    engines = {mode: engine_for(engine, mode) for mode in MODES}
    request = Request(prompt="Describe the image in one sentence.", images=[scene(224, 224, 7)])
    runs, ops = {mode: [] for mode in MODES}, {}
    try:
        for mode in runs:
            ops[mode] = decode_steps(engines[mode], [request], 4)[1]
            one_run(engines[mode], request, 8)  # warm-up
        for _ in range(args.repeats):
            for mode in runs:  # interleaved: each mode once per round
                runs[mode].append(one_run(engines[mode], request, args.tokens))
    finally:
        for e in (*engines.values(), engine):
            e.close()
    print(f"single-stream decode step, bench model, {args.threads} threads, median of {args.repeats} interleaved "
          f"runs of {args.tokens} tokens; load average {os.getloadavg()[0]:.2f}\n")
    print("| a layer runs as | step seen by the caller | tok/s | engine step | model forward | matrix products | attention |"
          " forward's rest | ops per forward |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        m = {k: statistics.median(r[k] for r in runs[mode]) for k in runs[mode][0]}
        steps = sorted(r["step"] for r in runs[mode])
        inside = "| (inside the call) | | " if mode == "decode_layer.c" else \
            f"| {m['matmul']:.2f} ms | {m['attention']:.2f} ms | {m['forward'] - m['matmul'] - m['attention']:.2f} ms "
        print(f"| {mode} | {m['step']:.2f} ms ({steps[0]:.2f}–{steps[-1]:.2f}) | {1e3 / m['step']:.1f} | "
              f"{m['core']:.2f} ms | {m['forward']:.2f} ms {inside}| {ops[mode]} |")


if __name__ == "__main__":
    main()
