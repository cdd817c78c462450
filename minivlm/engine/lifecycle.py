"""Every request the engine holds, and every change of its status (RequestStatus), in this one module: the
scheduler reads the two queues in order and asks these methods to move a request; nothing else writes a status.

    (intake) --add--> WAITING --run--> RUNNING --preempt--> PREEMPTED --run--> RUNNING ...
    any of them --finish--> FINISHED_STOPPED | FINISHED_LENGTH_CAPPED | FINISHED_ABORTED | FINISHED_ERROR

It is the one owner of "is this request alive" (`is_alive`: admitted and unfinished). Everything else asks it (the
core's `live`, the runner's stages through the seq_ids it is given, the grammar masks filled ahead, the step's
failures and events) or only keeps what a request owns until the core lets go of it on `finish` (the runner's pixels
and sampling state, the encoder cache's references, the scheduler's sent set and blocks: EngineCore._finish and fail). The
engine loop's own book (`EngineLoop._live`, a handle's pending set) is the callers' side: submissions that have not
had their last event delivered, admitted or not yet, kept under the inbox lock so a caller never waits for a step.
"""
from collections import deque

from minivlm.engine.request import RequestStatus as S
from minivlm.engine.sequence import Sequence

ALLOWED = {None: {S.WAITING}, S.WAITING: {S.RUNNING}, S.RUNNING: {S.PREEMPTED}, S.PREEMPTED: {S.RUNNING}}


class RequestRegistry:
    """seq_id -> every admitted, unfinished request; `waiting` (WAITING and PREEMPTED, first in line on the left)
    and `running` (RUNNING, oldest on the left) hold them in the order the scheduler serves them."""

    def __init__(self):
        self.requests: dict[int, Sequence] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.requests

    def is_alive(self, seq_id: int) -> bool:
        """Admitted and not finished (stopped, capped, aborted or failed): the engine's one answer."""
        return seq_id in self.requests

    def get(self, seq_id: int) -> Sequence | None:
        return self.requests.get(seq_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _move(self, seq: Sequence, to: S):
        if not (to.finished or to in ALLOWED.get(seq.status, ())) or (seq.status is not None and seq.status.finished):
            raise RuntimeError(f"request {seq.request_id}: no transition {seq.status} -> {to}")
        seq.set_status(to)

    def add(self, seq: Sequence):
        """A new request enters the engine: last in line. From here on only EngineCore.update writes its progress."""
        self._move(seq, S.WAITING)
        self.requests[seq.seq_id] = seq
        self.waiting.append(seq)

    def run(self, seq: Sequence):
        """Admitted (its blocks are allocated): from the waiting queue to the end of the running one."""
        self._move(seq, S.RUNNING)
        self.waiting.remove(seq)
        self.running.append(seq)

    def preempt(self, seq: Sequence):
        """Back to the front of the waiting queue (its blocks were released; it recomputes on re-admission)."""
        self._move(seq, S.PREEMPTED)
        self.running.remove(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str):
        """Out of the engine for good, with reason "stop" | "length" | "abort" | "error" (admitted or not)."""
        self._move(seq, S.finished_by(reason))
        for queue in (self.running, self.waiting):
            if seq in queue:
                queue.remove(seq)
        self.requests.pop(seq.seq_id, None)
