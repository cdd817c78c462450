"""The results table for the terminal (bench/results_page.py writes RESULTS.md) and a description of the machine."""
import os
import platform

import torch

from bench import steal

HEADER = ("metric", "engine", "baseline", "ratio", "goal", "", "tokens = HF", "spread of repeats")


def fmt(value: float, unit: str) -> str:
    if unit == "":
        return f"{value:.0%}"
    return f"{value:.3g} {unit}"


def cells(row) -> tuple[str, ...]:
    ratio = f"{row.ratio:.0%}" if "%" in row.goal and "slower" not in row.goal else f"{row.ratio:.2f}x"
    mark = "" if row.passed is None else "✓" if row.passed else "✗"
    return (row.metric, fmt(row.engine, row.unit), fmt(row.baseline, row.unit), ratio, row.goal, mark, row.same,
            row.spread)


def text_table(rows) -> str:
    lines = [HEADER] + [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def machine() -> str:
    """CPU model, cores, load average, the VM's steal since the bench started, torch threads and versions: what a
    reader needs to compare numbers."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = "/".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (f"{cpu}, {os.cpu_count()} cores, {gpu}; torch {torch.__version__} with {torch.get_num_threads()} threads; "
            f"load average (1/5/15 min) {load}; VM steal since the bench started {steal.since_start()}")
