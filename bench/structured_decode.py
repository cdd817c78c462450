"""12. Structured outputs' cost (#42): a decode step at batch 8 on the shipped tiny model with every request held to a
grammar, side by side with the same requests unconstrained. The tiny model's step is a few milliseconds, so the
grammar's share is as large here as it gets. The engine is paused and stepped from this thread, each decode step
timed on its own (no loop thread, no reader in between: on a busy 2-core machine their hand-offs move a step by
more than the grammar costs); runs alternate (A B A B ...) and the medians are compared. Where the grammar's time
goes is measured too: the per-request masks (llguidance's mask into each request's row, on the step thread), the
masks applied to the batch's logits, and the step-through's `constrained` event."""
import time

import torch

from minivlm import Engine, EngineConfig, Request, SamplingParams, StructuredOutputsParams as SO
from minivlm.engine.structured_output import apply_bitmasks

from bench.timing import Row, median, spread
from bench.workload import scene

# grammars that never finish inside LONG tokens, so every step of every request is constrained: the tiny model's own
# kind of sentence, repeated, and a JSON list of objects with a free-text field
SENTENCES = (r"((red|green|blue|yellow|purple|orange) (circle|square|triangle) at the (top|bottom|center|middle)"
             r"( left| right)?( and |, |\. ))*")
OBJECTS = {"type": "array", "minItems": 50, "items": {
    "type": "object", "additionalProperties": False, "required": ["colour", "shape"],
    "properties": {"colour": {"enum": ["red", "green", "blue", "yellow"]},
                   "shape": {"enum": ["circle", "square", "triangle"]}, "where": {"type": "string"}}}}
GRAMMARS = {"regex": SO(regex=SENTENCES), "json": SO(json=OBJECTS)}
LONG = 48  # tokens per request: LONG - 1 decode steps of the whole batch


def decode_steps(engine, requests, so) -> list[float]:
    """Seconds of each decode step of one batch, every request constrained by `so` (or none), stepped by hand."""
    params = SamplingParams(max_tokens=LONG, ignore_eos=True, structured_outputs=so)
    engine.reset_prefix_cache()
    engine.pause()
    times = []
    try:
        handles = [engine.submit(r, params) for r in requests]
        while not all(h.finished for h in handles):
            t = time.perf_counter()
            engine.step()
            plan = engine.core.last_plan
            if plan.kind == "decode" and len(plan.requests) == len(requests):  # the whole batch decoding
                times.append(time.perf_counter() - t)
            for h in handles:  # drain what the step delivered (a handle holds its events until read)
                while h.get(timeout=0) is not None:
                    pass
    finally:
        engine.resume()
    return times


def step_times(engine, requests, so, repeats: int) -> dict[str, list[float]]:
    """Median decode-step seconds of each run, free and under `so`, runs alternating."""
    out = {"free": [], "grammar": []}
    for _ in range(repeats):
        for kind in out:
            steps = decode_steps(engine, requests, so if kind == "grammar" else None)
            assert len(steps) == LONG - 1, len(steps)  # every request decoded at every step
            out[kind].append(median(steps))
    return out


def mask_parts(engine, so, batch: int, steps: int = LONG) -> dict[str, float]:
    """Seconds per step of the grammar's own work for `batch` requests: their masks, filled one request at a time
    as the scheduler does, and the masks applied to a [batch, vocab] logits tensor, as the sampler does."""
    grammars = engine.intake.grammars()
    matchers = [grammars.matcher(so) for _ in range(batch)]
    vocab = engine.hf_config.text_config.vocab_size
    logits = torch.randn(batch, vocab)
    fill = apply = 0.0
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        t = time.perf_counter()
        masks = [m.allowed() for m in matchers]
        fill += time.perf_counter() - t
        t = time.perf_counter()
        shaped = logits.clone()
        apply_bitmasks(shaped, list(range(batch)), masks)
        apply += time.perf_counter() - t
        for m, row in zip(matchers, shaped):  # a token each grammar allows, drawn from the masked logits
            m.advance(int(torch.multinomial(torch.softmax(row, -1), 1, generator=gen)))
    return {"fill": fill / steps, "apply": apply / steps}


def measure(ctx, batch: int = 8) -> list[Row]:
    engine = Engine(EngineConfig(device=ctx.engine.config.device, num_blocks=256))  # the shipped tiny model
    requests = [Request(prompt="Describe the picture.", images=[scene(160 + 16 * i, 160, i)]) for i in range(batch)]
    rows, details = [], {}
    try:
        decode_steps(engine, requests, GRAMMARS["json"])  # first calls pay one-time costs
        for name, so in GRAMMARS.items():
            times = step_times(engine, requests, so, 3 * ctx.repeats)
            free, held = median(times["free"]), median(times["grammar"])
            parts = mask_parts(engine, so, batch)
            mask = parts["fill"] + parts["apply"]
            details[name] = {"step_s": times, "mask_parts_s": parts}
            rows.append(Row(f"grammar mask per decode step, batch {batch}, tiny model ({name})", mask * 1e3, free * 1e3,
                            "ms", mask / free, "mask <= 10% of a step", mask <= 0.10 * free,
                            f"ratio = mask / unconstrained step; masks {parts['fill'] * 1e3:.2f} ms (x{batch}, step "
                            f"thread) + applied {parts['apply'] * 1e3:.2f} ms; the whole constrained step (also each "
                            f"token's advance, the step-through's event) {held * 1e3:.2f} ms, {held / free - 1:+.0%}",
                            spread=spread(times["grammar"], times["free"], "s")))
    finally:
        engine.close()
    ctx.details["structured_decode"] = details
    return rows
