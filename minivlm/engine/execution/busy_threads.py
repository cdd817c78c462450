"""Fewer CPU threads while other processes hold cores. A CPU step runs thread teams (torch's intra-op threads, and
the C kernels, which take torch's count) that meet at barriers: when another process holds one of their cores, every
barrier waits for the scheduler to hand that core back, and a step slows by an order of magnitude (measured on 2
cores beside a compile: the tiny model's C step 0.5 ms on 1 thread, 8 ms on 2; bench/RESULTS.md). So every
INTERVAL seconds the engine reads how much CPU the rest of the machine took (/proc/stat's busy time minus this
process's own) and runs on the cores left free, never fewer than 1, never more than it was started with. After a
pause in its steps (IDLE) what the others did meanwhile says little about now (llama.cpp's threads spin for a while
after each of its requests: taken as a busy machine, they cost the engine's next run a third of its speed in the
peer bench), so it starts on all its threads and looks again QUICK seconds later."""
import math
import os
import time

import torch

INTERVAL = 0.5   # seconds between looks at the machine
IDLE = 1.0       # seconds between two steps past which the engine paused
QUICK = 0.1      # seconds to the first look after a pause
SWITCH = "MINIVLM_BUSY_THREADS"  # 0: keep torch's thread count whatever else runs
_started_with: int | None = None  # torch's count before an engine lowered it (another engine must not take 1 as its max)


def machine_busy_seconds() -> float | None:
    """CPU seconds every process on the machine has been busy (all cores), from /proc/stat; None where unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0               # a VM's stolen time: not ours to use either
    return (sum(fields[:8]) - idle - steal) / os.sysconf("SC_CLK_TCK")


class BusyThreads:
    """Call after each step, on the steps' thread (torch's count is per thread under OpenMP; a thread started later
    takes the latest one set): runs the next steps on the cores other processes leave free."""

    def __init__(self, clock=time.monotonic, busy=machine_busy_seconds, own=time.process_time):
        self.max_threads = _started_with or torch.get_num_threads()
        self.cores = min(self.max_threads, len(os.sched_getaffinity(0)))
        self.clock, self.busy, self.own = clock, busy, own
        self.on = os.environ.get(SWITCH, "1") != "0" and self.cores > 1 and busy() is not None
        self.last = (clock(), busy(), own()) if self.on else None
        self.stepped = clock()  # when the latest step ended
        self.wait = INTERVAL  # seconds from one look to the next
        self.others = 0.0  # cores the other processes used over the latest interval
        self.threads = self.max_threads  # what the next steps run with

    def after_step(self):
        if self.on:
            self._look()
        if self.last is not None and torch.get_num_threads() != self.threads:
            global _started_with
            _started_with = None if self.threads == self.max_threads else self.max_threads
            torch.set_num_threads(self.threads)

    def _look(self):
        """Every INTERVAL: the cores the other processes used since the last look, and the threads left for us; after
        a pause, all threads and a fresh look QUICK seconds on."""
        now = self.clock()
        paused, self.stepped = now - self.stepped > IDLE, now
        if paused:
            self.last, self.wait, self.threads = (now, self.busy(), self.own()), QUICK, self.max_threads
            return
        if now - self.last[0] < self.wait:
            return
        self.wait = INTERVAL
        busy, own = self.busy(), self.own()
        self.others = max(0.0, (busy - self.last[1]) - (own - self.last[2])) / (now - self.last[0])
        self.last = (now, busy, own)
        free = self.cores - math.floor(self.others + 0.5)  # a process that takes half a core or more takes one
        self.threads = max(1, free) if free < self.cores else self.max_threads

    def pin(self, threads: int | None):
        """Run the next steps on `threads` whatever else runs (a comparison), or (None) adapt again."""
        self.on = threads is None and self.last is not None
        if threads is not None:
            self.threads = threads

    def close(self):
        """Give torch back the thread count the engine started with (the calling thread's, and the one threads
        started later take)."""
        global _started_with
        if self.last is not None and self.threads != self.max_threads:
            self.threads, _started_with = self.max_threads, None
            torch.set_num_threads(self.max_threads)
