"""Where the engine's time goes on a workload, phase by phase, in CPU seconds of the thread that does the work
(so other processes' load on a shared machine does not count):

    python -m bench.phases [--workload uniform|varied] [--threads 1] [--repeats 3]

The engine's core is stepped in this thread (no loop thread). Phases: processor (rendering and validating requests),
vision tower, decoder forward in prefill and in decode steps, the runner's own work around the model (input
tensors, embedding lookup, logits, sampling) and the engine's per step (scheduler, detokenising, stop checks)."""
import argparse
import functools
import os
import statistics
import tempfile
import time
from contextlib import contextmanager

import torch

from bench.workload import BENCH_MODEL, build_checkpoint, load_hf, make_engine, mixed_requests, uniform_requests
from minivlm import SamplingParams


@contextmanager
def timed(obj, name: str, totals: dict, key: str):
    """Add the CPU time of every obj.name(...) call to totals[key] while the block runs."""
    original = getattr(obj, name)

    @functools.wraps(original)  # generate() inspects forward's signature
    def wrapper(*args, **kwargs):
        t = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + time.thread_time() - t
    setattr(obj, name, wrapper)
    try:
        yield
    finally:
        delattr(obj, name)  # the class's method shows through again


def profile(engine, requests, new_tokens: int) -> dict[str, float]:
    """CPU seconds per phase for one run of `requests` (nothing served from the prefix cache)."""
    engine.reset_prefix_cache()
    core, model, t = engine.core, engine.model, {}
    start = time.thread_time()
    new = [engine.make_sequence(r, SamplingParams(max_tokens=new_tokens, ignore_eos=True)) for r in requests]
    t["processor"] = time.thread_time() - start
    with timed(model.vision, "encode", t, "vision"), timed(model.decoder, "forward", t, "forward"), \
            timed(core.runner, "encode_images", t, "run"), timed(core.runner, "forward", t, "run"), \
            timed(core.runner, "sample_tokens", t, "run"):
        while new or core.scheduler.has_work():
            before = dict(t)
            phase = "prefill" if new or core.scheduler.waiting else "decode"
            step = time.thread_time()
            core.step(new)
            new = []
            delta = {k: t.get(k, 0.0) - before.get(k, 0.0) for k in ("vision", "forward", "run")}
            for name, value in (("decoder forward", delta["forward"]),
                                ("runner around the model", delta["run"] - delta["forward"] - delta["vision"]),
                                ("engine per step", time.thread_time() - step - delta["run"]), ("steps", 1)):
                t[f"{phase}: {name}"] = t.get(f"{phase}: {name}", 0) + value
    for k in ("forward", "run"):
        t.pop(k, None)
    return t


def hf_profile(model, processor, requests, new_tokens: int) -> dict[str, float]:
    """The same phases for HF generate on one padded batch: processor, vision, prefill forward (its first
    forward call minus vision), decode forwards, and generate's own work per step."""
    from bench.workload import hf_inputs
    t = {}
    start = time.thread_time()
    inputs = hf_inputs(processor, requests)
    t["processor"] = time.thread_time() - start
    calls = []
    with timed(model.model.visual, "forward", t, "vision"), timed(model, "forward", t, "forward"):
        original = model.forward

        @functools.wraps(original)
        def counted(*args, **kwargs):
            before = t.get("vision", 0.0)
            step = time.thread_time()
            out = original(*args, **kwargs)
            calls.append(time.thread_time() - step - (t.get("vision", 0.0) - before))
            return out
        model.forward = counted
        start = time.thread_time()
        with torch.inference_mode():
            model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           eos_token_id=None, pad_token_id=processor.tokenizer.pad_token_id)
        total = time.thread_time() - start
    t.pop("forward", None)
    t["prefill: decoder forward"], t["decode: decoder forward"] = calls[0], sum(calls[1:])
    t["generate per step"] = total - sum(calls) - t.get("vision", 0.0)
    t["decode steps"] = len(calls) - 1
    return t


class CpuClock:
    """An HF streamer that records this thread's CPU time at each generated token."""

    def __init__(self):
        self.times, self.prompt_seen = [], False

    def put(self, value):
        if self.prompt_seen:
            self.times.append(time.thread_time())
        self.prompt_seen = True

    def end(self):
        pass


def single_stream_ms(engine, model, processor, request, new_tokens: int = 48) -> tuple[float, float]:
    """CPU milliseconds per decode step of one request: the engine stepped in this thread, and HF generate."""
    from bench.workload import hf_inputs
    engine.reset_prefix_cache()
    engine.core.step([engine.make_sequence(request, SamplingParams(max_tokens=new_tokens, ignore_eos=True))])
    steps = []
    while engine.core.scheduler.has_work():
        t = time.thread_time()
        engine.core.step([])
        steps.append(time.thread_time() - t)
    clock = CpuClock()
    with torch.inference_mode():
        model.generate(**hf_inputs(processor, [request]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, eos_token_id=None, pad_token_id=processor.tokenizer.pad_token_id,
                       streamer=clock)
    hf_steps = [b - a for a, b in zip(clock.times, clock.times[1:])]
    return 1000 * statistics.median(steps), 1000 * statistics.median(hf_steps)


def show(title: str, runs: list[dict]):
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    total = sum(v for k, v in best.items() if not k.endswith("steps"))
    print(f"{title}: {total:.3f} s CPU (min of {len(runs)} per phase)")
    for k, v in best.items():
        print(f"  {k:34s} {v:8.3f}" + ("" if k.endswith("steps") else f" s  {v / total:6.1%}"))
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.phases", description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="uniform", choices=["uniform", "varied"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="the minimum of each phase over the repeats is shown")
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = make_engine(build_checkpoint(os.path.join(tempfile.gettempdir(), "minivlm-bench-qwen2_5_vl-70m"),
                                          BENCH_MODEL))
    requests = (uniform_requests if args.workload == "uniform" else mixed_requests)(16)
    profile(engine, requests[:2], 2)  # warm-up
    model, processor = load_hf(engine.model.model_dir)
    hf_profile(model, processor, requests[:2], 2)
    ours, theirs = [], []
    for _ in range(args.repeats):  # interleaved, like the bench
        ours.append(profile(engine, requests, args.new_tokens))
        theirs.append(hf_profile(model, processor, requests, args.new_tokens))
    single = [single_stream_ms(engine, model, processor, requests[0]) for _ in range(args.repeats)]
    print(f"{args.workload} workload, 16 requests x {args.new_tokens} tokens, {args.threads} thread(s); "
          f"load average {os.getloadavg()[0]:.1f}")
    result = show("engine", ours), show("HF padded batch", theirs)
    eng, hf = min(x for x, _ in single), min(y for _, y in single)
    print(f"single-stream decode step (224x224 image prompt), CPU ms: engine {eng:.2f}, HF generate {hf:.2f} "
          f"({hf / eng:.2f}x)")
    return result


if __name__ == "__main__":
    main()
