"""The roofline's points: each engine step the event log timed (its `scheduled` event's `started` and `ended`, read
from the engine's own clock) against what that step had to read and compute (budget/roofline.py, from the step's
plan: each request's [start, end) tokens), and the same points predicted for a model that is not loaded.

measure_points runs a fixed set of text requests (batches of 1, 4, 16 at a short and a long context) on an isolated
engine that shares the loaded weights (its own pool: the served cache is untouched) and reads its log back; no
second timer is involved."""
import statistics
import time
from dataclasses import dataclass

from minivlm.budget.machine import Machine
from minivlm.budget.roofline import ModelCosts, StepCost, decode_cost, model_costs, step_cost
from minivlm.engine.request import Request, SamplingParams

BATCHES = (1, 4, 16)
CONTEXTS = (64, 1024)  # tokens of prompt: a short context (weights dominate) and a long one (the KV reads grow)
NEW_TOKENS = 6         # tokens each request makes: 5 decode steps after its prefill, the first not counted
PREFILL_TOKENS = 512   # the predicted prefill chunk
BUDGET_S = 60.0        # measuring stops starting runs that could not end within this


@dataclass(frozen=True)
class Point:
    """One kind of step: its cost, how long it took (None: predicted only) and the bound the machine sets."""
    kind: str            # "decode", "prefill" or "mixed"
    batch: int           # requests in the step
    context: int         # tokens of context per request (its longest), after the step
    cost: StepCost
    bound_s: float       # machine.bound_s(cost.bytes, cost.flops)
    memory_bound: bool   # the bandwidth ceiling is the lower one
    seconds: float | None = None  # the median of the steps measured; None when predicted
    steps: int = 0       # steps measured

    @property
    def predicted(self) -> bool:
        return self.seconds is None

    @property
    def fraction(self) -> float | None:
        """The bound over the time taken: 1.0 is the hardware's best."""
        return None if self.seconds is None else self.bound_s / self.seconds

    @property
    def achieved(self) -> float | None:
        """FLOP/s the step reached: the point's height on the roofline."""
        return None if self.seconds is None else self.cost.flops / self.seconds


def point(kind: str, batch: int, context: int, cost: StepCost, machine: Machine, seconds=None, steps=0) -> Point:
    """A Point with its bound on `machine`: memory-bound when reading its bytes takes longer than its FLOPs."""
    return Point(kind, batch, context, cost, machine.bound_s(cost.bytes, cost.flops),
                 cost.bytes / machine.bandwidth >= cost.flops / machine.flops, seconds, steps)


def engine_costs(engine) -> ModelCosts:
    """The loaded model's costs as the calculator counts them, in the dtype it holds its weights and K/V in."""
    report = engine.memory_report()
    return model_costs(engine.hf_config, engine.config.quantization or report.dtype, report.dtype)


def timed_steps(events, costs: ModelCosts) -> list[tuple[str, int, int, StepCost, float]]:
    """(kind, requests, longest context, cost, seconds) of every step whose `scheduled` event has its start and end,
    from the plan it carried (a step that encoded images is left out: its time holds the vision tower's)."""
    out = []
    for ev in events:
        if ev.kind != "scheduled" or ev.fields.get("ended") is None or ev.fields.get("started") is None:
            continue
        plan = ev.plan
        if not plan or any(r.get("encode") for r in plan):
            continue
        cost = step_cost(costs, [(r["start"], r["end"] - r["start"]) for r in plan],
                         sum(1 for r in plan if r.get("sample")))  # a chunk that samples nothing skips the head
        out.append((ev.step_kind, len(plan), max(r["end"] for r in plan), cost, ev.ended - ev.started))
    return out


def summarise(steps, machine: Machine, batch: int) -> list[Point]:
    """The run's points: its decode steps of `batch` requests as one (the median time, the cost of the middle step,
    the first step left out: a new batch shape pays one-time setup), and its other steps one per shape (kind,
    requests, context), each the median of its steps."""
    shapes: dict[tuple, list] = {}
    for s in steps:
        if s[0] != "decode":
            shapes.setdefault(s[:3], []).append(s)
    decodes = [s for s in steps if s[0] == "decode" and s[1] == batch][1:]
    groups = ([decodes] if decodes else []) + list(shapes.values())
    points = []
    for group in groups:
        kind, n, ctx, cost, _ = group[len(group) // 2]
        points.append(point(kind, n, ctx, cost, machine, statistics.median(s[4] for s in group), len(group)))
    return points


def prompt_of(engine, tokens: int, salt: int) -> str:
    """A text prompt of about `tokens` tokens (the plan says exactly how many), different for every salt."""
    words = [f"w{salt}"] + ["the shape is red and round"] * (tokens // 6 + 1)
    ids = engine.tokenizer.encode(" ".join(words))[:max(1, tokens - 16)]  # room for the chat template's tokens
    return engine.tokenizer.decode(ids)


def measure_points(engine, machine: Machine, batches=BATCHES, contexts=CONTEXTS, new_tokens: int = NEW_TOKENS,
                   budget_s: float = BUDGET_S) -> list[Point]:
    """Run each (batch, context) on an isolated engine of the loaded model and read its steps' times back from its
    event log (docs/API.md: the `scheduled` event's started / ended). Contexts are capped by max_model_len. Runs go
    cheapest first, and one whose prefill alone would pass what is left of budget_s at the machine's bound is not
    started (a 3B model's 16 × 1,024-token prefill takes minutes on a CPU): its points are left out."""
    cfg = engine.config
    contexts = sorted({min(c, cfg.max_model_len - new_tokens - 1) for c in contexts})
    blocks = max(batches) * -(-(max(contexts) + new_tokens + cfg.block_size) // cfg.block_size) + 1
    costs, points = engine_costs(engine), []
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    with engine.isolated(cache_strategy="none", num_blocks=blocks, max_num_seqs=max(batches), kv_events=None,
                         speculative_config=None, async_vision=False,
                         event_log_size=max(cfg.event_log_size, 20_000)) as run:  # the log is the stopwatch
        start = time.perf_counter()  # a guard on the run's length only: the points' times are the event log's
        for context in contexts:
            for batch in batches:
                prefill = step_cost(costs, [(0, context)] * batch)
                if time.perf_counter() - start + machine.bound_s(prefill.bytes, prefill.flops) > budget_s:
                    continue
                since = run.snapshot().last_event_seq
                run.generate([Request(prompt=prompt_of(run, context, i)) for i in range(batch)], params)
                points += summarise(timed_steps(run.events(since), costs), machine, batch)
    return points


def predicted_points(costs: ModelCosts, machine: Machine, batches=BATCHES, contexts=CONTEXTS,
                     prefill_tokens: int = PREFILL_TOKENS) -> list[Point]:
    """The same kinds of step for a model that is not loaded: their cost and their bound only."""
    points = [point("decode", b, c, decode_cost(costs, b, c), machine) for c in contexts for b in batches]
    return points + [point("prefill", 1, prefill_tokens, step_cost(costs, [(0, prefill_tokens)]), machine)]
