"""7. Chunked prefill: inter-token latency (ITL) of 8 running streams while 448x448-image requests arrive every
0.5 s, on an engine with chunked prefill against the same engine without it, run side by side. Without
chunking each arrival's whole prefill is one step in which no stream advances; with it the prefill is split
into chunks that share each step's token budget with the streams' decode tokens. The vision tower runs whole,
either in the step of an image's first chunk (a stall) or, with async_vision, on its own thread while the
streams keep stepping; a third pair of runs has the image's outputs already in the encoder cache (only the
prefill is left). Each run's gaps are compared with the same streams' steady gaps (no arrivals) at the positions the
run covered: a run whose arrivals take longer keeps its streams going into longer contexts, where every step is
slower anyway."""
import sys
import threading
import time

from minivlm import Request, SamplingParams
from minivlm.config import DEFAULT_STEP_SLOWDOWN

from bench.steal import cpu_jiffies, steal_share
from bench.timing import Row
from bench.workload import PROMPTS, scene

STREAMS, PERIOD = 8, 0.5


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def big_request(k: int, seed: int, salt: str) -> Request:
    """A 448x448-image request; the salt keeps it from reusing earlier requests' KV blocks."""
    return Request(prompt=PROMPTS[1], images=[scene(448, 448, seed)], request_id=f"big-{k}", cache_salt=salt)


def stream_gaps(engine, arrivals: int, duration: float, round_no: int, new_images: bool = True,
                stream_tokens: int = 900) -> tuple[list, dict]:
    """Run the 8 streams; once each has its first token, submit `arrivals` 448x448-image requests PERIOD apart
    and keep going for `duration` seconds and until the last arrival is answered. Returns every stream's
    token-to-token gaps that overlap that window (a stall across its edge counts) as (position, seconds), position k
    being the gap before a stream's token k, each stream's tokens, and
    each arrival's latency (submitted to answered) under "arrivals" and the VM's steal share in the window under
    "steal".
    new_images=False: every arrival shows one image whose vision embeddings are cached beforehand. A stream that
    reaches stream_tokens before the window ends just stops contributing gaps (a warning says so)."""
    engine.reset_prefix_cache()
    if not new_images:  # the encoder cache is per cache salt: each arrival's own (image, salt) is encoded beforehand
        for k in range(arrivals):
            engine.generate(big_request(k, -1, f"run-{round_no}-{k}"), SamplingParams(max_tokens=1))
        with engine.loop.lock:  # and its KV blocks forgotten, so the whole prefill is left to do
            engine.core.block_manager.reset()
    streams = [Request(prompt=PROMPTS[i % len(PROMPTS)], images=[scene(112, 112, i)], request_id=f"stream-{i}")
               for i in range(STREAMS)]
    stamps: dict[str, list[float]] = {r.request_id: [] for r in streams}
    tokens, window, latency, ticks = {}, [], [], []

    def answer(big):
        t = time.perf_counter()
        engine.generate(big, SamplingParams(max_tokens=1))
        latency.append(time.perf_counter() - t)

    def arrive():
        start = time.perf_counter()
        callers = []
        for k in range(arrivals):
            time.sleep(max(0.0, start + k * PERIOD - time.perf_counter()))
            big = big_request(k, 1000 * round_no + k if new_images else -1, f"run-{round_no}-{k}")
            callers.append(threading.Thread(target=answer, args=(big,)))
            callers[-1].start()
        time.sleep(max(0.0, start + duration - time.perf_counter()))
        for c in callers:
            c.join()
        window.append(time.perf_counter())
        ticks.append(cpu_jiffies())
        seen = {rid: len(ts) for rid, ts in stamps.items()}
        while any(len(stamps[rid]) == n and rid not in tokens for rid, n in seen.items()):
            time.sleep(0.005)  # every running stream's next token: the gap spanning the window's end counts too
        for r in streams:
            engine.abort(r.request_id)

    feeder = threading.Thread(target=arrive)
    params = SamplingParams(max_tokens=stream_tokens, ignore_eos=True)
    for ev in engine.stream_many(streams, params, snapshots=False):
        stamps[ev.request_id].append(time.perf_counter())
        if not window and not feeder.is_alive() and all(stamps.values()):
            window.append(time.perf_counter())
            ticks.append(cpu_jiffies())
            feeder.start()
        if ev.finished:
            tokens[ev.request_id] = ev.output.token_ids
    feeder.join()
    start, end = window
    if any(len(t) >= params.max_tokens for t in tokens.values()):  # not aborted at the window's end: it ran out
        print(f"warning: a stream reached {params.max_tokens} tokens before the arrivals were answered; its gaps stop "
              "there (a smaller token budget needs longer streams)", file=sys.stderr)
    gaps = [(k + 1, b - a) for ts in stamps.values() for k, (a, b) in enumerate(zip(ts, ts[1:])) if b > start and a < end]
    return gaps, {**tokens, "arrivals": latency, "steal": steal_share(*ticks)}


def steady_by_position(engine, tokens: int) -> dict[int, list[float]]:
    """The same 8 streams with no arrivals, run to `tokens` tokens: each position's gaps (position k: the gap before
    a stream's token k). A stream's step grows slower as its context grows, and a run whose arrivals take long keeps
    its streams going longer: its gaps are compared with these, at the positions it covered."""
    engine.reset_prefix_cache()
    streams = [Request(prompt=PROMPTS[i % len(PROMPTS)], images=[scene(112, 112, i)], request_id=f"stream-{i}")
               for i in range(STREAMS)]
    stamps: dict[str, list[float]] = {r.request_id: [] for r in streams}
    for ev in engine.stream_many(streams, SamplingParams(max_tokens=tokens, ignore_eos=True), snapshots=False):
        stamps[ev.request_id].append(time.perf_counter())
    by_position: dict[int, list[float]] = {}
    for ts in stamps.values():
        for k, (a, b) in enumerate(zip(ts, ts[1:])):
            by_position.setdefault(k + 1, []).append(b - a)
    return by_position


def steady_reference(steady: dict[int, list[float]], gaps: list[tuple[int, float]], q: float = 0.5) -> float:
    """The median (or the q quantile) steady gap over the positions a run's gaps cover (its streams' contexts)."""
    lo, hi = min(k for k, _ in gaps), max(k for k, _ in gaps)
    return percentile([g for k in range(lo, hi + 1) for g in steady.get(k, [])], q)


def offered_load(engine, n: int = 2) -> float:
    """Wall time of one 448x448 arrival served alone (new image: vision tower + prefill), as a fraction of
    PERIOD: the share of the machine the arrivals need before any stream decodes."""
    times = []
    for k in range(n):
        t = time.perf_counter()
        engine.generate(big_request(k, 10_000 + k, f"load-{k}"), SamplingParams(max_tokens=1))
        times.append(time.perf_counter() - t)
    return min(times) / PERIOD


def budget_settings(budget: int | None, slowdown: float = DEFAULT_STEP_SLOWDOWN) -> dict:
    """A fixed token budget, or (None) what `python app.py --enable-chunked-prefill` gets: the adaptive budget."""
    if budget is None:
        return {"max_num_batched_tokens": 512, "max_step_slowdown": slowdown}
    return {"max_num_batched_tokens": budget, "max_step_slowdown": None}


def measure(ctx, budget: int | None = None, slowdown: float = DEFAULT_STEP_SLOWDOWN) -> list[Row]:
    arrivals = 3 * ctx.repeats
    chunked = ctx.engine.isolated(enable_chunked_prefill=True, max_num_seqs=32, **budget_settings(budget, slowdown))
    overlap = ctx.engine.isolated(enable_chunked_prefill=True, max_num_seqs=32, async_vision=True,
                                  **budget_settings(budget, slowdown))
    whole = ctx.engine.isolated(max_num_seqs=32)
    runs = {"chunked": (chunked, arrivals, True), "whole": (whole, arrivals, True),
            "chunked, async vision": (overlap, arrivals, True),
            "chunked, cached vision": (chunked, arrivals, False), "whole, cached vision": (whole, arrivals, False)}
    gaps = {name: [] for name in runs}
    waits = {name: [] for name in runs}  # each arrival's time from submission to its answer
    refs = {name: [] for name in runs}   # per round: the steady ITL at the positions the run covered
    floors = {name: [] for name in runs}  # and the steady streams' own p99 / p50 there: the row without arrivals
    stolen = {name: [] for name in runs}  # the VM's steal share during each run's window (None: not reported)
    steady_gaps = []
    same = True
    try:
        for r in range(max(1, ctx.repeats // 2)):  # interleaved rounds: machine noise lands on every side alike
            tokens, got_round = [], {}
            for name, (engine, n, new_images) in runs.items():
                got, toks = stream_gaps(engine, n, arrivals * PERIOD, r, new_images)
                got_round[name] = got
                gaps[name] += got
                waits[name] += toks["arrivals"]
                stolen[name].append(toks["steal"])
                tokens.append(toks)
            steady = steady_by_position(chunked, max(k for got in got_round.values() for k, _ in got) + 1)
            steady_gaps += [g for gs in steady.values() for g in gs]
            for name, got in got_round.items():
                refs[name].append(steady_reference(steady, got))
                floors[name].append(steady_reference(steady, got, 0.99) / refs[name][-1])
            streams = [{k: v for k, v in toks.items() if k not in ("arrivals", "steal")} for toks in tokens]
            n = min(len(t) for toks in streams for t in toks.values())
            same &= all(toks[k][:n] == streams[0][k][:n] for toks in streams for k in toks)
        load = offered_load(whole)
    finally:
        chunked.close(), overlap.close(), whole.close()
    ms = {k: (1e3 * percentile([g for _, g in v], 0.5), 1e3 * percentile([g for _, g in v], 0.99))
          for k, v in gaps.items()}
    ms["steady"] = (1e3 * percentile(steady_gaps, 0.5), 1e3 * percentile(steady_gaps, 0.99))
    ref_ms = {k: 1e3 * percentile(v, 0.5) for k, v in refs.items()}
    floor = {k: max(v) for k, v in floors.items()}  # the noisiest round's
    said = f"token budget {budget}" if budget else f"the adaptive budget (mixed steps <= {slowdown}x a decode step" + \
        ("; README's server flags)" if slowdown == DEFAULT_STEP_SLOWDOWN else ")")
    ctx.details["chunked_prefill"] = {"gaps_s": gaps, "budget_tokens": budget, "arrivals_per_run": arrivals,
                                      "stream_tokens_equal": same, "p50_p99_ms": ms, "steady_at_positions_ms": ref_ms,
                                      "steady_p99_over_p50": floor,
                                      "arrival_latency_s": waits, "offered_load": load,
                                      "steal_share": stolen}
    note = (f"{STREAMS} streams, a 448x448 image request every {PERIOD}s ({arrivals} a run), {said}; "
            f"steady ITL (p50, no arrivals, at the positions each run covered) " +
            ", ".join(f"{k} {v:.1f} ms" for k, v in ref_ms.items()) + "; stream tokens equal in every run: "
            f"{'yes' if same else 'NO'}; arrivals answered after (median) " + ", ".join(
                f"{k} {percentile(v, 0.5):.2f} s" for k, v in waits.items() if v))

    def row(metric, q, on, off, goal=True):
        a, b = ms[on][q], ms[off][q]
        if not goal:
            return Row(metric, a, b, "ms", b / a, "context", None, note)
        steady = ref_ms[on]
        shares = [x for x in stolen[on] if x is not None]
        host = f"; the VM's steal in its windows {', '.join(f'{100 * x:.1f}' for x in shares)} %" if shares else ""
        return Row(metric, a, b, "ms", b / a, "chunked p99 <= 2x steady ITL", a <= 2 * steady,
                   f"chunked p99 / steady ITL at the same positions ({steady:.1f} ms) = {a / steady:.1f}; the steady "
                   f"streams' own p99 there is {floor[on]:.2f}x their p50 (what the row reads with no arrival: the "
                   f"context's growth and the machine's noise){host}")
    return [row("ITL p50, 8 streams + 448² arrivals: chunked + async vision vs whole prefill", 0,
                "chunked, async vision", "whole", goal=False),
            row("ITL p99, 8 streams + 448² arrivals: chunked + async vision vs whole prefill", 1,
                "chunked, async vision", "whole"),
            row("ITL p99, same, the tower in the step: chunked vs whole", 1, "chunked", "whole"),
            row("ITL p99, same, image embeddings cached: chunked vs whole", 1, "chunked, cached vision",
                "whole, cached vision"),
            Row("offered load: one arrival's vision + prefill time / arrival period", load, 1.0, "", load, "context",
                None, "over 100 %: the arrivals alone need more than the whole machine, so the streams must slow "
                      "down whatever the schedule")]


def main():
    """python -m bench.chunked_prefill --budgets auto 16 32: the rows at several token budgets ("auto": the default
    adaptive one), the trade-off between the streams' inter-token latency and how soon the arrivals are answered."""
    import argparse
    import tempfile

    import torch

    from bench.__main__ import Context
    from bench.report import machine, text_table
    from bench.workload import BENCH_MODEL, build_checkpoint, make_engine
    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("--budgets", nargs="+", default=["auto", "16", "32"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--slowdown", type=float, default=DEFAULT_STEP_SLOWDOWN, help="the adaptive budget's (auto)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    engine = make_engine(build_checkpoint(tempfile.gettempdir() + "/minivlm-bench-qwen2_5_vl-70m", BENCH_MODEL))
    for budget in args.budgets:
        rows = measure(Context(engine, None, None, args.repeats), None if budget == "auto" else int(budget),
                       args.slowdown)
        print(f"\ntoken budget {budget}: {rows[0].note}\n{text_table(rows)}")
    print(machine())


if __name__ == "__main__":
    main()
