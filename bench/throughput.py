"""1. Throughput: 16 concurrent image+prompt requests, 32 new tokens each (EOS ignored), on two workloads: varied
(image sizes 112x112 to 448x448, prompts of different lengths: HF's padded batch pads) and uniform (equal
224x224 images, one prompt: HF's best case, nothing to pad). The engine against HF generate one request at a
time and on one left-padded batch; every repeat checks the engine's greedy tokens against both."""
from minivlm import SamplingParams

from bench.timing import Row, interleaved, median, spread
from bench.workload import hf_generate, mixed_requests, uniform_requests

WORKLOADS = {"varied": mixed_requests, "uniform": uniform_requests}
GOALS = {("varied", "one"): 4, ("varied", "batch"): 3, ("uniform", "one"): 4, ("uniform", "batch"): 1.5}
BASELINES = {"one": "HF one-by-one", "batch": "HF padded batch"}


def measure(ctx, num_requests: int = 16, new_tokens: int = 32) -> list[Row]:
    rows = []
    for name, make in WORKLOADS.items():
        rows += measure_workload(ctx, name, make(num_requests), new_tokens)
    return rows


def measure_workload(ctx, name: str, requests: list, new_tokens: int) -> list[Row]:
    engine, model, processor = ctx.engine, ctx.hf_model, ctx.hf_processor
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    results = {"one": [], "batch": []}

    def run_engine():
        engine.reset_prefix_cache()  # nothing may be served from an earlier repeat: every image is new work
        outs = engine.generate(requests, params)
        results["engine"], results["prompt_tokens"] = [o.token_ids for o in outs], [o.num_prompt_tokens for o in outs]

    def run_hf_one_by_one():
        results["one"].append([hf_generate(model, processor, [r], new_tokens)[0] for r in requests])

    def run_hf_batch():
        results["batch"].append(hf_generate(model, processor, requests, new_tokens))

    def run_engine_prefill_only():  # the compute-bound part no batching can shrink: vision + prompt prefill
        engine.reset_prefix_cache()
        engine.generate(requests, SamplingParams(max_tokens=1, ignore_eos=True))

    runs = {"engine": run_engine, "batch": run_hf_batch, "one": run_hf_one_by_one}
    if name == "varied":
        runs["engine_prefill"] = run_engine_prefill_only
    times = interleaved(runs, ctx.repeats)
    n, total = len(requests), len(requests) * new_tokens
    rate = {side: total / median(times[side]) for side in ("engine", "one", "batch")}
    # per row: requests whose engine tokens equal HF's in every repeat
    same = {side: sum(all(rep[i] == results["engine"][i] for rep in results[side]) for i in range(n))
            for side in ("one", "batch")}
    ctx.details[f"throughput_{name}"] = {"times_s": times, "new_tokens": total, "same_tokens_as_engine": same,
                                         "prompt_tokens": results["prompt_tokens"]}
    rows = []
    for side in ("one", "batch"):
        ratio, goal = rate["engine"] / rate[side], GOALS[(name, side)]
        rows.append(Row(f"{name}: throughput vs {BASELINES[side]}", rate["engine"], rate[side], "tok/s", ratio,
                        f">= {goal}x", ratio >= goal, f"{n} requests x {new_tokens} tokens, "
                        f"{sum(results['prompt_tokens'])} prompt tokens", same=f"{same[side]}/{n}",
                        spread=spread(times["engine"], times[side])))
    if name == "varied":
        ceiling = median(times["one"]) / median(times["engine_prefill"])
        rows.insert(1, Row("varied: ceiling = HF one-by-one time / engine prefill-only time",
                           median(times["engine_prefill"]), median(times["one"]), "s", ceiling, "(context)", None,
                           "the most any engine can gain over one-by-one while prefill costs what it costs here",
                           spread=spread(times["engine_prefill"], times["one"])))
    return rows
