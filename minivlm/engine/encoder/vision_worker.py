"""The vision tower on its own thread (EngineConfig.async_vision): an image request's tower runs while the
running requests keep decoding, instead of stalling the step that prefills its first chunk. The runner starts the
job when the request is admitted and keeps its Future; the scheduler admits the request once the job is done (the
core tells it which are not), and the plan's EncodeJob then takes its outputs into the encoder cache. With the adaptive
chunk budget the thread runs in time slices the steps lend it (tower_slices.py); otherwise beside the steps."""
import concurrent.futures
import os
import sys
import threading
import time

import torch

from minivlm.engine.encoder.tower_slices import TowerSlices


NICE = 10  # the tower's thread yields the CPU to the decode steps: a stream's next token beats a new request's TTFT


def _start_thread(threads: int, lower: bool):
    """Set the tower thread's share of CPU threads, and (lower: beside the steps) its priority (Linux: the policy
    and nice are per thread, and the thread pool torch starts from this thread inherits them; elsewhere they are left as they are).
    SCHED_IDLE: the tower runs on what the decode steps leave idle, and a step's waking thread takes its core back
    at once (a niced thread still holds a core for its time slice, which a step's 60-odd barriers each wait out).
    A sliced tower keeps the engine's priority: it runs only while the steps wait for it."""
    torch.set_num_threads(threads)
    if lower and sys.platform == "linux":
        tid = threading.get_native_id()
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError):  # a sandbox may forbid it: nice, relative to the engine's own
            try:
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICE))
            except OSError:  # the tower then just competes as before
                pass


class VisionWorker:
    """One background thread. Only vision.encode runs on it: the encoder cache and the requests stay the engine
    loop's, so nothing else needs a lock. sliced=True: it runs only in the time slices lend() gives it (while no
    step runs), with every CPU thread; otherwise beside the steps, with half of them."""

    def __init__(self, vision, sliced: bool = False):
        self.vision = vision
        cuda = torch.device(vision.device).type == "cuda"
        self.slices = TowerSlices(torch.cuda.synchronize if cuda else None) if sliced else None
        threads = torch.get_num_threads() if sliced else max(1, torch.get_num_threads() // 2)
        self.pool = concurrent.futures.ThreadPoolExecutor(1, "minivlm-vision",
                                                          initializer=_start_thread, initargs=(threads, not sliced))

    def start(self, pixels: torch.Tensor, grids) -> concurrent.futures.Future:
        """Encode these images in the background; the Future's result is (the tower's outputs, seconds the tower
        ran, slices it ran in: 0 = not sliced)."""
        if self.slices is not None:
            self.slices.submitted()
        return self.pool.submit(self._timed, pixels, grids)

    def _timed(self, pixels, grids):
        start = time.perf_counter()
        if self.slices is None:
            return self.vision.encode(pixels, grids), time.perf_counter() - start, 0
        out = self.slices.run(self.vision.encode, pixels, grids)
        return out, time.perf_counter() - start - self.slices.job_waited, self.slices.job_slices

    @property
    def sliced(self) -> bool:
        return self.slices is not None

    def lend(self, seconds: float):
        """Sliced: let the tower run about `seconds` now (the step thread waits meanwhile)."""
        if self.slices is not None:
            self.slices.lend(seconds)

    @staticmethod
    def wait_any(futures, timeout: float):
        """Block until one of these jobs finishes, or timeout seconds pass."""
        pending = [f for f in futures if not f.done()]
        if pending:
            concurrent.futures.wait(pending, timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def close(self):
        if self.slices is not None:
            self.slices.close()  # a parked job ends (TowerClosed); nobody waits for its result
        self.pool.shutdown(wait=False, cancel_futures=True)
