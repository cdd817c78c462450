"""13. Speed that survives a busy machine (#44 item 4): single-stream decode with one other process spinning on a
core beside it (as a browser, Gradio's threads or a test run do in real use), against the same quiet. The engine
runs on the cores the rest of the machine leaves free (engine/execution/busy_threads.py); the same engine with its thread
count fixed shows what that saves, and HF `generate` (fixed threads, as PyTorch runs by default) is context: its
step is Python-bound on one core, so a second core taken costs it little. The goal against a peer that is
bandwidth-bound like the engine (llama.cpp keeping 80 % of the quiet ratio) is peer_quantized.py's. Runs alternate;
the busy process starts before and stops after each busy set."""
import multiprocessing
import time
from contextlib import contextmanager

from minivlm import Request

from bench.single_stream import engine_rate, hf_rate
from bench.timing import Row, median, spread
from bench.workload import scene


def _spin():
    while True:
        pass


@contextmanager
def busy_process(settle: float = 1.0):
    """One process spinning on a core while the block runs (settle: seconds for the engine to notice it)."""
    proc = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    proc.start()
    time.sleep(settle)
    try:
        yield
    finally:
        proc.terminate()
        proc.join()
        time.sleep(settle)  # and for it to notice that it stopped


def rates(ctx, request: Request, new_tokens: int, fixed: bool) -> dict[str, list[float]]:
    """tok/s of each side over ctx.repeats alternating runs: the engine, (fixed) the engine with its thread count
    fixed, and HF."""
    busy = ctx.engine.core.busy
    out = {"engine": [], "fixed": [], "hf": []} if fixed else {"engine": [], "hf": []}

    def engine(adapt: bool):
        if busy is None or adapt:
            return engine_rate(ctx.engine, request, new_tokens)[0]
        adapted = busy.threads
        busy.pin(busy.max_threads)  # fixed: torch's count, whatever else runs
        try:
            return engine_rate(ctx.engine, request, new_tokens)[0]
        finally:
            busy.pin(None)
            busy.threads = adapted  # as it was: it looks again within INTERVAL
    runs = {"engine": lambda: engine(True), "fixed": lambda: engine(False),
            "hf": lambda: hf_rate(ctx.hf_model, ctx.hf_processor, request, new_tokens)[0]}
    for _ in range(ctx.repeats):
        for side in out:
            out[side].append(runs[side]())
    return out


def measure(ctx, new_tokens: int = 64) -> list[Row]:
    request = Request(prompt="Describe the image in one sentence.", images=[scene(224, 224, 7)])
    quiet = rates(ctx, request, new_tokens, fixed=False)
    with busy_process():
        engine_rate(ctx.engine, request, new_tokens)  # the engine notices the busy core (and first calls warm up)
        busy = rates(ctx, request, new_tokens, fixed=True)
        threads = ctx.engine.core.busy.threads if ctx.engine.core.busy is not None else None
    ctx.details["busy_machine"] = {"quiet": quiet, "busy": busy, "threads_when_busy": threads}
    q, b = {k: median(v) for k, v in quiet.items()}, {k: median(v) for k, v in busy.items()}
    quiet_ratio, busy_ratio = q["engine"] / q["hf"], b["engine"] / b["hf"]
    kept = busy_ratio / quiet_ratio
    return [
        Row("one busy process: single-stream decode vs HF generate", b["engine"], b["hf"], "tok/s", busy_ratio,
            "context", None,
            f"quiet: engine {q['engine']:.1f}, HF {q['hf']:.1f} tok/s ({quiet_ratio:.2f}x); busy, the engine keeps "
            f"{kept:.0%} of its quiet ratio, {b['engine'] / q['engine']:.0%} of its quiet speed on {threads} "
            f"thread(s) (HF {b['hf'] / q['hf']:.0%} of its own)", spread=spread(busy["engine"], busy["hf"], "tok/s")),
        Row("one busy process: engine on the free cores vs its thread count fixed", b["engine"], b["fixed"], "tok/s",
            b["engine"] / b["fixed"], ">= 1.0x", b["engine"] >= b["fixed"],
            f"fixed: torch's {ctx.engine.core.busy.max_threads if ctx.engine.core.busy else '?'} threads whatever "
            f"else runs", spread=spread(busy["engine"], busy["fixed"], "tok/s")),
    ]
