"""Timing helpers shared by the measurements: interleaved repeats with medians, memory copy bandwidth,
and the result row every measurement returns."""
import statistics
import time
from dataclasses import dataclass

import torch


@dataclass
class Row:
    """One line of the results table: engine and baseline values (in `unit`), their ratio, the goal, and whether
    it is met (None: a context line with no goal)."""
    metric: str
    engine: float
    baseline: float
    unit: str
    ratio: float
    goal: str
    passed: bool | None
    note: str = ""
    same: str = ""      # requests whose greedy tokens equal HF's, e.g. "16/16" ("" where HF is not run)
    spread: str = ""    # min-max of the raw repeats, engine; baseline
    group: str = ""     # the measurement that made it (a MEASUREMENTS name, or "peer llamacpp"): set by the bench


def interleaved(runs: dict, repeats: int) -> dict[str, list[float]]:
    """Wall seconds of each named callable, run in turn `repeats` times (A B C A B C ...) so that machine
    noise lands on every side alike."""
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(engine: list[float], baseline: list[float], unit: str = "s") -> str:
    """The range of each side's raw repeats, so a reader sees how much the machine moved them."""
    def rng(xs):
        return f"{min(xs):.3g}–{max(xs):.3g}"
    return f"{rng(engine)}; {rng(baseline)} {unit}"


def copy_bandwidth(device="cpu", nbytes: int = 256 * 2**20, repeats: int = 7) -> float:
    """Memory copy bandwidth in bytes/s (STREAM convention: bytes read + bytes written), measured with torch's
    own copy on a buffer far larger than the caches, with the threads torch is set to use."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in before timing
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - t)
    return 2 * nbytes / median(times)


class TokenClock:
    """A minimal HF streamer: records when each generated token arrives (the prompt arrives first)."""

    def __init__(self):
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value):
        if not self._prompt_seen:  # generate() hands the prompt ids over first
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self):
        pass


def decode_rate(times: list[float]) -> float:
    """Tokens/s between the first and the last token (excludes prefill, i.e. time to first token)."""
    if len(times) < 2:
        raise ValueError("need at least two tokens to time decoding")
    return (len(times) - 1) / (times[-1] - times[0])
