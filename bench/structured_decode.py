"""12. Structured outputs' cost (#42): a decode step at batch 8 on the shipped tiny model with every request held to a
grammar, side by side with the same requests unconstrained. The tiny model's step is a few milliseconds, so the
grammar's share is as large here as it gets. The engine is paused and stepped from this thread, each decode step
timed on its own (no loop thread, no reader in between: on a busy 2-core machine their hand-offs move a step by
more than the grammar costs); runs alternate (A B A B ...) and the medians are compared. The masks are filled
ahead on their own thread (engine/grammar_masks.py), so what they cost the step is the time the step thread spends
on them: handing them to that thread, waiting for what the rest of the step did not hide, and applying them to the
batch's logits; each is timed in the engine's own functions, and so are the fill itself (on its thread) and the
forward (is it slower beside the fill?). The rest of the constrained step (each token's advance, the
step-through's `constrained` event) is reported beside it."""
import contextlib
import time
from collections import defaultdict

import torch

from minivlm.engine import grammar_masks, structured_output

from minivlm import Engine, EngineConfig, Request, SamplingParams, StructuredOutputsParams as SO

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


@contextlib.contextmanager
def timed(engine, spent: dict):
    """spent[name] += seconds in each of the engine's mask functions (and the forward) while the block runs."""
    def wrap(owner, name, key):
        inner = getattr(owner, name)

        def timed_call(*args, **kw):
            t = time.perf_counter()
            try:
                return inner(*args, **kw)
            finally:
                spent[key] += time.perf_counter() - t
        setattr(owner, name, timed_call)
        return inner
    targets = [(grammar_masks.MaskFiller, "start", "hand"), (grammar_masks.BatchMasks, "wait", "wait"),
               (structured_output, "apply_bitmasks", "apply"), (grammar_masks.BatchMasks, "fill", "fill"),
               (engine.core.runner, "forward", "forward")]
    saved = [(owner, name, wrap(owner, name, key)) for owner, name, key in targets]
    try:
        yield spent
    finally:
        for owner, name, inner in saved:
            if owner is engine.core.runner:
                delattr(owner, name)  # the instance attribute goes; the class's method shows through again
            else:
                setattr(owner, name, inner)


def decode_steps(engine, requests, so, spent: dict | None = None) -> list[float]:
    """Seconds of each decode step of one batch, every request constrained by `so` (or none), stepped by hand;
    spent (if given) gets the seconds each mask function and the forward took in those steps."""
    params = SamplingParams(max_tokens=LONG, ignore_eos=True, structured_outputs=so)
    engine.reset_prefix_cache()
    engine.pause()
    times = []
    try:
        handles = [engine.submit(r, params) for r in requests]
        while not all(h.finished for h in handles):
            step = defaultdict(float)
            with timed(engine, step):
                t = time.perf_counter()
                engine.step()
                took = time.perf_counter() - t
            plan = engine.core.last_plan
            if plan.kind == "decode" and len(plan.requests) == len(requests):  # the whole batch decoding
                times.append(took)
                for k, v in step.items():
                    if spent is not None:
                        spent[k].append(v)
            for h in handles:  # drain what the step delivered (a handle holds its events until read)
                while h.get(timeout=0) is not None:
                    pass
    finally:
        engine.resume()
    return times


def step_times(engine, requests, so, repeats: int) -> tuple[dict[str, list[float]], dict[str, dict]]:
    """Median decode-step seconds of each run: free, under `so` with the masks filled as the engine chose, and under
    `so` filled the other way (beside the forward, or on the step thread), runs alternating; and the seconds per step
    each mask function and the forward took (all steps of all runs, by kind)."""
    filler = engine.core.masks
    chosen = filler.beside_forward
    kinds = {"free": (None, chosen), "grammar": (so, chosen), "other": (so, not chosen)}
    out, parts = {k: [] for k in kinds}, {k: defaultdict(list) for k in kinds}
    try:
        for _ in range(repeats):
            for kind, (grammar, beside) in kinds.items():
                filler.beside_forward = beside
                steps = decode_steps(engine, requests, grammar, parts[kind])
                assert len(steps) == LONG - 1, len(steps)  # every request decoded at every step
                out[kind].append(median(steps))
    finally:
        filler.beside_forward = chosen
    return out, {kind: {k: median(v) for k, v in p.items()} for kind, p in parts.items()}


def mask_cost(p: dict, free: dict, beside: bool) -> float:
    """Seconds a step spends on its masks: the step thread's own time on them, and (filled beside the forward) what
    the forward lost to the fill."""
    own = p["hand"] + p["wait"] + p["apply"]
    return own + max(0.0, p["forward"] - free["forward"]) if beside else own


def where(beside: bool) -> str:
    return "beside the forward" if beside else "on the step thread"


def measure(ctx, batch: int = 8) -> list[Row]:
    engine = Engine(EngineConfig(device=ctx.engine.config.device, num_blocks=256))  # the shipped tiny model
    requests = [Request(prompt="Describe the picture.", images=[scene(160 + 16 * i, 160, i)]) for i in range(batch)]
    rows, details = [], {}
    chosen = engine.core.masks.beside_forward
    try:
        decode_steps(engine, requests, GRAMMARS["json"])  # first calls pay one-time costs
        for name, so in GRAMMARS.items():
            times, parts = step_times(engine, requests, so, 3 * ctx.repeats)
            free, held, other = (median(times[k]) for k in ("free", "grammar", "other"))
            p, q = parts["grammar"], parts["other"]
            mask, mask_other = mask_cost(p, parts["free"], chosen), mask_cost(q, parts["free"], not chosen)
            details[name] = {"step_s": times, "parts_s": parts, "beside_forward": chosen}
            rows.append(Row(f"grammar mask per decode step, batch {batch}, tiny model ({name})", mask * 1e3, free * 1e3,
                            "ms", mask / free, "mask <= 10% of a step", mask <= 0.10 * free,
                            f"ratio = the masks' time / unconstrained step; filled {where(chosen)} (the engine's "
                            f"choice here): handed over {p['hand'] * 1e3:.3f} ms + waited {p['wait'] * 1e3:.3f} ms + "
                            f"applied {p['apply'] * 1e3:.3f} ms; the fill itself {p['fill'] * 1e3:.3f} ms (x{batch}); "
                            f"forward {p['forward'] * 1e3:.2f} ms (unconstrained {parts['free']['forward'] * 1e3:.2f}); "
                            f"the whole constrained step (also each token's advance, the step-through's event) "
                            f"{held * 1e3:.2f} ms, {held / free - 1:+.0%}",
                            spread=spread(times["grammar"], times["free"], "s")))
            rows.append(Row(f"same ({name}), the masks filled the other way", mask_other * 1e3, mask * 1e3, "ms",
                            mask_other / mask, "context", None,
                            f"filled {where(not chosen)}: handed over {q['hand'] * 1e3:.3f} ms + waited "
                            f"{q['wait'] * 1e3:.3f} ms + applied {q['apply'] * 1e3:.3f} ms; forward "
                            f"{q['forward'] * 1e3:.2f} ms; the whole constrained step {other * 1e3:.2f} ms "
                            f"(the engine's choice {held * 1e3:.2f} ms)", spread=spread(times["other"], times["grammar"])))
    finally:
        engine.close()
    ctx.details["structured_decode"] = details
    return rows
