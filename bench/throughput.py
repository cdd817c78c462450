"""1. Throughput: 16 concurrent image+prompt requests, 32 new tokens each (EOS ignored): the engine against
HF generate one request at a time and HF generate on one left-padded batch."""
from minivlm import SamplingParams

from bench.timing import Row, interleaved, median
from bench.workload import hf_generate, mixed_requests


def measure(ctx, num_requests: int = 16, new_tokens: int = 32) -> list[Row]:
    engine, model, processor = ctx.engine, ctx.hf_model, ctx.hf_processor
    requests = mixed_requests(num_requests)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    results = {}

    def run_engine():
        engine.reset_prefix_cache()  # nothing may be served from an earlier repeat: every image is new work
        outs = engine.generate(requests, params)
        results["engine"], results["prompt_tokens"] = [o.token_ids for o in outs], [o.num_prompt_tokens for o in outs]

    def run_hf_one_by_one():
        results["one"] = [hf_generate(model, processor, [r], new_tokens)[0] for r in requests]

    def run_hf_batch():
        results["batch"] = hf_generate(model, processor, requests, new_tokens)

    def run_engine_prefill_only():  # the compute-bound part no batching can shrink: vision + prompt prefill
        engine.reset_prefix_cache()
        engine.generate(requests, SamplingParams(max_tokens=1, ignore_eos=True))

    times = interleaved({"engine": run_engine, "batch": run_hf_batch, "one": run_hf_one_by_one,
                         "engine_prefill": run_engine_prefill_only}, ctx.repeats)
    total = num_requests * new_tokens
    rate = {name: total / median(times[name]) for name in ("engine", "one", "batch")}
    ceiling = median(times["one"]) / median(times["engine_prefill"])
    same = {name: sum(a == b for a, b in zip(results["engine"], results[name])) for name in ("one", "batch")}
    ctx.details["throughput"] = {"times_s": times, "new_tokens": total, "prompt_tokens": results["prompt_tokens"],
                                 "same_tokens_as_engine": same}
    note = f"{num_requests} requests x {new_tokens} tokens; greedy outputs identical to HF for {{}}/{num_requests}"
    return [
        Row("throughput vs HF one-by-one", rate["engine"], rate["one"], "tok/s", rate["engine"] / rate["one"],
            ">= 4x", rate["engine"] / rate["one"] >= 4, note.format(same["one"])),
        Row("ceiling: HF one-by-one time / engine prefill-only time", median(times["engine_prefill"]),
            median(times["one"]), "s", ceiling, "(context)", None,
            "the most any engine can gain over one-by-one while prefill costs what it costs here"),
        Row("throughput vs HF padded batch", rate["engine"], rate["batch"], "tok/s", rate["engine"] / rate["batch"],
            ">= 1.5x", rate["engine"] / rate["batch"] >= 1.5, note.format(same["batch"])),
    ]
