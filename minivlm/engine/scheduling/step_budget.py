"""Chunked prefill's adaptive token budget: each step's prompt tokens are sized so that a mixed step (the running
streams' decodes plus a prefill chunk) takes at most `slowdown` times a decode-only step, both measured as the
engine runs. A fixed budget is right on one machine and wrong on the next (16 tokens cost 1.5x a decode step on
2 CPU cores, nothing on a GPU); measuring what a prompt token costs here finds the budget the streams can afford.
The trade-off it sets is the one of every chunk budget: the smaller the chunks, the longer a new request waits."""
from collections import defaultdict, deque
from functools import partial
from dataclasses import dataclass
from statistics import median


@dataclass
class BudgetDecision:
    """One step's budget and why, as plain data (the `scheduled` event carries it)."""
    prompt_tokens: int         # prompt (prefill) tokens this step may compute beside its decodes
    decodes: int               # the decode tokens it protects (none: the whole ceiling)
    decode_ms: float | None    # a decode-only step, measured (median of the recent); None before the first
    fixed_ms: float | None     # what any mixed step costs beyond a decode step, whatever its chunk (fitted)
    token_ms: float | None     # what each prompt token adds (fitted); None before a mixed step was measured
    slowdown: float
    remeasure: bool = False    # a decode-only step on purpose: the decode time was last measured REFRESH steps ago

    def to_dict(self) -> dict:
        def ms(x):
            return None if x is None else round(x, 3)
        return {"prompt_tokens": self.prompt_tokens, "decodes": self.decodes, "slowdown": self.slowdown,
                "decode_ms": ms(self.decode_ms),
                "fixed_ms": ms(self.fixed_ms), "token_ms": ms(self.token_ms), "remeasure": self.remeasure}


class AdaptiveTokenBudget:
    """A decode-only step's time (median of the recent ones) and a mixed step's extra time as a line in its prompt
    tokens, extra(n) = fixed + n x per_token, fitted through the median extra of each chunk size seen lately
    (medians: a step that met a busy core does not move the fit). The step may add the n that keeps decode + extra(n) <=
    slowdown x decode, rounded down to a power of two: few distinct shapes, and the first step of each shape
    (which pays the kernels' one-time setup) is not measured. If even one token cannot (the fixed part alone is
    over), every mixed step is over anyway: then n = fixed / per_token, so each such step is at most twice its
    unavoidable part while the prompt still moves. Guards the line cannot give: a size whose own measured extra is
    over is halved; a step stays within the rows of the backend's one fast call (fast_rows, from runner.limits: past
    them a step costs ~2x on the CPU's decode_layer.c); and after REFRESH mixed steps in a row one decode-only step
    measures the decode time again."""

    START = 4         # prompt tokens before a mixed step was measured: few (a step past the C layer's 16 rows costs 2x)
    PER_SIZE = 8      # recent measurements kept per chunk size
    DECODES = 5       # recent decode-only steps whose median is the decode time (few: it follows the context's growth)
    SAMPLES = 3       # a size enters the fit with 3 measurements (a median of 3 ignores one outlier)
    SIZES = 8         # chunk sizes kept (the most recent)
    REFRESH = 8       # mixed steps in a row before one decode-only step re-measures the decode time (it grows with
                      # the streams' context; a stale one makes every chunk look dear and the line's fixed part swell)

    def __init__(self, slowdown: float, ceiling: int, floor: int = 1):
        self.slowdown, self.ceiling, self.floor = slowdown, ceiling, floor
        self.decode_s: float | None = None
        # chunk size -> extra s; no lambda over self (a cycle, and an engine's frozen cycles are never collected)
        self.extra: dict[int, deque] = defaultdict(partial(deque, maxlen=self.PER_SIZE))
        self.decodes: deque = deque(maxlen=self.DECODES)  # recent decode-only step times
        self.seen: set[tuple] = set()  # (decodes, prompt tokens) shapes whose first (setup-paying) step has passed
        self.since_decode = 0  # measured mixed steps since the last measured decode-only step
        self.fast_rows: int | None = None  # the most rows a step runs in one fast call (runner.limits), or None

    def fit(self) -> tuple[float, float] | None:
        """(fixed, per_token) seconds, or None before a chunk size was measured enough. One size alone: all of its
        extra time counts per token (the cautious reading)."""
        points = [(n, median(xs)) for n, xs in self.extra.items() if len(xs) >= self.SAMPLES]
        if not points:
            return None
        if len(points) == 1:
            n, e = points[0]
            return 0.0, e / n
        mn, me = sum(n for n, _ in points) / len(points), sum(e for _, e in points) / len(points)
        var = sum((n - mn) ** 2 for n, _ in points)
        slope = sum((n - mn) * (e - me) for n, e in points) / var
        slope = max(slope, 0.05 * me / mn)  # noise can tilt the line flat or negative: a token is never free
        return max(0.0, me - slope * mn), slope

    def decide(self, num_decodes: int) -> BudgetDecision:
        """The prompt tokens a step with num_decodes decode tokens may add (no decodes: no stream to protect)."""
        fitted = self.fit()
        fixed, per_token = fitted if fitted else (None, None)
        remeasure = bool(num_decodes) and self.decode_s is not None and self.since_decode >= self.REFRESH
        if num_decodes == 0:
            tokens = self.ceiling
        elif remeasure:
            tokens = 0
        elif self.decode_s is None or fitted is None:
            tokens = min(self.START, self.ceiling)
        else:
            room, cost = (self.slowdown - 1) * self.decode_s - fixed, max(per_token, 1e-7)  # free tokens: the ceiling
            tokens = room / cost if room >= cost else fixed / cost
            tokens = 1 << max(0, int(tokens + 1e-6).bit_length() - 1)  # a power of two (7.999… counts as 8)
            if room >= cost:  # a size measured over the allowance is not taken, whatever the line says (noise, or
                while tokens > 1 and self._over(tokens):  # a cliff the line cannot see)
                    tokens //= 2
        rows = self.fast_rows if num_decodes else None
        if rows and num_decodes < rows and not remeasure:  # past the fast call's rows a step costs ~2x: stay within
            tokens = min(tokens, 1 << ((rows - num_decodes).bit_length() - 1))
        if num_decodes and not remeasure:
            tokens = max(self.floor, min(self.ceiling - num_decodes, tokens))
        ms = lambda x: None if x is None else 1e3 * x  # noqa: E731
        return BudgetDecision(tokens, num_decodes, ms(self.decode_s), ms(fixed), ms(per_token), self.slowdown, remeasure)

    IDLE_SLICE_S = 0.05  # what a step without decodes leaves the sliced tower: admissions are looked at this often
    MIN_SLICE_S = 0.002  # a shorter slice is not lent: waking the tower costs about as much as it would do

    def left_after(self, num_decodes: int, seconds: float) -> float:
        """What a step that took `seconds` left of its allowance (slowdown x a decode step), for the sliced vision
        tower: the same bound a mixed step keeps. A step without decodes has no stream to protect."""
        if not num_decodes:
            return self.IDLE_SLICE_S
        if self.decode_s is None:
            return 0.0  # no decode step measured yet: a few steps more
        left = self.slowdown * self.decode_s - seconds
        return left if left >= self.MIN_SLICE_S else 0.0

    def _over(self, tokens: int) -> bool:
        xs = self.extra.get(tokens)
        return xs is not None and len(xs) >= self.SAMPLES and median(xs) > (self.slowdown - 1) * self.decode_s

    def observe(self, num_decodes: int, num_prompt_tokens: int, seconds: float):
        """Learn from one step's forward time: decode-only steps give the decode time, mixed steps (once that exists)
        what they took beyond it. Prefill-only steps say nothing about the streams; the first step of each shape
        pays the kernels' one-time setup and is not measured."""
        shape = (num_decodes, num_prompt_tokens)
        if not num_decodes or shape not in self.seen:  # prefill only, or a shape's first step (one-time setup)
            self.seen.add(shape)
            return
        if not num_prompt_tokens:
            self.decodes.append(seconds)
            self.decode_s = median(self.decodes)
            self.since_decode = 0
        elif self.decode_s is not None:
            self.since_decode += 1
            self.extra[num_prompt_tokens].append(max(0.0, seconds - self.decode_s))
            self.extra[num_prompt_tokens] = self.extra.pop(num_prompt_tokens)  # the newest size last
            while len(self.extra) > self.SIZES:
                del self.extra[next(iter(self.extra))]
