"""8. Long context: 8 streams (and one) with 1,536-token text prompts and 48 new tokens each, the engine against HF
generate on one batch (its contiguous cache; equal prompt lengths, so nothing is padded). Decode attention reads
every sequence's K/V from the paged pool; the row "bytes read per decode step" sets what it reads against the KV
the sequences hold, and the row "decode step" times the engine's decode steps alone, counts their ops and sets them
against the memory bound."""
import random
import time

from torch.profiler import ProfilerActivity, profile

from minivlm import Request, SamplingParams

from bench.timing import Row, copy_bandwidth, interleaved, median, spread
from bench.workload import hf_generate, hf_inputs

PROMPT_TOKENS, NEW_TOKENS, STREAMS = 1536, 48, 8
WORDS = "the quick brown fox jumps over a lazy dog green red blue".split()  # one token each after a space


def long_requests(processor, n: int, tokens: int = PROMPT_TOKENS) -> list[Request]:
    """n text requests whose rendered prompts are exactly `tokens` long (each its own random words)."""
    out = []
    for i in range(n):
        rng, words = random.Random(i), tokens
        for _ in range(4):  # the chat template adds a fixed number of tokens: calibrate once or twice
            req = Request(prompt=" ".join(rng.choice(WORDS) for _ in range(words)), request_id=f"long-{i}")
            rng = random.Random(i)
            got = hf_inputs(processor, [req])["input_ids"].shape[1]
            if got == tokens:
                break
            words -= got - tokens
        out.append(req)
    return out


def decode_steps(engine, requests, new_tokens: int) -> tuple[list[float], int]:
    """Wall seconds of each decode-only forward of one generate() call, and the ops of one such step (profiled)."""
    runner, forward, times, ops = engine.core.runner, engine.core.runner.forward, [], []

    def timed(plan):
        if any(r.end - r.start != 1 for r in plan.requests):  # a prefill step: not timed
            return forward(plan)
        if not ops and len(plan.requests) == len(requests) and times:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                out = forward(plan)
            ops.append(sum(e.count for e in prof.key_averages()))
            return out
        t = time.perf_counter()
        out = forward(plan)
        times.append(time.perf_counter() - t)
        return out
    runner.forward = timed
    try:
        engine.reset_prefix_cache()
        engine.generate(requests, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    finally:
        del runner.forward  # the instance attribute goes: the class's method is back
    return times, ops[0] if ops else 0


def measure(ctx) -> list[Row]:
    engine = ctx.engine.isolated(max_model_len=PROMPT_TOKENS + 64, num_blocks=STREAMS * (PROMPT_TOKENS + 64) // 16 + 16)
    rows = []
    try:
        for n in (STREAMS, 1):
            rows += measure_streams(ctx, engine, n)
    finally:
        engine.close()
    return rows


def measure_streams(ctx, engine, n: int) -> list[Row]:
    requests = long_requests(ctx.hf_processor, n)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    got = {}

    def run_engine():
        engine.reset_prefix_cache()
        got["engine"] = [o.token_ids for o in engine.generate(requests, params)]

    def run_hf():
        got.setdefault("hf", []).append(hf_generate(ctx.hf_model, ctx.hf_processor, requests, NEW_TOKENS))

    times = interleaved({"engine": run_engine, "hf": run_hf}, ctx.repeats)
    same = sum(all(rep[i] == got["engine"][i] for rep in got["hf"]) for i in range(n))
    rate = {side: n * NEW_TOKENS / median(times[side]) for side in times}
    goal = 1.5 if n > 1 else 1.2
    label = f"long context, {n} stream{'s' if n > 1 else ''}"
    rows = [Row(f"{label}: throughput vs HF generate", rate["engine"], rate["hf"], "tok/s",
                rate["engine"] / rate["hf"], f">= {goal}x", rate["engine"] / rate["hf"] >= goal,
                f"{n} x {PROMPT_TOKENS}-token text prompts, {NEW_TOKENS} new tokens; attention: {engine.attention_backend}",
                same=f"{same}/{n}", spread=spread(times["engine"], times["hf"]))]
    step_times, ops = decode_steps(engine, requests, 12)
    step, bound = median(step_times), step_bound(engine, n)
    ctx.details[f"long_context_{n}"] = {"times_s": times, "decode_step_s": step_times, "decode_step_ops": ops,
                                        "decode_step_bound_s": bound}
    if n > 1:
        rows.append(bytes_row(engine, n))
    rows.append(Row(f"{label}: decode step vs memory bound", step * 1e3, bound * 1e3, "ms", bound / step, "(context)",
                    None, f"{ops} ops per decode step (torch profiler); bound = (decoder weights + K/V read) / copy "
                    f"bandwidth; context {PROMPT_TOKENS}-{PROMPT_TOKENS + 12} tokens",
                    spread=f"{min(step_times) * 1e3:.3g}–{max(step_times) * 1e3:.3g} ms"))
    return rows


def kv_bytes_per_token(engine) -> int:
    cfg = engine.hf_config.get_text_config()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * engine.model.dtype.itemsize


def step_bound(engine, n: int) -> float:
    """The fastest a decode step can be: every decoder weight and every context token's K/V read once, at the
    machine's copy bandwidth."""
    report = engine.memory_report()
    weights = report.weights_bytes - report.vision_weights_bytes
    return (weights + n * (PROMPT_TOKENS + 6) * kv_bytes_per_token(engine)) / copy_bandwidth(engine.device)


def bytes_row(engine, n: int) -> Row:
    """K/V bytes one decode step's attention reads against the K/V the sequences hold, at the bench's lengths.
    In place, each (sequence, KV head) reads its own tokens' rows once; gathering reads the padded context, writes
    a copy and attention reads the copy again."""
    per_token = kv_bytes_per_token(engine)
    ctx_tokens = PROMPT_TOKENS + NEW_TOKENS // 2  # mid-answer
    bs = engine.config.block_size
    held = n * -(-ctx_tokens // bs) * bs * per_token  # whole blocks are allocated
    in_place = engine.attention_backend.startswith("in-place")
    read = n * ctx_tokens * per_token if in_place else 3 * n * -(-ctx_tokens // bs) * bs * per_token
    return Row("long context: attention bytes read per decode step / KV held", read / 1e6, held / 1e6, "MB",
               read / held, "<= 1.2x", read / held <= 1.2, f"{n} sequences at {ctx_tokens} tokens; "
               + ("each token's K/V read once, in place" if in_place else "gathered: copy written, then read again"))
