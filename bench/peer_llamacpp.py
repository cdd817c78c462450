"""`python -m bench --peer llamacpp`: the engine against llama.cpp on the same checkpoint and CPU threads.

The bench checkpoint is converted to GGUF by llama.cpp's own converter (f32 and f16 text model, an mmproj of
the vision tower in the same type); llama.cpp is built from the source the llama-cpp-python sdist vendors
(bench/llamacpp_build.py). Two rows each against llama.cpp f32 (the goal) and f16 (context):
- single-stream decode tokens/s after a 224x224 image prompt, timed the same way on both sides: from the
  arrival of the first streamed token to the last (llama-server streams over HTTP; its own timing is kept too);
- 16 uniform requests x 32 tokens (EOS ignored), all sent at once to `llama-server -np 16 -cb` over HTTP with
  their images, against `Engine.generate` on the same requests (wall time, prefill included on both sides).
The weights are random: llama.cpp's greedy tokens are compared with the engine's (not with HF's) and a
difference is expected where two logits are close; the note counts the matches and the prompt lengths.
Then the precision rows on a ~340M checkpoint (bench/peer_quantized.py): fp32/bf16/int8/int4 against
f32/f16/Q8_0/Q4_K_M, quiet and beside one busy core.
"""
import os
import time
from contextlib import ExitStack

import torch

from minivlm import Request, SamplingParams

from bench import llamacpp_build, llamacpp_server, peer_quantized
from bench.gguf_convert import ensure_gguf
from bench.llamacpp_server import request_body
from bench.single_stream import engine_rate
from bench.timing import Row, decode_rate, interleaved, median, spread
from bench.workload import scene, uniform_requests

DTYPES = ("f32", "f16")  # f32: the engine's own precision (the goal); f16: half the bytes per token (context)
GOALS = {"single": 0.75, "batch": 1.2}


def prepare(model_dir: str, log=print) -> dict:
    """The llama-server binary and each dtype's GGUF pair, building/converting what the cache lacks."""
    if not llamacpp_build.is_built():
        log("[llamacpp] no llama.cpp build in the cache: building it first (several minutes, niced)")
        llamacpp_build.ensure_built(log=log)
    return {"server": llamacpp_build.binary("llama-server"),
            **{dtype: ensure_gguf(model_dir, dtype, log=log) for dtype in DTYPES}}


def check_tokens(engine_ids: list[list[int]], replies: list[dict]) -> str:
    """'k/n same tokens as the engine, first token m/n' for llama.cpp's replies."""
    same = sum(e == r["tokens"] for e, r in zip(engine_ids, replies))
    first = sum(e[:1] == r["tokens"][:1] for e, r in zip(engine_ids, replies))
    return f"{same}/{len(replies)} same tokens as the engine (first token {first}/{len(replies)})"


def measure(ctx, model_dir: str, new_tokens: int = 64, batch_size: int = 16, batch_tokens: int = 32,
            log=print) -> list[Row]:
    files = prepare(model_dir, log=log)
    threads, log_dir = torch.get_num_threads(), os.path.dirname(files["f32"][0])
    with ExitStack() as stack:
        servers = {d: stack.enter_context(llamacpp_server.start(files["server"], *files[d], threads, batch_size,
                                                                log_dir)) for d in DTYPES}
        warm = uniform_requests(2, seed=99)  # first image requests pay one-time costs (graph set-up): not timed
        for server in servers.values():
            server.complete_all([request_body(ctx.hf_processor, r, 2) for r in warm])
        rows = single_stream_rows(ctx, servers, new_tokens) + batch_rows(ctx, servers, batch_size, batch_tokens)
    return rows + peer_quantized.measure(ctx, model_dir, log=log)  # after the servers above stopped (memory)


def header_lines(details: dict) -> str:
    """What the peer adds to the bench header (the precision rows' checkpoint, the CPU's SIMD flags)."""
    return peer_quantized.header_lines(details)


def single_stream_rows(ctx, servers: dict, new_tokens: int) -> list[Row]:
    request = Request(prompt="Describe the image in one sentence.", images=[scene(224, 224, 7)])
    body = request_body(ctx.hf_processor, request, new_tokens)
    rates, replies, engine_ids = {"engine": [], **{d: [] for d in servers}}, {d: [] for d in servers}, []
    for _ in range(ctx.repeats):  # interleaved: engine, f32, f16, engine, ... (each after the same pause)
        time.sleep(peer_quantized.SETTLE)
        rate, ids = engine_rate(ctx.engine, request, new_tokens)
        rates["engine"].append(rate)
        engine_ids.append(ids)
        for dtype, server in servers.items():
            time.sleep(peer_quantized.SETTLE)
            times, tokens, last = server.stream(body)
            rates[dtype].append(decode_rate(times))
            replies[dtype].append({"tokens": tokens, "timings": last["timings"]})
    ctx.details["peer_llamacpp_single"] = {"rates": rates, **{
        d: {"prompt_tokens": [r["timings"]["prompt_n"] for r in replies[d]],
            "own_rates": [r["timings"]["predicted_per_second"] for r in replies[d]]} for d in servers}}
    eng = median(rates["engine"])
    rows = []
    for dtype in servers:
        peer, goal = median(rates[dtype]), GOALS["single"] if dtype == "f32" else None
        prompt_n = replies[dtype][0]["timings"]["prompt_n"]
        own = [r["timings"]["predicted_per_second"] for r in replies[dtype]]
        rows.append(Row(
            f"single-stream decode vs llama.cpp {dtype}", eng, peer, "tok/s", eng / peer,
            f">= {goal}x" if goal else "(context)", eng / peer >= goal if goal else None,
            f"{new_tokens} tokens after a 224x224 image prompt ({prompt_n} prompt tokens in llama.cpp); both timed "
            f"by token arrival (llama.cpp's own timing: {median(own):.3g} tok/s); "
            f"{check_tokens(engine_ids[:1], replies[dtype][:1])}",
            spread=spread(rates["engine"], rates[dtype], "tok/s")))
    return rows


def batch_rows(ctx, servers: dict, batch_size: int, new_tokens: int) -> list[Row]:
    requests = uniform_requests(batch_size)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    bodies = [request_body(ctx.hf_processor, r, new_tokens) for r in requests]
    results = {}

    def run_engine():
        ctx.engine.reset_prefix_cache()
        outs = ctx.engine.generate(requests, params)
        results["engine"], results["prompt"] = [o.token_ids for o in outs], sum(o.num_prompt_tokens for o in outs)

    def runner(dtype):
        def run():
            results[dtype] = servers[dtype].complete_all(bodies)
        return run

    times = interleaved({"engine": run_engine, **{d: runner(d) for d in servers}}, ctx.repeats)
    total = batch_size * new_tokens
    prompt_tokens = {"engine": results["prompt"],
                     **{d: sum(r["timings"]["prompt_n"] for r in results[d]) for d in servers}}
    retries = {d: servers[d].retries for d in servers}
    ctx.details["peer_llamacpp_batch"] = {"times_s": times, "prompt_tokens": prompt_tokens, "retries": retries}
    eng = total / median(times["engine"])
    rows = []
    for dtype in servers:
        peer, goal = total / median(times[dtype]), GOALS["batch"] if dtype == "f32" else None
        if any(len(r["tokens"]) != new_tokens for r in results[dtype]):
            raise RuntimeError(f"llama-server returned other than {new_tokens} tokens for a request")
        rows.append(Row(
            f"uniform: throughput vs llama-server -np {batch_size} -cb {dtype}", eng, peer, "tok/s", eng / peer,
            f">= {goal}x" if goal else "(context)", eng / peer >= goal if goal else None,
            f"{batch_size} requests x {new_tokens} tokens sent at once over HTTP with their images; prompt tokens: "
            f"engine {results['prompt']}, llama.cpp {prompt_tokens[dtype]}; "
            f"{check_tokens(results['engine'], results[dtype])}"
            + (f"; {retries[dtype]} request(s) sent again after the server dropped the connection" if retries[dtype]
               else ""),
            spread=spread(times["engine"], times[dtype])))
    return rows
