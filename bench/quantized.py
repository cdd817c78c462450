"""12. Weight-only quantization and bf16 on this CPU: single-stream decode tok/s of the same checkpoint in fp32 (the
engine's C decode step), bf16, int8 and int4 as dtype="auto" runs them, and int8 in a bf16 engine,
side by side in one run, each with its accuracy against fp32 (greedy tokens equal, max |Δ logprob| while the
tokens agree) and the weight bytes it reads."""
import time

from minivlm import Engine, EngineConfig, Request, SamplingParams

from bench.timing import Row, median
from bench.workload import scene

# int8 / int4 as dtype="auto" runs them (an fp32 engine: the fused C ops around PyTorch's products, which take bf16
# inputs), and int8 in a bf16 engine (PyTorch's ops throughout)
VARIANTS = [("bf16", dict(dtype="bfloat16")), ("int8", dict(quantization="int8")),
            ("int8, bf16 engine", dict(dtype="bfloat16", quantization="int8")), ("int4", dict(quantization="int4"))]


def run(engine, request, new_tokens: int):
    engine.reset_prefix_cache()
    times, last = [], None
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, logprobs=0)
    for last in engine.stream(request, params, snapshots=False):
        times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0]), last.output


def agreement(out, ref) -> tuple[int, float]:
    """Greedy tokens equal to fp32's, and the largest |Δ logprob| of the chosen token while they agree."""
    same, worst = 0, 0.0
    for a, b, la, lb in zip(out.token_ids, ref.token_ids, out.logprobs, ref.logprobs):
        if a != b:
            break
        same += 1
        worst = max(worst, abs(la[a] - lb[b]))
    return same, worst


def measure(ctx, new_tokens: int = 48) -> list[Row]:
    request = Request(prompt="Describe the image in one sentence.", images=[scene(224, 224, 7)])
    path = ctx.engine.config.model
    engines = {"fp32": ctx.engine}
    skipped = []
    for name, kw in VARIANTS:
        try:
            engines[name] = Engine(EngineConfig(model=path, device="cpu", max_model_len=1024, num_blocks=256, **kw))
        except ValueError as e:  # int4 needs input widths that are multiples of its group (the smoke model's are not)
            skipped.append(f"{name}: {e}")
    try:
        for e in engines.values():  # warm-up: first calls pay one-time costs
            run(e, request, 4)
        rates = {name: [] for name in engines}
        outs = {}
        for _ in range(ctx.repeats):  # interleaved, one variant after the other
            for name, e in engines.items():
                rate, outs[name] = run(e, request, new_tokens)
                rates[name].append(rate)
        fp32 = median(rates["fp32"])
        rows = []
        for name, e in engines.items():
            if name == "fp32":
                continue
            r = median(rates[name])
            same, worst = agreement(outs[name], outs["fp32"])
            mib = e.memory_report().weights_bytes / 2**20
            rows.append(Row(f"single-stream decode, {name} vs fp32", r, fp32, "tok/s", r / fp32, "", None,
                            f"{mib:.0f} MiB of weights (fp32: {ctx.engine.memory_report().weights_bytes / 2**20:.0f}); "
                            f"greedy = fp32 on {same}/{new_tokens} tokens, max |Δ logprob| {worst:.3f} while equal; "
                            f"{e.linear_backend}; decode: {e.decode_backend}"
                            + (f"; {e.calibration}" if e.calibration else "")))  # which path this CPU kept, and why
        ctx.details["quantized"] = {"rates": rates, "skipped": skipped}
        return rows
    finally:
        for name, e in engines.items():
            if name != "fp32":
                e.close()
