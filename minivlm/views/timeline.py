"""The request timeline in wall-clock time, from the event log alone: per request its spans (waiting in the queue,
the vision tower on its thread and each time slice it ran in when sliced, each prefill or chunk, each decode step
with the guesses it accepted, preempted), the time each token reached its caller, and the latencies vLLM reports
(TTFT, inter-token latency, end-to-end, queue time); per run their percentiles, tokens/s and every step's duration.
Pure functions over events.

Times are the engine's clock (EngineCore.clock) as the events carry it: a step's `scheduled` event says when the
step started, when its plan was ready (the event's time: the forward starts) and when it ended (its tokens go to
their callers then). A request arrives when it reaches the engine's inbox (its `arrived` event's `submitted`: the
clock read by the loop as the request was queued; it is admitted at the next step's start), as vLLM's arrival time
is when the engine was handed the request, after its prompt was rendered and its images loaded."""
from dataclasses import dataclass, field

QUANTILES = (50, 90, 99)
WAITING = ("queue", "vision", "preempted")  # spans where a request computes nothing
COMPUTING = ("prefill", "chunk", "decode")
TOWER = "tower"  # a time slice the sliced vision tower ran in, inside its request's vision span


@dataclass(frozen=True)
class Span:
    """One stretch of one request's life: [start, end) in the engine's clock, in scheduler steps `steps`."""
    request_id: str
    kind: str                   # one of WAITING or COMPUTING, or TOWER
    start: float
    end: float
    steps: tuple[int, ...]      # the steps it covers (a waiting span: the steps that ran without it)
    tokens: int = 0             # computing: tokens whose K/V it computed; a decode step: tokens delivered
    accepted: int = 0           # a speculating decode step: guesses accepted (delivered beside its own token)
    tower_seconds: float | None = None  # vision: how long the tower ran for its images, in `slices` lent slices
    slices: int = 0

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class RequestTimeline:
    request_id: str
    arrived: float
    arrived_step: int
    spans: list[Span] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # when each output token reached its caller
    finished: float | None = None        # the time of its `finished` event; None while it runs
    finish_reason: str | None = None
    finished_step: int | None = None
    first_scheduled: float | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrived if self.token_times else None

    @property
    def itl(self) -> list[float]:
        """Every gap between two consecutive tokens (0 for the accepted guesses of a step: they arrive together)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def e2e(self) -> float | None:
        return self.token_times[-1] - self.arrived if self.token_times else None

    @property
    def queue_time(self) -> float | None:
        return self.first_scheduled - self.arrived if self.first_scheduled is not None else None

    @property
    def mean_itl(self) -> float | None:
        gaps = self.itl
        return sum(gaps) / len(gaps) if gaps else None

    @property
    def p99_itl(self) -> float | None:
        return percentile(self.itl, 99)


@dataclass(frozen=True)
class StepTime:
    step: int
    started: float   # the step began (admissions, then the scheduler)
    planned: float   # its plan was ready: the forward starts
    ended: float     # its tokens go to their callers
    kind: str        # the scheduled event's step_kind: prefill, decode or mixed
    num_tokens: int

    @property
    def seconds(self) -> float:
        return self.ended - self.started


def percentile(values, q: float) -> float | None:
    """The q-th percentile with linear interpolation between the closest ranks (numpy's default); None if empty."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class TimelineBuilder:
    """Reads events in log order and builds every request's timeline. feed() returns a request's timeline when its
    `finished` event arrives (the /metrics histograms observe it then), so a reader that keeps nothing can drop it."""

    def __init__(self):
        self.requests: dict[str, RequestTimeline] = {}
        self.steps: list[StepTime] = []
        self._waiting: dict[str, tuple[str, float, int]] = {}  # request -> (span kind, since, since step)
        self._step_end: float | None = None   # the current step's end: when its tokens reach their callers
        self._in_tower: list[str] = []  # image requests not yet scheduled or encoded, oldest first (the tower's FIFO)

    def feed(self, ev) -> RequestTimeline | None:
        rid, f = ev.request_id, ev.fields
        if ev.time is None:
            raise ValueError("these events carry no time: the engine's event log was built without a clock")
        if ev.kind == "arrived":  # it arrived when it reached the engine's inbox; admitted at this step's start
            at = f.get("submitted") if f.get("submitted") is not None else ev.time
            self.requests[rid] = RequestTimeline(rid, at, ev.step)
            self._waiting[rid] = ("queue", at, ev.step)
            if f.get("num_images"):
                self._in_tower.append(rid)
        elif ev.kind == "tower_slice":  # the vision thread runs one job at a time, the oldest first
            if self._in_tower:
                r = self.requests[self._in_tower[0]]
                r.spans.append(Span(r.request_id, TOWER, f["started"], ev.time, (ev.step,)))
        elif ev.kind == "scheduled":
            self._scheduled(ev)
        elif ev.kind == "vision_encoded" and rid in self.requests:
            self._vision(self.requests[rid], f)
            self._left_tower(rid)
        elif ev.kind == "speculated" and rid in self.requests:
            r = self.requests[rid]
            last = r.spans[-1]
            r.spans[-1] = Span(rid, last.kind, last.start, last.end, last.steps, last.tokens + f["accepted"],
                               f["accepted"])
            r.token_times += [self._step_end] * f["accepted"]
        elif ev.kind == "preempted" and rid in self.requests:
            self._waiting[rid] = ("preempted", ev.time, ev.step)
        elif ev.kind == "finished" and rid in self.requests:
            r = self.requests[rid]
            if rid in self._waiting:  # left without running again (aborted while queued or preempted)
                self._close_wait(r, ev.time, ev.step)
            r.finished, r.finish_reason, r.finished_step = ev.time, f["finish_reason"], ev.step
            self._left_tower(rid)
            return r
        return None

    def _scheduled(self, ev):
        f = ev.fields
        ended = f.get("ended", ev.time)  # none: a step that never ended (its loop died), timed at its plan
        self._step_end = ended
        self.steps.append(StepTime(ev.step, f.get("started", ev.time), ev.time, ended, f["step_kind"], f["num_tokens"]))
        for p in f["plan"]:
            rid = p["request_id"]
            r = self.requests.get(rid)
            if r is None:  # arrived before the events this builder read
                continue
            if rid in self._waiting:
                self._close_wait(r, ev.time, ev.step)
            if r.first_scheduled is None:
                r.first_scheduled = ev.time
                self._left_tower(rid)  # its images are encoded (or were cached): the tower has no job of its
            kind = "decode" if p["kind"] == "decode" else "chunk" if p["kind"] == "chunk" else "prefill"
            tokens = 1 if kind == "decode" else p["end"] - p["start"]
            r.spans.append(Span(rid, kind, ev.time, ended, (ev.step,), tokens))
            if p["sample"]:
                r.token_times.append(ended)

    def _left_tower(self, rid: str):
        if rid in self._in_tower:
            self._in_tower.remove(rid)

    def _close_wait(self, r: RequestTimeline, until: float, step: int):
        kind, since, since_step = self._waiting.pop(r.request_id)
        r.spans.append(Span(r.request_id, kind, since, until, tuple(range(since_step, step))))

    @staticmethod
    def _vision(r: RequestTimeline, f: dict):
        """async_vision: the wait before its first step was the tower's (its images were on the vision thread)."""
        for i, s in enumerate(r.spans):
            if s.kind == "queue":
                r.spans[i] = Span(r.request_id, "vision", s.start, s.end, s.steps,
                                  tower_seconds=f["seconds"], slices=f.get("slices", 0))
                return


@dataclass
class Timeline:
    requests: dict[str, RequestTimeline]
    steps: list[StepTime]

    @property
    def start(self) -> float | None:
        return min((r.arrived for r in self.requests.values()), default=None)

    def summary(self) -> dict:
        """The run's figures: per latency its count, mean and percentiles (seconds); tokens/s; step seconds."""
        reqs = list(self.requests.values())
        series = {"ttft": [r.ttft for r in reqs if r.ttft is not None],
                  "itl": [g for r in reqs for g in r.itl],
                  "e2e": [r.e2e for r in reqs if r.e2e is not None],
                  "queue": [r.queue_time for r in reqs if r.queue_time is not None],
                  "step": [s.seconds for s in self.steps]}
        out = {name: stats(xs) for name, xs in series.items()}
        tokens = [t for r in reqs for t in r.token_times]
        span = max(tokens) - self.start if tokens else 0.0
        out["tokens"], out["seconds"] = len(tokens), span
        out["tokens_per_s"] = len(tokens) / span if span > 0 else None
        out["requests"], out["finished"] = len(reqs), sum(r.finished is not None for r in reqs)
        return out


def stats(xs: list[float]) -> dict:
    return {"count": len(xs), "mean": sum(xs) / len(xs) if xs else None,
            **{f"p{q}": percentile(xs, q) for q in QUANTILES}}


def timeline(events) -> Timeline:
    """Every request's timeline from a run's events (in log order, each step's read after it ended)."""
    b = TimelineBuilder()
    for ev in events:
        b.feed(ev)
    return Timeline(b.requests, b.steps)


def histogram(values, buckets) -> list[int]:
    """Cumulative counts per upper bound, +Inf last: a Prometheus histogram's `le` series."""
    return [sum(v <= le for v in values) for le in buckets] + [len(values)]
