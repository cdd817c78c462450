"""2. Single stream: decode tokens/s of one request, engine vs HF generate, and against the memory-bandwidth
bound (every decode step reads all decoder weights once: bound = copy bandwidth / weight bytes)."""
import time

import torch

from minivlm import Request, SamplingParams

from bench.long_context import decode_steps
from bench.timing import Row, TokenClock, copy_bandwidth, decode_rate, median, spread
from bench.workload import hf_inputs, scene


def engine_rate(engine, request: Request, new_tokens: int) -> tuple[float, list[int]]:
    """Decode tokens/s of one streamed request, and its token ids."""
    engine.reset_prefix_cache()
    times, last = [], None
    for last in engine.stream(request, SamplingParams(max_tokens=new_tokens, ignore_eos=True), snapshots=False):
        times.append(time.perf_counter())
    return decode_rate(times), last.output.token_ids


def hf_rate(model, processor, request: Request, new_tokens: int) -> tuple[float, list[int]]:
    inputs = hf_inputs(processor, [request], model.device)
    clock = TokenClock()
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=processor.tokenizer.pad_token_id, streamer=clock)
    return decode_rate(clock.times), out[0, inputs["input_ids"].shape[1]:].tolist()


def measure(ctx, new_tokens: int = 64) -> list[Row]:
    request = Request(prompt="Describe the image in one sentence.", images=[scene(224, 224, 7)])
    rates, tokens = {"engine": [], "hf": []}, {"engine": [], "hf": []}
    runs = {"engine": lambda: engine_rate(ctx.engine, request, new_tokens),
            "hf": lambda: hf_rate(ctx.hf_model, ctx.hf_processor, request, new_tokens)}
    for _ in range(ctx.repeats):  # interleaved: engine, HF, engine, HF, ...
        for side, run in runs.items():
            rate, ids = run()
            rates[side].append(rate)
            tokens[side].append(ids)
    same = f"{int(all(t == tokens['hf'][0] for t in tokens['engine'] + tokens['hf']))}/1"
    eng, hf = median(rates["engine"]), median(rates["hf"])
    report = ctx.engine.memory_report()
    weight_bytes = report.weights_bytes - report.vision_weights_bytes  # decode never touches the vision tower
    bandwidth = copy_bandwidth(ctx.engine.device)
    bound = bandwidth / weight_bytes
    ctx.details["single_stream"] = {"rates": rates, "decoder_weight_bytes": weight_bytes,
                                    "copy_bandwidth_GBps": bandwidth / 1e9, "bound_tok_s": bound}
    rate_spread = spread(rates["engine"], rates["hf"], "tok/s")
    ops = {True: decode_steps(ctx.engine, [request], 4)[1]}  # PyTorch ops of one decode step: the backend's,
    with ctx.engine.isolated(enforce_eager=True, num_blocks=128) as eager:  # and PyTorch ops only
        ops[False] = decode_steps(eager, [request], 4)[1]
    ctx.details["single_stream"]["ops_per_step"] = {"fused": ops[True], "pytorch": ops[False]}
    op_note = f"; {ops[True]} ops per decode step ({ops[False]} in PyTorch ops only, as with enforce_eager)"
    return [
        Row("single-stream decode vs HF generate", eng, hf, "tok/s", eng / hf, ">= 1.0x", eng >= hf,
            f"{new_tokens} tokens after a 224x224 image prompt{op_note}", same=same, spread=rate_spread),
        Row("single-stream decode vs bandwidth bound", eng, bound, "tok/s", eng / bound, ">= 50%", eng / bound >= 0.5,
            f"{weight_bytes / 1e6:.0f} MB weights/token at {bandwidth / 1e9:.1f} GB/s copy bandwidth", same=same,
            spread=rate_spread.split(";")[0] + " tok/s"),
    ]
