"""The engine's own Python per step (issue #57 goal 5: <= 0.3 ms a step at batch 1): scheduler, plan, the forward's
inputs and attention metadata, sampling, update, the output path and delivery to the handles, timed on an engine
whose model forward returns its logits at once. Only the backend's forward is replaced (by a function that hands back
a fixed logits tensor, the same token's argmax every row): what is timed is everything the engine does around the
matrices, which is what the row measures, not a stand-in for it. Decode steps of a paused engine stepped one at a
time (engine.step: the loop thread's own path), batch 1 and batch 16, image requests, greedy; each step checked to
be a decode step of the whole batch. The figure is the stepping thread's CPU time (time.thread_time): with an empty
model every op of the step runs on that thread, and on a shared 2-core machine the wall time mostly measures the
other processes (its median is in the note). Beside it, the real model's decode step (wall) on the same engine."""
import time

import torch

from minivlm import Request, SamplingParams

from bench.timing import Row, median, spread
from bench.workload import PROMPTS, scene


def empty_model(engine):
    """The engine's backend forward returns a fixed logits row per requested row, at once."""
    vocab = engine.core.model.text_config.vocab_size
    logits = torch.zeros(64, vocab)
    logits[:, vocab // 2] = 1.0  # an ordinary token every step: its text goes down the output path as any would
    engine.core.runner.backend.forward = lambda decoder, embeds, positions, kv, meta, deep, last, **kw: \
        logits[:len(last)]


def decode_steps(engine, batch: int, steps: int, empty: bool = True, warm: int = 4,
                 clock=time.perf_counter) -> list[float]:
    """Seconds of each of `steps` decode steps of `batch` image requests on an isolated copy of engine (empty: its
    model forward returns at once), by `clock`."""
    e = engine.isolated()
    if empty:
        empty_model(e)
    e.pause()
    params = SamplingParams(max_tokens=steps + warm + 2, ignore_eos=True, temperature=0)
    handles = [e.submit(Request(prompt=PROMPTS[i % len(PROMPTS)], images=[scene(160, 160, i)]), params)
               for i in range(batch)]
    for _ in range(warm):  # the prefill, and the first decodes (one-time costs: the allocator, the first lookups)
        e.step()
    times = []
    for _ in range(steps):
        t = clock()
        e.step()
        times.append(clock() - t)
        plan = e.core.last_plan
        assert plan.kind == "decode" and len(plan) == batch, f"a measured step was {plan.kind} of {len(plan)}"
    e.resume()
    e.close()
    del handles
    return times


def measure(ctx, steps: int = 200) -> list[Row]:
    rows, details = [], {}
    for batch in (1, 16):
        empty = [decode_steps(ctx.engine, batch, steps, clock=time.thread_time) for _ in range(ctx.repeats)]
        wall = median(decode_steps(ctx.engine, batch, steps))
        real = decode_steps(ctx.engine, batch, 16, empty=False)
        step, model_step = median([median(t) for t in empty]), median(real)
        share = step / model_step
        details[batch] = {"empty_step_cpu_s": [median(t) for t in empty], "empty_step_wall_s": wall,
                          "real_step_s": real}
        rows.append(Row(f"engine step with an empty model (batch {batch})", step * 1e3, model_step * 1e3, "ms", share,
                        "<= 0.3 ms a step (% of a real step)" if batch == 1 else "(context: % of a real step)",
                        step <= 0.3e-3 if batch == 1 else None,
                        f"the stepping thread's CPU time, median of {steps} decode steps x {ctx.repeats} runs, "
                        f"{step / batch * 1e6:.0f} µs a request (wall: {wall * 1e3:.3f} ms); a real decode step of "
                        f"the same engine {model_step * 1e3:.2f} ms (wall, median of 16)",
                        spread=spread([median(t) * 1e3 for t in empty], [t * 1e3 for t in real], "ms")))
    ctx.details["step_overhead"] = details
    return rows
