"""The bench's records and results page (bench/results.py, bench/results_page.py): each machine keeps the newest
figure of every row, a rerun of the same command rewrites that machine's rows, ✓/✗ follow each row's goal, and
`python -m bench ... --markdown` writes the page from the records."""
import json

from bench import results, results_page
from bench.__main__ import main
from bench.peer_quantized import busy_row

XEON = "model name\t: Intel(R) Xeon(R) Processor @ 2.80GHz\nflags\t\t: fpu avx2 fma avx512f avx512_vnni\n"
EPYC = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma f16c\n"


def stamp(tmp_path, cpuinfo: str) -> dict:
    path = tmp_path / f"cpuinfo-{abs(hash(cpuinfo))}"
    path.write_text(cpuinfo)
    return results.machine_stamp("cpu", str(path))


def run(date: str, command: str) -> dict:
    return {"date": date, "source": "measured", "command": command, "threads": 2, "load_before": [5.1, 4.0, 3.2],
            "load_after": [6.3, 4.4, 3.3], "seconds": 60, "repeats": 2, "torch": "x", "commit": "abc"}


def busy(engine_quiet: float, engine_busy: float) -> dict:
    """A real peer row: llama.cpp Q8_0 at 10 tok/s quiet and 5 busy; its goal is 0.8 x the quiet ratio."""
    quiet = {"engine": {"int8": [engine_quiet]}, "llama": {"q8_0": [10.0]}, "load": [0.2, 0.4]}
    slow = {"engine": {"int8": [engine_busy]}, "llama": {"q8_0": [5.0]}, "load": [1.1, 1.3]}
    row = busy_row("348M", "int8", "q8_0", quiet, slow)
    return {**row.__dict__, "group": "peer llamacpp"}


def plain(metric: str, engine: float, group: str) -> dict:
    return {"metric": metric, "engine": engine, "baseline": 10.0, "unit": "tok/s", "ratio": engine / 10,
            "goal": ">= 1.0x", "passed": engine >= 10, "note": "", "same": "", "spread": "", "group": group}


def table_rows(page: str, heading: str) -> list[str]:
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| row |")
            and not line.startswith("| comparison |")]


def test_machines_are_told_apart_by_cpu_model_cores_and_vector_unit(tmp_path):
    xeon, epyc = stamp(tmp_path, XEON), stamp(tmp_path, EPYC)
    assert xeon["flags"] == ["avx2", "fma", "avx512f", "avx512_vnni"] and "amx_tile" in xeon["absent"]
    assert results.slug(xeon) == f"intel-xeon-2-80ghz-{xeon['cores']}c-avx512"
    assert results.slug(epyc) == f"amd-epyc-7b13-{epyc['cores']}c-avx2"
    no_avx512 = stamp(tmp_path, XEON.replace(" avx512f avx512_vnni", ""))
    assert results.slug(no_avx512) != results.slug(xeon)  # the same model on another host's CPU flags
    onednn = results.machine_stamp("cpu", str(tmp_path / "missing"), variant="hf-onednn")  # HF given our kernels
    assert onednn["cpu"] == "unknown CPU" and results.slug(onednn).endswith("-flags-unknown-hf-onednn")


def test_the_newest_figure_wins_and_a_rerun_rewrites_its_measurements_rows(tmp_path):
    folder, xeon = str(tmp_path / "results"), stamp(tmp_path, XEON)
    order = ["single_stream", "quantized", "peer llamacpp"]
    first = [plain("single-stream decode vs HF generate", 20.0, "single_stream"),
             plain("single-stream decode, int8 vs fp32", 25.0, "quantized"), busy(10.0, 9.0)]
    results.record_run(folder, xeon, run("2026-12-07T10:00:00Z", "python -m bench --quick"), first, order)
    # a later run of one measurement: its rows replace that measurement's, the others stay with their own run
    later = [plain("single-stream decode vs HF generate", 8.0, "single_stream")]
    path = results.record_run(folder, xeon, run("2026-12-07T12:00:00Z", "python -m bench --only single_stream"),
                              later, order)
    # an older run merged after it (a diary figure, a late copy) never replaces a newer figure
    stale = [plain("single-stream decode vs HF generate", 30.0, "single_stream"), busy(10.0, 2.0)]
    results.record_run(folder, xeon, run("2026-12-07T11:00:00Z", "python -m bench --quick"), stale, order)
    record = json.load(open(path))
    by = {r["metric"]: r for r in record["rows"]}
    assert len(record["rows"]) == 3 and by["single-stream decode vs HF generate"]["engine"] == 8.0
    assert by["single-stream decode, int8 vs fp32"]["run"] == "2026-12-07T10:00:00Z"
    busy_metric = "348M single-stream decode, engine int8 vs llama.cpp Q8_0, one busy core"
    assert by[busy_metric]["engine"] == 2.0  # 11:00 is newer than the 10:00 figure it replaced
    assert set(record["runs"]) == {r["run"] for r in record["rows"]}  # runs no row names are dropped
    assert [r["group"] for r in record["rows"]] == order


def test_page_has_one_row_per_bench_row_per_machine_and_marks_follow_the_goal(tmp_path):
    folder = str(tmp_path / "results")
    xeon, epyc = stamp(tmp_path, XEON), stamp(tmp_path, EPYC)
    met, missed = busy(10.0, 9.0), busy(10.0, 2.0)  # busy/quiet ratio 1.8 >= 0.8 x 1.0; 0.4 < 0.8
    assert met["passed"] and not missed["passed"]
    results.record_run(folder, xeon, run("2026-12-07T10:00:00Z", "python -m bench --quick"),
                       [met, plain("single-stream decode vs HF generate", 20.0, "single_stream")])
    results.record_run(folder, xeon, run("2026-12-07T12:00:00Z", "python -m bench --quick --only --peer llamacpp"),
                       [missed])
    results.record_run(folder, epyc, run("2026-12-06T09:00:00Z", "python -m bench --quick --only single_stream"),
                       [plain("single-stream decode vs HF generate", 5.0, "single_stream")])
    page = results_page.render(results.load_all(folder), "## How we got here\n\n- hand-written")
    rows = table_rows(page, "## Every row")
    assert len(rows) == 2  # one line per bench row, a column per machine
    busy_line = next(r for r in rows if "one busy core" in r)
    cells = [c.strip() for c in busy_line.strip("| ").split(" | ")]
    assert cells[3].startswith("0.40x ✗ (2 vs 5 tok/s)") and cells[3].endswith("A2") and cells[4] == "—"
    hf = [c.strip() for c in next(r for r in rows if "vs HF generate" in r).strip("| ").split(" | ")]
    assert hf[3] == "2.00x ✓ (20 vs 10 tok/s) A1" and hf[4] == "0.50x ✗ (5 vs 10 tok/s) B1"
    assert "**A: Intel(R) Xeon(R) Processor @ 2.80GHz**" in page and "absent: f16c avx_vnni" in page
    assert "`python -m bench --quick --only --peer llamacpp`; 2 threads, load average (1/5/15 min) 5.10/4.00/3.20 " \
           "before, 6.30/4.40/3.30 after" in page
    peers = table_rows(page, "## Peers side by side")
    assert any("vs llama.cpp Q8_0 |" in r and r.count("not measured here¹") == 2 for r in peers)
    assert page.rstrip().endswith("- hand-written")


def test_markdown_option_records_the_run_and_writes_the_page(tmp_path):
    """The bench itself, on the tiny model: its run lands in this machine's record and the page shows its rows."""
    folder, md = tmp_path / "results", tmp_path / "RESULTS.md"
    argv = ["--smoke", "--repeats", "1", "--only", "memory", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--results", str(folder), "--markdown", str(md)]
    rows, _ = main(argv)
    [path] = folder.iterdir()
    assert path.name == results.slug(results.machine_stamp()) + ".json"
    record = json.loads(path.read_text())
    assert len(record["runs"]) == 1 and [r["metric"] for r in record["rows"]] == [r.metric for r in rows]
    assert all(r["group"] == "memory" for r in record["rows"])
    [run_info] = record["runs"].values()
    assert run_info["command"] == "python -m bench " + " ".join(argv) and len(run_info["load_before"]) == 3
    low, high = run_info["load_range"]  # the 1-min load sampled while it ran, from the reading before it on
    assert 0 <= low <= run_info["load_before"][0] <= high
    page = md.read_text()
    lines = table_rows(page, "## Every row")
    assert [line.split(" | ")[0].lstrip("| ") for line in lines] == [r.metric for r in rows]
    assert all(line.rstrip(" |").endswith("A1") for line in lines)
    assert page == results_page.render(results.load_all(str(folder)), open(results_page.HISTORY).read())
