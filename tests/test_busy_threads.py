"""The busy-machine thread count (engine/execution/busy_threads.py): from the CPU time the rest of the machine took, fewer
threads while another process holds a core, all of them back once it stops; and a real busy process beside a real
engine is seen as one core taken."""
import multiprocessing
import time

import pytest
import torch

from minivlm.engine.execution import busy_threads
from minivlm.engine.execution.busy_threads import BusyThreads


class Machine:
    """A clock, the machine's busy CPU seconds and this process's, advanced by hand."""

    def __init__(self):
        self.now = self.busy = self.own = 0.0

    def run(self, seconds: float, ours: float, others: float):
        self.now += seconds
        self.own += ours * seconds
        self.busy += (ours + others) * seconds


def test_threads_follow_the_cores_other_processes_leave(monkeypatch):
    monkeypatch.setenv(busy_threads.SWITCH, "1")
    monkeypatch.setattr(busy_threads.os, "sched_getaffinity", lambda pid: set(range(4)))
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    m = Machine()
    try:
        b = BusyThreads(clock=lambda: m.now, busy=lambda: m.busy, own=lambda: m.own)
        assert b.on and b.cores == 4
        seen = []
        for others in (0.0, 1.0, 2.3, 0.4, 0.0):
            m.run(0.6, ours=4 - others, others=others)
            b.after_step()
            seen.append((round(b.others, 2), b.threads, torch.get_num_threads()))
        assert seen == [(0.0, 4, 4), (1.0, 3, 3), (2.3, 2, 2), (0.4, 4, 4), (0.0, 4, 4)]
        m.run(0.1, ours=4, others=3)  # looks at the machine at most every INTERVAL
        b.after_step()
        assert b.threads == 4
        m.run(0.6, ours=1, others=3)
        b.after_step()
        assert b.threads == 1
        # a pause in the steps while the others ran (a peer's request): all threads on the first step after it, and
        # a look QUICK seconds on says what the machine does now
        m.run(2.0, ours=0, others=3)
        b.after_step()
        assert b.threads == 4 and torch.get_num_threads() == 4
        m.run(busy_threads.QUICK + 0.01, ours=4, others=0)
        b.after_step()
        assert b.threads == 4 and b.others == pytest.approx(0.0, abs=1e-9)
        m.run(2.0, ours=0, others=2)  # and where the others still run after the pause, the quick look sees it
        b.after_step()
        m.run(busy_threads.QUICK + 0.01, ours=2, others=2)
        b.after_step()
        assert b.threads == 2
        b.close()
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)


def spin(seconds: float):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.slow  # a real process spins for 3 s beside it: CI runs it with -m slow
def test_a_real_busy_process_is_seen_as_a_core_taken(monkeypatch):
    monkeypatch.setenv(busy_threads.SWITCH, "1")
    b = BusyThreads()
    if not b.on:  # one core, or no /proc/stat: nothing to adjust
        pytest.skip("one core or no /proc/stat: nothing to adjust")
    before = torch.get_num_threads()
    proc = multiprocessing.get_context("spawn").Process(target=spin, args=(3.0,))
    proc.start()
    try:
        time.sleep(0.5)  # the child is spinning
        b.last, b.stepped = (b.clock(), b.busy(), b.own()), b.clock()
        time.sleep(busy_threads.INTERVAL + 0.3)  # a step that took this long: no pause
        b.after_step()
        assert 0.6 <= b.others <= b.cores + 0.1, b.others
        assert b.threads < b.max_threads
    finally:
        proc.join()
        b.close()
        torch.set_num_threads(before)
