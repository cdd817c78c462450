"""What one engine step hands back to its callers: an event per advanced request, an error per failed one; the
error a failed request gets; and the guard every stage of a step runs under."""
from dataclasses import dataclass, field

from minivlm.engine.outputs import StreamEvent
from minivlm.engine.sequence import Sequence


class RequestFailed(RuntimeError):
    """A request's step raised; `stage` says where (admit, schedule, vision encode, model run, sampling,
    advance, snapshot). The engine freed its blocks and keeps serving everyone else."""

    def __init__(self, request_id: str, stage: str, cause: BaseException):
        super().__init__(f"request {request_id} failed during {stage}: {type(cause).__name__}: {cause}")
        self.request_id, self.stage, self.cause = request_id, stage, cause


@dataclass
class StepResult:
    """What one step produced for the callers: an event per advanced request, an error per failed one."""
    events: list[tuple[Sequence, StreamEvent]] = field(default_factory=list)
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)


def isolate(items: list, fn, fail) -> tuple[list, list]:
    """fn(batch) -> one result per item (a Sequence, or a plan's ScheduledRequest / EncodeJob: one request each).
    If the batch raises, each item runs alone, so only the requests that fault alone fail (fail(item, error)).
    Returns the items that went through and their results."""
    try:
        return items, fn(items)
    except Exception as e:
        if len(items) == 1:
            fail(items[0], e)
            return [], []
    kept, results = [], []
    for item in items:
        try:
            results += fn([item])
            kept.append(item)
        except Exception as e:
            fail(item, e)
    return kept, results


def all_or_none(items: list, fn, fail) -> tuple[list, list]:
    """fn over the batch; if it raises, every item's request fails (a recurrent model's forward advances states in
    place, layer by layer: running a request again alone would advance its state twice)."""
    try:
        return items, fn(items)
    except Exception as e:
        for item in items:
            fail(item, e)
        return [], []
