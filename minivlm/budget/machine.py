"""The roofline's denominators, measured on the spot: the device's memory copy bandwidth and its matmul FLOP rate.

Both are short and bounded (each starts no run that would end past its half of `budget_s`, counted from before its
buffers are made, after one untimed warm run and at least one timed run: the wall time is the budget, or two runs
where one run is longer than that), cached per process and device, and measured with torch's own ops on the device the engine runs on (on CUDA the device's
copy and matmul, synchronised). Bandwidth follows the STREAM convention (bytes read + bytes written, on buffers far
larger than the caches), as bench/timing.py's copy_bandwidth does; the FLOP rate is a square matmul in the engine's
compute dtype, 2·n³ FLOPs a run. The best run counts: the machine's bound is what it can do, not what it did."""
import time
from dataclasses import dataclass

import torch

COPY_BYTES = {"cpu": 64 * 2**20, "cuda": 512 * 2**20}  # per buffer: past a CPU's last-level cache, a GPU's L2
MATMUL_SIDE = {"cpu": 1024, "cuda": 8192}  # 2.1 GFLOP on a CPU, 1.1 TFLOP on a GPU: long enough to time
DEFAULT_BUDGET_S = 1.0  # both measurements, buffers made and first touched included
_MEASURED: dict[tuple, "Machine"] = {}


@dataclass(frozen=True)
class Machine:
    """The bound of one device: bytes/s it copies, FLOP/s it multiplies, and what measuring them cost."""
    device: str
    dtype: str
    bandwidth: float  # bytes/s (read + written)
    flops: float      # FLOP/s
    seconds: float    # wall time the two measurements took
    copy_runs: int = 0
    matmul_runs: int = 0

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the two ceilings meet: a step below it is bound by memory, above by arithmetic."""
        return self.flops / self.bandwidth

    def bound_s(self, nbytes: float, flops: float) -> float:
        """The fastest a step of `nbytes` read and `flops` done can be: the slower of its two ceilings."""
        return max(nbytes / self.bandwidth, flops / self.flops)

    def ceiling(self, intensity: float) -> float:
        """FLOP/s the roofline allows at `intensity` FLOPs per byte."""
        return min(self.flops, self.bandwidth * intensity)


def _sync(device: torch.device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def timed_runs(run, sync, budget_s: float, start: float, most: int = 50) -> tuple[float, int]:
    """(fastest run's seconds, runs): one untimed warm run, then runs until the next would pass budget_s (counted
    from `start`, before the buffers were made) or `most` are done; at least one timed run."""
    sync()
    run()
    sync()
    best, runs = float("inf"), 0
    while runs < most:
        t = time.perf_counter()
        run()
        sync()
        took = time.perf_counter() - t
        best, runs = min(best, took), runs + 1
        if time.perf_counter() - start + took > budget_s:
            break
    return best, runs


def copy_bandwidth(device="cpu", budget_s: float = DEFAULT_BUDGET_S / 2,
                   nbytes: int | None = None) -> tuple[float, int]:
    """(bytes/s, timed runs) of copying one buffer of nbytes into another (default COPY_BYTES per device kind)."""
    device, start = torch.device(device), time.perf_counter()
    nbytes = nbytes or COPY_BYTES.get(device.type, COPY_BYTES["cpu"])
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best, runs = timed_runs(lambda: dst.copy_(src), _sync(device), budget_s, start)
    return 2 * nbytes / best, runs


def flop_rate(device="cpu", dtype=torch.float32, budget_s: float = DEFAULT_BUDGET_S / 2,
              side: int | None = None) -> tuple[float, int]:
    """(FLOP/s, timed runs) of a side × side matmul in dtype."""
    device, start = torch.device(device), time.perf_counter()
    n = side or MATMUL_SIDE.get(device.type, MATMUL_SIDE["cpu"])
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    best, runs = timed_runs(lambda: torch.mm(a, b, out=out), _sync(device), budget_s, start)
    return 2 * n ** 3 / best, runs


def measure_machine(device="cpu", dtype=torch.float32, budget_s: float = DEFAULT_BUDGET_S,
                    fresh: bool = False) -> Machine:
    """The device's bound, measured once per process (fresh=True measures again): half the budget each."""
    device, dtype = torch.device(device), dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))
    key = (str(device), dtype)
    if not fresh and key in _MEASURED:
        return _MEASURED[key]
    if budget_s <= 0:
        raise ValueError(f"budget_s must be positive, got {budget_s}")
    start = time.perf_counter()
    bandwidth, copies = copy_bandwidth(device, budget_s / 2)
    flops, products = flop_rate(device, dtype, budget_s / 2)
    machine = Machine(str(device), str(dtype).removeprefix("torch."), bandwidth, flops, time.perf_counter() - start,
                      copies, products)
    _MEASURED[key] = machine
    return machine
