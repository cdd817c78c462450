"""Time slices for the vision thread (async_vision with the adaptive chunk budget): the tower runs only while the
step thread lends it time between two steps, and stops at the boundary where its next unit of work would likely
overrun that time (each slice still runs one unit, so the tower always moves). A unit's likely time is what the
same unit (the same module on the same shapes: every block repeats them) took the last time; one never seen is
expected to take the longest recent unit, decaying. On a
machine whose cores a step already uses (a 2-core CPU) a tower running beside the steps slows every one of them,
however low its priority; lent time is time no step runs, so a stream's token-to-token gap is its step plus what
the step left of its allowance (`max_step_slowdown` x a decode step), give or take one unit's misprediction.
The tower stops only at boundaries (model/tower_boundaries.py: every module's start, every QUERY_ROWS rows of
attention), so any of transformers' towers works unchanged."""
import threading
import time

from minivlm.model.tower_boundaries import pausable

DECAY = 0.7  # per boundary: a unit never seen is expected to take the longest recent one, decaying per boundary
KNOWN_UNITS = 512  # unit names whose last time is kept (a tower has a few dozen per image size)


class TowerClosed(RuntimeError):
    """The engine closed while the tower waited for its next slice."""


class TowerSlices:
    """The step thread calls lend(seconds); the tower's thread calls run(fn) around each job. Between steps the tower
    thread is parked at a boundary (or before its job's first module); a lend lets it run until a boundary where
    the next unit would likely end past the deadline, or until the job ends."""

    def __init__(self, sync=None):
        self._sync = sync        # a GPU's synchronize: a slice then times the device's work, not only its launches
        self._cond = threading.Condition()
        self._deadline = 0.0     # perf_counter time until which the tower may run
        self._parked = True      # the tower thread is not running (waiting for a slice, or between jobs)
        self._resumes = 0        # slices the tower thread has started: a lender waits for a park after its own
        self._lends = 0          # slices lent so far; the tower runs at most once in each (_ran_in: the last it ran in)
        self._ran_in = 0
        self._jobs = 0           # jobs submitted and not finished
        self._closed = False
        self.job_waited, self.job_slices = 0.0, 0  # the current job: seconds parked, slices it ran in
        self._mark = 0.0         # when the tower thread last passed a boundary (or resumed)
        self._expect = 0.0       # an unknown unit's expected seconds: the longest recent one, decaying
        self._unit = None        # the name of the unit running since _mark
        self.took: dict = {}     # unit name -> seconds it took the last time: a known unit's expected time

    def submitted(self):
        with self._cond:
            self._jobs += 1

    def pending(self) -> bool:
        with self._cond:
            return self._jobs > 0

    def run(self, fn, *args):
        """On the vision thread: wait for lent time, run fn, and hand the rest of the slice back when it ends."""
        self.job_waited, self.job_slices, self._unit = 0.0, 0, None
        try:
            self._wait_for_slice()
            with pausable(self._boundary):  # only this thread's towers stop (the step thread may run one too)
                return fn(*args)
        finally:
            with self._cond:
                self._jobs -= 1
                self._parked = True
                self._cond.notify_all()

    def _boundary(self, unit=None):
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        took, self._mark = now - self._mark, now
        if self._unit is not None:
            self.took.pop(self._unit, None)  # re-inserted: the dict keeps the most recently run units last
            self.took[self._unit] = took
            if len(self.took) > KNOWN_UNITS:
                del self.took[next(iter(self.took))]
        self._expect = max(took, DECAY * self._expect)
        self._unit = unit
        expect = self.took.get(unit, self._expect) if unit is not None else self._expect
        if now + expect > self._deadline:  # the next unit would likely overrun the slice: stop before it
            self._wait_for_slice()

    def _wait_for_slice(self):
        with self._cond:
            self._parked, start = True, time.perf_counter()
            self._cond.notify_all()  # the lender's slice is over
            self._cond.wait_for(lambda: self._closed or (self._lends > self._ran_in and
                                                         time.perf_counter() < self._deadline))  # a new slice
            if self._closed:
                raise TowerClosed("the engine closed while this image waited for the vision tower")
            self._parked, self._ran_in = False, self._lends
            self._resumes += 1
            self._mark = time.perf_counter()  # what ran since the last boundary was not the tower
            self.job_waited += self._mark - start
            self.job_slices += 1

    def lend(self, seconds: float):
        """On the step thread: let the tower run for about `seconds` (if it has a job), returning when it stops at a
        boundary or its jobs end. A tower that never reaches a boundary does not hold the steps up past 5x the slice
        (+0.2 s): it then runs beside them until its next boundary."""
        with self._cond:
            if self._closed or self._jobs == 0 or seconds <= 0:
                return
            resumes = self._resumes
            self._lends += 1
            self._deadline = time.perf_counter() + seconds
            self._cond.notify_all()
            started = self._cond.wait_for(lambda: self._resumes > resumes or self._jobs == 0, timeout=seconds)
            if started:  # (a tower thread that did not even wake within the slice is not waited for)
                self._cond.wait_for(lambda: self._parked or self._jobs == 0, timeout=4 * seconds + 0.2)
            self._deadline = 0.0  # an unfinished slice ends at the tower's next boundary, whatever the timeout

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.notify_all()
