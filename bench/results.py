"""The bench's records: one JSON file a machine, bench/results/<machine-slug>.json, holding the newest figure of
every row measured there, each row naming the run that measured it (date, command, threads, load, commit).

A run replaces, on its machine, every older row of the measurements it ran (and any older row of the same name);
rows of measurements it did not run stay as they were. bench/results_page.py renders RESULTS.md from the files."""
import datetime
import json
import os
import re
import subprocess
import threading

import torch

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
              "amx_bf16", "amx_int8")  # what the CPU kernels (ours, oneDNN's, llama.cpp's) pick their paths by


def cpu_info(path: str = "/proc/cpuinfo") -> tuple[str, set]:
    """(model name, flags) of the first CPU; ("unknown CPU", empty) where there is no /proc/cpuinfo."""
    model, flags = "unknown CPU", set()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return model, flags


def machine_stamp(device: str = "cpu", path: str = "/proc/cpuinfo", variant: str | None = None) -> dict:
    """What tells two machines apart for these figures: CPU model, cores, SIMD flags present and absent, GPU; and
    `variant`, a run of other settings (e.g. 'hf-onednn', 'cuda bfloat16'), whose rows keep a record of their own."""
    model, flags = cpu_info(path)
    gpu = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else None
    return {"cpu": model, "cores": os.cpu_count(), "flags": [f for f in SIMD_FLAGS if f in flags],
            "absent": [f for f in SIMD_FLAGS if f not in flags] if flags else None, "gpu": gpu, "variant": variant}


def slug(stamp: dict) -> str:
    """A file name for the machine: CPU model, cores and its widest vector unit (+ GPU), e.g.
    'intel-xeon-2-80ghz-2c-avx512'. The same CPU model with other flags (another VM host) gets its own file."""
    name = re.sub(r"\((r|tm)\)|\bcpu\b|\bprocessor\b", " ", stamp["cpu"].lower())
    flags = stamp["flags"]
    simd = next((tag for tag, flag in (("amx", "amx_tile"), ("avx512", "avx512f"), ("avx2", "avx2"))
                 if flag in flags), "novec" if stamp.get("absent") is not None else "flags-unknown")
    parts = [name, f"{stamp['cores']}c", simd] + [stamp[k].lower() for k in ("gpu", "variant") if stamp.get(k)]
    return re.sub(r"[^a-z0-9]+", "-", " ".join(parts)).strip("-")


def load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


class LoadSampler:
    """The 1-min load average read every `period` seconds on a daemon thread while the bench runs: its range says
    how loaded the whole run was, where readings before and after can both miss the busy middle."""

    def __init__(self, period: float = 10.0):
        self.first = load_average()  # the load before the run (1/5/15 min)
        self.readings = [self.first[0]] if self.first else []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(period,), daemon=True)
        self._thread.start()

    def _sample(self, period: float):
        while not self._stop.wait(period):
            self.readings.append(load_average()[0])

    def stop(self) -> list[float] | None:
        """[min, max] of the readings so far (the sampler stops)."""
        self._stop.set()
        return [min(self.readings), max(self.readings)] if self.readings else None


def git_commit() -> str:
    """The checkout's commit, '+changes' where minivlm/ or bench/ differ from it; 'unknown' outside git."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "minivlm", "bench"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+changes" if dirty else "")) if head else "unknown"


def run_stamp(command: str, threads: int, load_before, seconds: float, repeats: int, model: str,
              source: str = "measured", load_range=None) -> dict:
    """The run's own line: when, how (the exact command), on how many threads, how loaded before, during (the
    1-min range) and after."""
    import transformers
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "source": source, "command": command, "threads": threads, "load_before": load_before,
            "load_after": load_average(), "load_range": load_range, "seconds": round(seconds), "repeats": repeats,
            "model": model, "torch": torch.__version__, "transformers": transformers.__version__,
            "commit": git_commit()}


def merge(record: dict | None, machine: dict, run: dict, rows: list[dict], order=(), whole_groups=True) -> dict:
    """The record with this run's rows in: each older row of the same metric is replaced, and with `whole_groups`
    each older row of a group (measurement) the run measured; a row newer than the run is kept (a late-merged older
    run never wins). Rows sorted by their group's place in `order` (unknown groups last); runs no row names dropped."""
    record = record or {"machine": machine, "runs": {}, "rows": []}
    runs = dict(record["runs"])
    run_id = run["date"]
    while run_id in runs and runs[run_id] != run:  # two runs stamped in the same second
        run_id += "'"
    runs[run_id] = run
    newer = {r["metric"] for r in record["rows"] if runs[r["run"]]["date"] > run["date"]}
    groups, metrics = {r["group"] for r in rows} if whole_groups else set(), {r["metric"] for r in rows}
    fresh = {r["metric"]: {**r, "run": run_id} for r in rows if r["metric"] not in newer}
    merged = []
    for old in record["rows"]:  # a row replaced by one of the same name takes its place; a replaced group goes
        if old["metric"] in newer or (old["group"] not in groups and old["metric"] not in metrics):
            merged.append(old)
        elif old["metric"] in fresh and old["group"] not in groups:
            merged.append(fresh.pop(old["metric"]))
    rank = {group: i for i, group in enumerate(order)}
    merged = sorted(merged + list(fresh.values()), key=lambda r: rank.get(r["group"], len(rank)))
    used = {r["run"] for r in merged}
    latest = max(runs[i]["date"] for i in used) if used else run["date"]
    return {"machine": machine if run["date"] >= latest else record["machine"],
            "runs": {i: r for i, r in sorted(runs.items()) if i in used}, "rows": merged}


def path_for(folder: str, machine: dict) -> str:
    return os.path.join(folder, slug(machine) + ".json")


def read(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def record_run(folder: str, machine: dict, run: dict, rows: list[dict], order=(), whole_groups=True) -> str:
    """Merge the run into its machine's file in `folder`; returns the file's path."""
    os.makedirs(folder, exist_ok=True)
    path = path_for(folder, machine)
    merged = merge(read(path), machine, run, rows, order, whole_groups)
    with open(path, "w") as f:
        json.dump(merged, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return path


def load_all(folder: str) -> list[dict]:
    """Every machine's record in `folder`, the most recently measured machine first."""
    records = [read(os.path.join(folder, name)) for name in sorted(os.listdir(folder)) if name.endswith(".json")] \
        if os.path.isdir(folder) else []
    return sorted(records, key=lambda r: max(run["date"] for run in r["runs"].values()), reverse=True)
