"""Timeline overhead: what stamping the event log with the engine's clock costs a decode step (issue #56: at most
2 %). Side by side in one run, on one engine: decode steps with the stamps on (each event's clock reading, and the
step's end written into its `scheduled` record) and off (the same log, untimed, as it was before the stamps).
Whole-run wall times of a 1 s workload spread by 20-40 % on a 2-core VM, far more than 2 %, so the row's figure is
the stamps' own cost per step, timed over many calls on the real log with a real step's events, against the median
decode step the timeline itself measured; the interleaved on/off wall ratio is reported beside it."""
import marshal
import time

from minivlm import Request, SamplingParams
from minivlm.engine.event_log import EventLog
from minivlm.views.timeline import timeline

from bench.timing import Row, interleaved, median
from bench.workload import scene


class UntimedLog(EventLog):
    """The event log without the clock: what stamping adds is what this leaves out."""

    def emit(self, kind, request_id=None, **fields):  # EventLog.emit as it was before the stamps
        if not self.capacity:
            return
        if len(self.ring) == self.capacity:
            self.dropped += 1
        try:
            packed = marshal.dumps(fields)
        except ValueError:
            packed = fields
        self.ring.append((self.next_seq, self._step, kind, request_id, packed, None))
        self.next_seq += 1

    def end_step(self):
        pass

    step = property(EventLog.step.fget, lambda self, step: setattr(self, "_step", step))


def stamp_cost(events, step_events: int, calls: int = 50000) -> float:
    """Seconds the stamps add to one step, an upper bound timed piece by piece on a log like the engine's (its clock):
    one clock reading per event, and a step's start and end (the step setter reads the clock, end_step reads it and
    finds the step's `scheduled` record among the newest). Timed directly: the difference of two whole emits is
    within their noise."""
    clock = events.clock

    def per_reading():
        t = time.perf_counter()
        for _ in range(calls):
            clock()
        return (time.perf_counter() - t) / calls

    log = EventLog(events.capacity, clock)
    fields = {"step_kind": "decode", "request_ids": ["req-0"], "num_tokens": 1}

    def per_step():
        t = time.perf_counter()
        for i in range(calls // 10):
            log.step = i  # a new step: its start is read from the clock
            log.emit("scheduled", None, **fields)
            log.emit("BlockStored", "req-0", block_ids=[i])  # a record after the plan, as a step has
            log.end_step()
        spent = time.perf_counter() - t
        t = time.perf_counter()
        for i in range(calls // 10):  # the same without the stamps' own parts: what emit costs anyway
            log._step = i
            log.emit("scheduled", None, **fields)
            log.emit("BlockStored", "req-0", block_ids=[i])
        return max(0.0, spent - (time.perf_counter() - t)) / (calls // 10)
    return min(per_reading() for _ in range(5)) * step_events + min(per_step() for _ in range(5))


def measure(ctx, new_tokens: int = 48, batch: int = 8) -> list[Row]:
    requests = [Request(prompt="What color is the shape?", images=[scene(160 + 16 * i, 160, i)]) for i in range(batch)]
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    engine = ctx.engine.isolated()
    log = engine.core.events

    def run(cls):
        def once():
            log.__class__ = cls  # the same ring, stamped or not
            engine.reset_prefix_cache()
            engine.generate(requests, params)
        return once

    since = engine.snapshot().last_event_seq
    engine.generate(requests, params)  # one stamped run: the timeline's own step times
    events = engine.events(since)
    steps = [s for s in timeline(events).steps if s.kind == "decode"]
    step_s = median([s.seconds for s in steps])
    per_step = len(events) / max(1, len({e.step for e in events}))
    cost = stamp_cost(log, round(per_step))
    times = interleaved({"on": run(EventLog), "off": run(UntimedLog)}, 5 * ctx.repeats)
    log.__class__ = EventLog
    engine.close()
    wall = median([a / b for a, b in zip(times["on"], times["off"])]) - 1
    share = cost / step_s
    ctx.details["timeline_overhead"] = {"times_s": times, "stamp_cost_s": cost, "decode_step_s": step_s,
                                        "events_per_step": per_step}
    return [Row("timeline stamps: cost per decode step (batch 8)", cost * 1e6, step_s * 1e6, "µs", share,
                "<= 2% of a step", share <= 0.02,
                f"{per_step:.1f} events a step; stamps {cost * 1e6:.2f} µs of a {step_s * 1e3:.2f} ms decode step "
                f"({share:.2%}); whole runs stamped vs not: {wall:+.1%} wall time (median of {len(times['on'])} "
                f"neighbouring pairs, noise ±20 %)")]
