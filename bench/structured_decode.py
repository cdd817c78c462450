"""12. Structured outputs' cost (#42): a decode step at batch 8 on the shipped tiny model with every request held to a
grammar, side by side with the same requests unconstrained. The tiny model's step is a few milliseconds, so the
grammar's share is as large here as it gets. The engine is paused and stepped from this thread, each decode step
timed on its own (no loop thread, no reader in between: on a busy 2-core machine their hand-offs move a step by
more than the grammar costs); runs alternate (A B A B ...) and the medians are compared. Where the engine fills the
masks (engine/sampling/grammar_masks.py: ahead, beside the forward, or at sampling) decides what they cost the step: the time
the step thread spends on them (handing them over, waiting for what was not done, applying them to the batch's
logits), plus whatever the rest of the step lost to a fill running beside it (the constrained step less the mask
functions, each token's advance and the step-through's `constrained` event, against the same with the masks filled
at sampling, where nothing runs beside the step). Each part is timed in the engine's own functions; the other fill
modes are rows of context. The grammar library is the engine's: xgrammar where installed, else llguidance (its masks
cost about 8x more a row on this model: run once with and once without xgrammar to compare)."""
import contextlib
import time
from collections import defaultdict

import torch

from minivlm.engine import progress as engine_progress  # where a step's outcome emits the constrained events
from minivlm.engine.sampling import grammar_masks
from minivlm.engine.sampling import structured_output

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
               (engine.core.runner, "forward", "forward"), (structured_output.Matcher, "advance", "advance"),
               (engine_progress, "constrained_events", "events")]
    if engine.intake.grammars().backend == "xgrammar":  # its matchers advance in their own class
        from minivlm.engine.sampling.structured_xgrammar import XMatcher
        targets.append((XMatcher, "advance", "advance"))
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
    """Median decode-step seconds of each run: free, and under `so` with the masks filled in each of the filler's
    modes, runs alternating; and the seconds per step each timed function took (all steps of all runs, by kind)."""
    filler = engine.core.masks
    chosen = filler.mode
    kinds = {"free": None, **{mode: so for mode in filler.MODES}}
    out, parts = {k: [] for k in kinds}, {k: defaultdict(list) for k in kinds}
    try:
        for _ in range(repeats):
            for kind, grammar in kinds.items():
                filler.mode = chosen if grammar is None else kind
                steps = decode_steps(engine, requests, grammar, parts[kind])
                assert len(steps) == LONG - 1, len(steps)  # every request decoded at every step
                out[kind].append(median(steps))
    finally:
        filler.mode = chosen
    return out, {kind: {k: median(v) if v else 0.0 for k, v in p.items()} for kind, p in parts.items()}


def rest(step: float, p: dict) -> float:
    """Seconds of a constrained step outside the mask functions, the advances and the step-through's event."""
    return step - p["hand"] - p["wait"] - p["apply"] - p["advance"] - p["events"]


def mask_cost(step: float, p: dict, step_at_sampling: float, p_at_sampling: dict) -> tuple[float, float]:
    """(seconds a step spends on its masks, of which the rest of the step lost to a fill beside it): the step
    thread's own time on them, and (filled on a worker thread) how much longer the rest of the step took than with
    the masks filled at sampling, where nothing runs beside it."""
    lost = max(0.0, rest(step, p) - rest(step_at_sampling, p_at_sampling))
    return p["hand"] + p["wait"] + p["apply"] + lost, lost


LIBRARY = {"xgrammar": "xgrammar (installed here)", "guidance": "llguidance (xgrammar is not installed)"}
WHERE = {"ahead": "ahead (from the previous step's update, on a worker thread)",
         "beside": "beside the forward (from the step's start, on a worker thread)",
         "sampling": "at sampling (on the step thread)"}


def measure(ctx, batch: int = 8) -> list[Row]:
    engine = Engine(EngineConfig(device=ctx.engine.config.device, num_blocks=256))  # the shipped tiny model
    requests = [Request(prompt="Describe the picture.", images=[scene(160 + 16 * i, 160, i)]) for i in range(batch)]
    rows, details = [], {}
    chosen = engine.core.masks.mode
    try:
        decode_steps(engine, requests, GRAMMARS["json"])  # first calls pay one-time costs
        for name, so in GRAMMARS.items():
            times, parts = step_times(engine, requests, so, 3 * ctx.repeats)
            free = median(times["free"])
            at_sampling = (median(times["sampling"]), parts["sampling"])
            cost = {mode: mask_cost(median(times[mode]), parts[mode], *at_sampling) for mode in engine.core.masks.MODES}
            library = engine.intake.grammars().backend  # xgrammar where installed, else llguidance ("guidance")
            details[name] = {"step_s": times, "parts_s": parts, "mode": chosen, "library": library}
            for mode in (chosen, *(m for m in engine.core.masks.MODES if m != chosen)):
                (mask, lost), p, held = cost[mode], parts[mode], median(times[mode])
                what = (f"filled {WHERE[mode]}: handed over {p['hand'] * 1e3:.3f} ms + waited {p['wait'] * 1e3:.3f} "
                        f"ms + applied {p['apply'] * 1e3:.3f} ms + the rest of the step slower by {lost * 1e3:.3f} ms; "
                        f"the fill itself {p['fill'] * 1e3:.3f} ms (x{batch}); forward {p['forward'] * 1e3:.2f} ms "
                        f"(unconstrained {parts['free']['forward'] * 1e3:.2f}); the whole constrained step "
                        f"{held * 1e3:.2f} ms, {held / free - 1:+.0%} (also each token's advance "
                        f"{p['advance'] * 1e3:.3f} ms, the step-through's event {p['events'] * 1e3:.3f} ms)")
                if mode == chosen:
                    rows.append(Row(f"grammar mask per decode step, batch {batch}, tiny model ({name})", mask * 1e3,
                                    free * 1e3, "ms", mask / free, "mask <= 10% of a step", mask <= 0.10 * free,
                                    "ratio = the masks' time / unconstrained step; grammar library: "
                                    f"{LIBRARY[library]}; the engine's choice here, " + what,
                                    spread=spread(times[mode], times["free"], "s")))
                else:
                    rows.append(Row(f"same ({name}), the masks filled {mode}", mask * 1e3, cost[chosen][0] * 1e3,
                                    "ms", mask / max(cost[chosen][0], 1e-9), "context", None, what,
                                    spread=spread(times[mode], times[chosen])))
    finally:
        engine.close()
    rows += speculating(ctx, batch, details)
    ctx.details["structured_decode"] = details
    return rows


SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


def speculating(ctx, batch: int, details: dict) -> list[Row]:
    """The same batch speculating (n-gram, 4 guesses), held to the regex: a request's masks are a row at its last
    token and one after each guess (walked along the guesses and rolled back). Filled ahead, they follow the
    speculator's upcoming guesses (the step takes a prefix of them); the step thread's time on them per step (handed
    over, waited for, applied), filled ahead and at sampling, runs alternating, against the same speculating step
    unconstrained. Filling ahead changes no token (tests/test_spec_masks_ahead.py): it is for speed only."""
    engine = Engine(EngineConfig(device=ctx.engine.config.device, num_blocks=256, speculative_config=SPEC))
    requests = [Request(prompt="Describe the picture.", images=[scene(160 + 16 * i, 160, i)]) for i in range(batch)]
    filler, so = engine.core.masks, GRAMMARS["regex"]
    chosen, kinds = filler.mode, {"free": None, "ahead": so, "sampling": so}
    times, parts = {k: [] for k in kinds}, {k: defaultdict(list) for k in kinds}
    try:
        decode_steps(engine, requests, so)  # first calls pay one-time costs
        for _ in range(3 * ctx.repeats):
            for kind, grammar in kinds.items():
                filler.mode = chosen if grammar is None else kind
                times[kind].append(median(decode_steps(engine, requests, grammar, parts[kind])))
        drafted = engine.spec_decode_stats()
    finally:
        filler.mode = chosen
        engine.close()
    free = median(times["free"])
    mask = {k: median([h + w + a for h, w, a in zip(parts[k]["hand"], parts[k]["wait"], parts[k]["apply"])])
            for k in ("ahead", "sampling")}
    details["speculating"] = {"step_s": times, "mask_s": mask, "acceptance": drafted.num_accepted_tokens /
                              max(1, drafted.num_draft_tokens)}
    ms = {k: {name: median(v) * 1e3 for name, v in parts[k].items()} for k in mask}
    what = {k: f"handed over {ms[k]['hand']:.3f} ms + waited {ms[k]['wait']:.3f} ms + applied {ms[k]['apply']:.3f} "
               f"ms; the fill itself {ms[k]['fill']:.3f} ms; the whole constrained step {median(times[k]) * 1e3:.2f} "
               f"ms (unconstrained {free * 1e3:.2f}); acceptance {details['speculating']['acceptance']:.2f}"
            for k in mask}
    return [Row(f"grammar mask per speculating decode step (n-gram, 4 guesses), batch {batch}, tiny model (regex), "
                "filled ahead", mask["ahead"] * 1e3, free * 1e3, "ms", mask["ahead"] / free, "mask <= 10% of a step",
                mask["ahead"] <= 0.10 * free, "ratio = the step thread's time on the masks / unconstrained speculating "
                "step; the rows along the guesses filled ahead too (the accelerator's default mode), " + what["ahead"],
                spread=spread(times["ahead"], times["free"], "s")),
            Row("same (speculating), the masks filled at sampling", mask["sampling"] * 1e3, mask["ahead"] * 1e3, "ms",
                mask["sampling"] / max(mask["ahead"], 1e-9), "context", None, what["sampling"],
                spread=spread(times["sampling"], times["ahead"], "s"))]
