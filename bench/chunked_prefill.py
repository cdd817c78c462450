"""7. Chunked prefill: inter-token latency (ITL) of 8 running streams while 448x448-image requests arrive every
0.5 s, on an engine with chunked prefill against the same engine without it, run side by side. Without
chunking each arrival's whole prefill is one step in which no stream advances; with it the prefill is split
into chunks that share each step's token budget with the streams' decode tokens."""
import threading
import time

from minivlm import Request, SamplingParams

from bench.timing import Row
from bench.workload import PROMPTS, scene

STREAMS, PERIOD = 8, 0.5


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def stream_gaps(engine, arrivals: int, duration: float, round_no: int) -> tuple[list[float], dict]:
    """Run the 8 streams; once each has its first token, submit `arrivals` 448x448-image requests PERIOD apart
    and keep going for `duration` seconds and until the last arrival is answered. Returns every stream's
    token-to-token gaps that overlap that window (a stall across its edge counts), and each stream's tokens."""
    engine.reset_prefix_cache()
    streams = [Request(prompt=PROMPTS[i % len(PROMPTS)], images=[scene(112, 112, i)], request_id=f"stream-{i}")
               for i in range(STREAMS)]
    stamps: dict[str, list[float]] = {r.request_id: [] for r in streams}
    tokens, window = {}, []

    def arrive():
        start = time.perf_counter()
        callers = []
        for k in range(arrivals):
            time.sleep(max(0.0, start + k * PERIOD - time.perf_counter()))
            big = Request(prompt=PROMPTS[1], images=[scene(448, 448, 1000 * round_no + k)], request_id=f"big-{k}")
            callers.append(threading.Thread(target=engine.generate, args=(big, SamplingParams(max_tokens=1))))
            callers[-1].start()
        time.sleep(max(0.0, start + duration - time.perf_counter()))
        for c in callers:
            c.join()
        window.append(time.perf_counter())
        seen = {rid: len(ts) for rid, ts in stamps.items()}
        while any(len(stamps[rid]) == n for rid, n in seen.items()):
            time.sleep(0.005)  # every stream's next token: the gap that spans the window's end is measured too
        for r in streams:
            engine.abort(r.request_id)

    feeder = threading.Thread(target=arrive)
    params = SamplingParams(max_tokens=900, ignore_eos=True)
    for ev in engine.stream_many(streams, params, snapshots=False):
        stamps[ev.request_id].append(time.perf_counter())
        if not window and not feeder.is_alive() and all(stamps.values()):
            window.append(time.perf_counter())
            feeder.start()
        if ev.finished:
            tokens[ev.request_id] = ev.output.token_ids
    feeder.join()
    start, end = window
    gaps = [b - a for ts in stamps.values() for a, b in zip(ts, ts[1:]) if b > start and a < end]
    return gaps, tokens


def measure(ctx, budget: int = 64) -> list[Row]:
    arrivals = 3 * ctx.repeats
    chunked = ctx.engine.isolated(enable_chunked_prefill=True, max_num_batched_tokens=budget, max_num_seqs=32)
    whole = ctx.engine.isolated(max_num_seqs=32)
    gaps = {"steady": [], "chunked": [], "whole": []}
    same = True
    try:
        for r in range(max(1, ctx.repeats // 2)):  # interleaved rounds: machine noise lands on every side alike
            steady, ref = stream_gaps(chunked, 0, arrivals * PERIOD, r)
            on, got_on = stream_gaps(chunked, arrivals, arrivals * PERIOD, r)
            off, got_off = stream_gaps(whole, arrivals, arrivals * PERIOD, r)
            gaps["steady"] += steady
            gaps["chunked"] += on
            gaps["whole"] += off
            n = min(len(t) for t in [*ref.values(), *got_on.values(), *got_off.values()])
            same &= all(ref[k][:n] == got_on[k][:n] == got_off[k][:n] for k in ref)
    finally:
        chunked.close(), whole.close()
    ms = {k: (1e3 * percentile(v, 0.5), 1e3 * percentile(v, 0.99)) for k, v in gaps.items()}
    steady = ms["steady"][0]
    ctx.details["chunked_prefill"] = {"gaps_s": gaps, "budget_tokens": budget, "arrivals_per_run": arrivals,
                                      "stream_tokens_equal": same, "p50_p99_ms": ms}
    note = (f"{STREAMS} streams, a 448x448 image request every {PERIOD}s ({arrivals} a run), token budget {budget}; "
            f"steady-state ITL {steady:.1f} ms; stream tokens equal across runs: {'yes' if same else 'NO'}")
    return [Row("ITL p50, 8 streams + 448² arrivals: chunked vs whole prefill", ms["chunked"][0], ms["whole"][0],
                "ms", ms["whole"][0] / ms["chunked"][0], "context", None, note),
            Row("ITL p99, 8 streams + 448² arrivals: chunked vs whole prefill", ms["chunked"][1], ms["whole"][1],
                "ms", ms["whole"][1] / ms["chunked"][1], "chunked p99 <= 2x steady ITL", ms["chunked"][1] <= 2 * steady,
                f"chunked p99 / steady ITL = {ms['chunked'][1] / steady:.2f}")]
