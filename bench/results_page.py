"""python -m bench.results_page: bench/RESULTS.md from every machine's record in bench/results/ and the
hand-written bench/HISTORY.md, without running anything (`python -m bench ... --markdown FILE` calls the same).

Per machine its runs (date, command, threads, load before and after); the peers side by side (HF, llama.cpp at
each precision); every row's current figure on every machine, its goal and ✓/✗."""
import argparse
import os

from bench import results
from bench.report import fmt

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE, HISTORY = os.path.join(HERE, "RESULTS.md"), os.path.join(HERE, "HISTORY.md")
PEER_COMMAND = "python -m bench --quick --only --peer llamacpp"  # builds llama.cpp first where it is missing
# The comparisons with another engine, read off the rows whose metric ends so (the 348M rows start with the
# peer checkpoint's size): (what, metric ending, the command that measures it).
PEER_VIEW = [
    ("68.5M fp32, 1 stream: vs HF generate", "single-stream decode vs HF generate", "single_stream"),
    ("68.5M fp32, 1 stream: vs llama.cpp f32", "single-stream decode vs llama.cpp f32", None),
    ("68.5M fp32, 1 stream: vs llama.cpp f16", "single-stream decode vs llama.cpp f16", None),
    ("68.5M fp32, 16 requests: vs HF padded batch", "uniform: throughput vs HF padded batch", "throughput"),
    ("68.5M fp32, 16 requests: vs llama-server f32", "uniform: throughput vs llama-server -np 16 -cb f32", None),
    ("68.5M fp32, 16 requests: vs llama-server f16", "uniform: throughput vs llama-server -np 16 -cb f16", None),
    *((f"348M, 1 stream: engine {ours} vs llama.cpp {theirs}",
       f"single-stream decode, engine {ours} vs llama.cpp {theirs}", None)
      for ours, theirs in (("fp32", "F32"), ("bf16", "F16"), ("int8", "Q8_0"), ("int4", "Q4_K_M"))),
    ("348M int8 vs Q8_0, one busy core", "single-stream decode, engine int8 vs llama.cpp Q8_0, one busy core", None),
]


def ratio_text(row: dict) -> str:
    if row.get("ratio") is None:
        return ""
    goal = row.get("goal") or ""
    return f"{row['ratio']:.0%}" if "%" in goal and "slower" not in goal else f"{row['ratio']:.2f}x"


def cell(row: dict, run_label: str, goal: str) -> str:
    """'2.20x ✓ (101 vs 45.9 tok/s) A1': ratio, mark, both sides' figures (or the diary's own words), the run."""
    mark = {True: " ✓", False: " ✗"}.get(row.get("passed"), "")
    if row.get("figure"):
        figures = row["figure"]
    elif row.get("engine") is not None and row.get("baseline") is not None:
        engine, baseline = fmt(row["engine"], row["unit"]), fmt(row["baseline"], row["unit"])
        unit = " " + row["unit"] if row["unit"] and engine.endswith(row["unit"]) else ""
        figures = f"{engine[:len(engine) - len(unit)]} vs {baseline}"  # '101 vs 45.9 tok/s
    else:
        figures = ""
    text = (ratio_text(row) + mark).strip()
    text += f" ({figures})" if figures and text else figures
    if (row.get("goal") or "") != goal:
        text += f" (goal {row['goal']})"
    return f"{text} {run_label}".replace("|", "/")


def load_text(load) -> str:
    return "/".join(f"{x:.2f}" for x in load) if isinstance(load, list) else (load or "not recorded")


def run_line(label: str, run: dict) -> str:
    source = "measured" if run["source"] == "measured" else run["source"]
    load = (f"load average {run['load']}" if run.get("load") else
            f"load average (1/5/15 min) {load_text(run.get('load_before'))} before, "
            f"{load_text(run.get('load_after'))} after" + (
                f", 1-min {run['load_range'][0]:.1f}-{run['load_range'][1]:.1f} during" if run.get("load_range")
                else ""))
    line = (f"  - **{label}** {run['date'][:16].replace('T', ' ')} UTC, {source}: `{run['command']}`; "
            f"{run['threads']} threads, {load}")
    extra = [f"{run['seconds']} s" if run.get("seconds") else "", f"repeats {run['repeats']}" if run.get("repeats")
             else "", f"torch {run['torch']}" if run.get("torch") else "",
             f"commit {run['commit']}" if run.get("commit") else "", run.get("note", "")]
    return line + "".join(f"; {x}" for x in extra if x)


def machine_line(letter: str, record: dict) -> str:
    m, goals = record["machine"], [r["passed"] for r in record["rows"] if r.get("passed") is not None]
    met = f"; goals met: {sum(goals)} of {len(goals)} rows with a goal" if goals else ""
    flags = " ".join(m["flags"]) or "none listed"
    absent = "not recorded" if m.get("absent") is None else " ".join(m["absent"]) or "none"
    gpu = m.get("gpu") or "no GPU"
    note = f" ({m['note']})" if m.get("note") else ""
    variant = f", runs with {m['variant']}" if m.get("variant") else ""
    return (f"- **{letter}: {m['cpu']}**{variant}, {m['cores']} cores, {gpu}; CPU flags {flags}; absent: {absent}"
            f"{note}{met}")


def labelled(records: list[dict]) -> list[tuple[str, dict, dict]]:
    """(letter, record, run id -> label such as 'A2') per machine, runs numbered by date."""
    out = []
    for i, record in enumerate(records):
        letter = chr(ord("A") + i)
        out.append((letter, record, {rid: f"{letter}{n + 1}" for n, rid in enumerate(sorted(record["runs"]))}))
    return out


def rows_by_metric(record: dict) -> dict:
    return {r["metric"]: r for r in record["rows"]}


def find(record: dict, ending: str) -> dict | None:
    return next((r for r in record["rows"] if r["metric"].endswith(ending)), None)


def peer_table(machines) -> list[str]:
    out = ["| comparison | goal | " + " | ".join(letter for letter, *_ in machines) + " |",
           "|---|---|" + "---|" * len(machines)]
    for what, ending, group in PEER_VIEW:
        found = [(find(rec, ending), labels) for _, rec, labels in machines]
        goal = next((r["goal"] for r, _ in found if r is not None), "")
        missing = f"not measured here (`--only {group}`)" if group else "not measured here¹"
        cells = [cell(r, labels[r["run"]], goal) if r is not None else missing for r, labels in found]
        out.append(f"| {what} | {goal or '(context)'} | " + " | ".join(cells) + " |")
    return out


def row_table(machines) -> list[str]:
    metrics, groups = [], {}
    for _, rec, _ in machines:  # the newest machine's order first, rows only other machines have after theirs
        for r in rec["rows"]:
            if r["metric"] not in groups:
                metrics.append(r["metric"])
                groups[r["metric"]] = r["group"]
    by = [rows_by_metric(rec) for _, rec, _ in machines]
    out = ["| row | measured by | goal | " + " | ".join(letter for letter, *_ in machines) + " |",
           "|---|---|---|" + "---|" * len(machines)]
    for metric in metrics:
        goal = next(b[metric]["goal"] for b in by if metric in b) or ""
        cells = [cell(b[metric], labels[b[metric]["run"]], goal) if metric in b else "—"
                 for b, (_, _, labels) in zip(by, machines)]
        out.append(f"| {metric} | `{groups[metric] or '?'}` | {goal or '(context)'} | " + " | ".join(cells) + " |")
    return out


def render(records: list[dict], history: str = "") -> str:
    machines = labelled(records)
    out = ["# minivlm bench: the current results",
           "",
           "Written by the bench, not by hand. Every `python -m bench` run records its rows in",
           "`bench/results/<machine>.json` (per machine the newest figure of each row, with the run that measured it;",
           "git keeps the older ones). `python -m bench --quick --markdown bench/RESULTS.md` measures this machine",
           "and rewrites this page from every machine's record; `python -m bench.results_page` rewrites it without",
           "measuring (after an edit of the hand-written [HISTORY.md](HISTORY.md), the last section). Each row is",
           "the median of interleaved repeats, engine and baseline in one process: compare ratios, not tok/s,",
           "across machines and loads. Each row's note (what it ran, tokens equal to HF's) and the spread of its",
           "repeats are in the records. `python -m bench --help` lists the measurements (`--only NAME`).",
           "",
           "## Machines and runs",
           ""]
    for letter, rec, labels in machines:
        out.append(machine_line(letter, rec))
        out += [run_line(labels[rid], run) for rid, run in sorted(rec["runs"].items())]
    out += ["", "A cell: ratio, ✓/✗ against the goal, (engine vs baseline), the run (machine letter, run number).",
            "", "## Peers side by side", ""]
    out += peer_table(machines)
    out += ["", f"¹ `{PEER_COMMAND}`: the llama.cpp rows; it builds llama.cpp first where `.cache/llamacpp/` has",
            "no build (`python -m bench.llamacpp_build`, about 30 minutes on 2 cores; bench/requirements-peer.txt).",
            "", "## Every row", ""]
    out += row_table(machines)
    out += ["", "—: not measured on that machine; `python -m bench --quick --only NAME` measures the rows of "
                "measurement NAME (`peer llamacpp`: `--only --peer llamacpp`)."]
    if history.strip():
        out += ["", history.strip()]
    return "\n".join(out) + "\n"


def write(folder: str = results.RESULTS_DIR, out: str = PAGE, history: str = HISTORY) -> str:
    text = open(history).read() if os.path.exists(history) else ""
    page = render(results.load_all(folder), text)
    with open(out, "w") as f:
        f.write(page)
    return page


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.results_page", description=__doc__)
    ap.add_argument("--results", default=results.RESULTS_DIR, help="the records' folder (default bench/results/)")
    ap.add_argument("--out", default=PAGE, help="the page to write (default bench/RESULTS.md)")
    ap.add_argument("--history", default=HISTORY, help="the hand-written last section (default bench/HISTORY.md)")
    args = ap.parse_args(argv)
    write(args.results, args.out, args.history)
    print(f"[bench] results page written to {args.out}")


if __name__ == "__main__":
    main()
