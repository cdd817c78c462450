"""MTP speculation on the trained tiny Qwen3.5 (assets/tiny-qwen3_5-vl): the model's own multi-token-prediction
head drafts, the main model verifies. Scene descriptions (the answers the classroom reads) decoded one stream at a
time, speculation on vs off side by side: decode tok/s, acceptance, and whether the greedy tokens are identical.
A trained model is the point: on random weights the head's guesses are noise, and acceptance says nothing."""
import os
import time

from minivlm import Engine, EngineConfig, Request, SamplingParams

from bench.timing import Row, median, spread

TINY_QWEN3_5 = os.environ.get("MINIVLM_TINY_QWEN3_5", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "tiny-qwen3_5-vl"))
K = 3  # the fastest of k = 1, 2, 3 side by side (step 6750, load 3: 1.29-1.38x, 1.36-1.57x, 1.52-1.67x)
SEED = 9_400_000  # scenes disjoint from training's, eval_tiny's and the tests'


def descriptions(n: int) -> list[Request]:
    """n description questions about fresh scenes (half English, half Chinese), as the model card asks them."""
    from tools.eval_tiny import items
    chats = [m for lang in ("en", "zh") for m, _ in items("describe_3", (n + 1) // 2, SEED, lang=lang)]
    return [Request(messages=m) for m in chats[:n]]


def decode(engine: Engine, requests: list[Request], new_tokens: int) -> tuple[float, list[list[int]], tuple]:
    """Decode tok/s over the requests (one at a time, first token excluded), their tokens, and the speculation
    counters the run added (drafts, draft tokens, accepted)."""
    before = engine.spec_decode_stats()
    tokens, seconds, outs = 0, 0.0, []
    for request in requests:
        engine.reset_prefix_cache()
        stamps, last = [], None
        for last in engine.stream(request, SamplingParams(max_tokens=new_tokens, temperature=0), snapshots=False):
            stamps.extend([time.perf_counter()] * len(last.token_ids))  # a speculating step delivers several
        tokens += len(stamps) - 1
        seconds += stamps[-1] - stamps[0]
        outs.append(list(last.output.token_ids))
    after = engine.spec_decode_stats()
    added = (0, 0, 0) if after is None else (after.num_drafts - before.num_drafts, after.num_draft_tokens -
                                             before.num_draft_tokens, after.num_accepted_tokens - before.num_accepted_tokens)
    return tokens / seconds, outs, added


def measure(ctx, n: int = 8, new_tokens: int = 64, ks=(K,)) -> list[Row]:
    """A row per number of guesses in ks, all from one run: the engine without speculation and one per k take
    turns (off, k1, k2, ..., off, ...), so that the machine's load lands on every side alike."""
    if not os.path.exists(os.path.join(TINY_QWEN3_5, "model.safetensors")):
        raise FileNotFoundError(f"MTP row: no trained tiny Qwen3.5 at {TINY_QWEN3_5} (export it, or point "
                                "MINIVLM_TINY_QWEN3_5 at an export)")
    engines = {0: Engine(EngineConfig(model=TINY_QWEN3_5, device="cpu", dtype="float32"))}
    for k in ks:
        engines[k] = Engine(EngineConfig(model=TINY_QWEN3_5, device="cpu", dtype="float32",
                                         speculative_config={"method": "mtp", "num_speculative_tokens": k}))
    if ctx.smoke:  # the code path, not a figure: two short descriptions
        n, new_tokens = 2, 24
    requests = descriptions(n)
    rates, same, counts = {k: [] for k in engines}, dict.fromkeys(ks, True), {k: (0, 0, 0) for k in ks}
    try:
        for e in engines.values():
            decode(e, requests[:1], 4)  # one-time costs: not measured
        for _ in range(ctx.repeats):
            for k, e in engines.items():
                rate, ids, added = decode(e, requests, new_tokens)
                rates[k].append(rate)
                if k == 0:
                    ref = ids
                    continue
                same[k] &= ids == ref
                counts[k] = tuple(a + b for a, b in zip(counts[k], added))
    finally:
        for e in engines.values():
            e.close()
    rows, r_off = [], median(rates[0])
    for k in ks:
        drafts, drafted, accepted = counts[k]
        r_on, acceptance = median(rates[k]), accepted / drafted if drafted else 0.0
        ctx.details[f"speculative mtp k={k}"] = {"rates": rates[k], "off": rates[0], "drafts": drafts,
                                                 "draft_tokens": drafted, "accepted": accepted}
        note = (f"{n} descriptions (en + zh), up to {new_tokens} tokens each, greedy, k={k}; acceptance "
                f"{acceptance:.0%} (goal >= 60 %), mean accepted {accepted / max(1, drafts):.2f} of "
                f"{drafted / max(1, drafts):.1f}")
        rows.append(Row(f"MTP speculation k={k}, tiny Qwen3.5 descriptions: on vs off", r_on, r_off, "tok/s",
                        r_on / r_off, ">= 1.3x, acceptance >= 0.6", r_on / r_off >= 1.3 and acceptance >= 0.6, note,
                        same=f"{int(same[k])}/1", spread=spread(rates[k], rates[0], "tok/s")))
    return rows


def main(argv=None):
    """python -m bench.speculative_mtp [--model DIR]: the row alone (until the model ships, on an export of the
    run in progress, e.g. runs/q35/steps/N)."""
    import argparse
    from types import SimpleNamespace

    import torch
    global TINY_QWEN3_5
    ap = argparse.ArgumentParser(prog="python -m bench.speculative_mtp", description=__doc__)
    ap.add_argument("--model", default=TINY_QWEN3_5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", default=str(K), help="guesses per step; several (1,2,3) run side by side")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    TINY_QWEN3_5 = args.model
    ctx = SimpleNamespace(repeats=args.repeats, details={}, smoke=False)
    print(f"load average before: {os.getloadavg()}")
    for row in measure(ctx, ks=[int(k) for k in args.k.split(",")]):
        print(f"{row.metric}: {row.engine:.1f} vs {row.baseline:.1f} {row.unit} = {row.ratio:.2f}x "
              f"(goal {row.goal}: {'met' if row.passed else 'not met'}); {row.note}; spread {row.spread}; "
              f"same tokens {row.same}")
    print(f"load average after: {os.getloadavg()}")
    return ctx.details


if __name__ == "__main__":
    main()
