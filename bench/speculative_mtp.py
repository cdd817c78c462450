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
K = 1  # the published Qwen3.5 head predicts one token ahead; vLLM's default for it
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


def measure(ctx, n: int = 8, new_tokens: int = 64, k: int = K) -> list[Row]:
    if not os.path.exists(os.path.join(TINY_QWEN3_5, "model.safetensors")):
        raise FileNotFoundError(f"MTP row: no trained tiny Qwen3.5 at {TINY_QWEN3_5} (export it, or point "
                                "MINIVLM_TINY_QWEN3_5 at an export)")
    off = Engine(EngineConfig(model=TINY_QWEN3_5, device="cpu", dtype="float32"))
    on = Engine(EngineConfig(model=TINY_QWEN3_5, device="cpu", dtype="float32",
                             speculative_config={"method": "mtp", "num_speculative_tokens": k}))
    requests = descriptions(n)
    try:
        decode(off, requests[:1], 4), decode(on, requests[:1], 4)  # one-time costs: not measured
        rates, same, counts = {"on": [], "off": []}, True, (0, 0, 0)
        for _ in range(ctx.repeats):  # interleaved: off, on, off, on, ...
            r_off, ref, _ = decode(off, requests, new_tokens)
            r_on, ids, added = decode(on, requests, new_tokens)
            rates["off"].append(r_off)
            rates["on"].append(r_on)
            same &= ids == ref
            counts = tuple(a + b for a, b in zip(counts, added))
    finally:
        on.close()
        off.close()
    drafts, drafted, accepted = counts
    r_on, r_off = median(rates["on"]), median(rates["off"])
    acceptance = accepted / drafted if drafted else 0.0
    ctx.details["speculative mtp"] = {"rates": rates, "drafts": drafts, "draft_tokens": drafted, "accepted": accepted}
    note = (f"{n} descriptions (en + zh), up to {new_tokens} tokens each, greedy, k={k}; acceptance {acceptance:.0%} "
            f"(goal >= 60 %), mean accepted {accepted / max(1, drafts):.2f} of {drafted / max(1, drafts):.1f}")
    return [Row("MTP speculation, tiny Qwen3.5 descriptions: on vs off", r_on, r_off, "tok/s", r_on / r_off,
                ">= 1.3x, acceptance >= 0.6", r_on / r_off >= 1.3 and acceptance >= 0.6, note,
                same=f"{int(same)}/1", spread=spread(rates["on"], rates["off"], "tok/s"))]


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
    ap.add_argument("--k", type=int, default=K, help="guesses per step")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    TINY_QWEN3_5 = args.model
    ctx = SimpleNamespace(repeats=args.repeats, details={})
    for row in measure(ctx, k=args.k):
        print(f"{row.metric}: {row.engine:.1f} vs {row.baseline:.1f} {row.unit} = {row.ratio:.2f}x "
              f"(goal {row.goal}: {'met' if row.passed else 'not met'}); {row.note}; spread {row.spread}; "
              f"same tokens {row.same}")
    return ctx.details


if __name__ == "__main__":
    main()
