"""The vision tower on its own thread (EngineConfig.async_vision): an image request's tower runs while the
running requests keep decoding, instead of stalling the step that prefills its first chunk. The scheduler
admits a request once its images are encoded; everything else about the request is unchanged. With the adaptive
chunk budget the thread runs in time slices the steps lend it (tower_slices.py); otherwise beside the steps."""
import concurrent.futures
import os
import sys
import threading
import time

import torch

from minivlm.engine.tower_slices import TowerSlices


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
    """One background thread. Only vision.encode runs on it: the vision cache and the sequences stay the engine
    loop's, so nothing else needs a lock. sliced=True: it runs only in the time slices lend() gives it (while no
    step runs), with every CPU thread; otherwise beside the steps, with half of them."""

    def __init__(self, vision, sliced: bool = False):
        self.vision = vision
        cuda = torch.device(vision.device).type == "cuda"
        self.slices = TowerSlices(torch.cuda.synchronize if cuda else None) if sliced else None
        threads = torch.get_num_threads() if sliced else max(1, torch.get_num_threads() // 2)
        self.pool = concurrent.futures.ThreadPoolExecutor(1, "minivlm-vision",
                                                          initializer=_start_thread, initargs=(threads, not sliced))

    def start(self, seq, todo: list[int], pixels: torch.Tensor, grids: torch.Tensor):
        """Encode images `todo` of seq in the background; seq.vision_job holds (todo, future) until used, the
        future's result being (the tower's outputs, seconds the tower ran, slices it ran in: 0 = not sliced)."""
        if self.slices is not None:
            self.slices.submitted()
        seq.vision_job = (todo, self.pool.submit(self._timed, pixels, grids))

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
    def wait_any(seqs, timeout: float):
        """Block until one of the pending jobs of seqs finishes, or timeout seconds pass."""
        pending = [s.vision_job[1] for s in seqs if s.vision_job is not None and not s.vision_job[1].done()]
        if pending:
            concurrent.futures.wait(pending, timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def close(self):
        if self.slices is not None:
            self.slices.close()  # a parked job ends (TowerClosed); nobody waits for its result
        self.pool.shutdown(wait=False, cancel_futures=True)
