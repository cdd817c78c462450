"""What one engine step hands back to its callers: an event per advanced request, an error per failed one; and
the error a failed request gets."""
from dataclasses import dataclass, field

from minivlm.engine.outputs import StreamEvent
from minivlm.engine.sequence import Sequence


class RequestFailed(RuntimeError):
    """A request's step raised; `stage` says where (admit, schedule, vision encode, model run, sampling,
    advance, snapshot). The engine freed its blocks and keeps serving everyone else."""

    def __init__(self, request_id: str, stage: str, cause: BaseException):
        super().__init__(f"request {request_id} failed during {stage}: {type(cause).__name__}: {cause}")
        self.request_id, self.stage = request_id, stage


@dataclass
class StepResult:
    """What one step produced for the callers: an event per advanced request, an error per failed one."""
    events: list[tuple[Sequence, StreamEvent]] = field(default_factory=list)
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)
