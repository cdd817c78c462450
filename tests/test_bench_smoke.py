"""The benchmark's whole code path on a tiny random checkpoint: every measurement runs, produces a full table,
and the work it times is the same work on both sides (greedy outputs equal HF transformers'). No timing asserts."""
import json
import math

import pytest

from bench.__main__ import main
from minivlm.engine.sampling.grammar_masks import MaskFiller

METRICS = ["varied: throughput vs HF one-by-one", "varied: ceiling = HF one-by-one time / engine prefill-only time",
           "varied: throughput vs HF padded batch", "uniform: throughput vs HF one-by-one",
           "uniform: throughput vs HF padded batch", "single-stream decode vs HF generate",
           "single-stream decode vs bandwidth bound", "TTFT repeated image+prompt (C) vs cold",
           "TTFT same image, new text (C) vs cold", "KV used / allocated at peak (paged vs contiguous)",
           "KV waste per request", "stream() + snapshot every step vs generate()",
           "decode throughput, event log on vs off", "timeline stamps: cost per decode step (batch 8)",
           "ITL p50, 8 streams + 448² arrivals: chunked + async vision vs whole prefill",
           "ITL p99, 8 streams + 448² arrivals: chunked + async vision vs whole prefill",
           "ITL p99, same, the tower in the step: chunked vs whole",
           "ITL p99, same, image embeddings cached: chunked vs whole",
           "offered load: one arrival's vision + prefill time / arrival period",
           "decode throughput, KV events published (no subscriber) vs off",
           "decode throughput, KV events published (a subscriber over loopback) vs off",
           "long context, 8 streams: throughput vs HF generate",
           "long context: attention bytes read per decode step / KV held",
           "long context, 8 streams: decode step vs memory bound",
           "long context, 1 stream: throughput vs HF generate", "long context, 1 stream: decode step vs memory bound",
           "hybrid decode vs HF generate: Qwen3.5", "hybrid decode vs HF generate: Gemma 3",
           "speculative decode, copy-heavy (its answer repeats): on vs off", "speculative decode, no n-gram found: on vs off",
           "HF prompt lookup, text request: on vs off",
           "MTP speculation k=3, tiny Qwen3.5 descriptions: on vs off",
           *(line for name in ("regex", "json") for line in (
               f"grammar mask per decode step, batch 8, tiny model ({name})",
               *(f"same ({name}), the masks filled {mode}" for mode in MaskFiller.MODES))),
           "grammar mask per speculating decode step (n-gram, 4 guesses), batch 8, tiny model (regex), filled ahead",
           "same (speculating), the masks filled at sampling",
           "single-stream decode, bf16 vs fp32", "single-stream decode, int8 vs fp32",
           "single-stream decode, int8, bf16 engine vs fp32", "single-stream decode, int4 vs fp32",
           "one busy process: single-stream decode vs HF generate",
           "one busy process: engine on the free cores vs its thread count fixed",
           "engine step with an empty model (batch 1)", "engine step with an empty model (batch 16)"]


@pytest.mark.slow  # every bench row on the tiny model, about a minute: CI runs it with -m slow
def test_bench_runs_end_to_end_on_a_tiny_model(tmp_path):
    md, js = tmp_path / "table.md", tmp_path / "raw.json"
    rows, details = main(["--smoke", "--repeats", "1", "--threads", "2", "--checkpoint-dir", str(tmp_path / "ckpt"),
                          "--markdown", str(md), "--json", str(js), "--results", str(tmp_path / "results")])
    chosen = details["structured_decode"]["regex"]["mode"]  # where this machine's engine fills grammar masks
    assert [r.metric for r in rows] == [m for m in METRICS if m != f"same (regex), the masks filled {chosen}"
                                        and m != f"same (json), the masks filled {chosen}"]
    for r in rows:
        assert math.isfinite(r.engine) and math.isfinite(r.baseline) and r.engine > 0 and r.baseline > 0, r
    # The timed work is the same on both sides: the engine's greedy tokens equal HF generate's, one by one and batched.
    for workload in ("varied", "uniform"):
        assert details[f"throughput_{workload}"]["same_tokens_as_engine"] == {"one": 16, "batch": 16}
    assert all(r.same == "16/16" for r in rows if r.metric.endswith(("one-by-one", "padded batch")))
    assert next(r for r in rows if r.metric.startswith("single-stream")).same == "1/1"
    # Prefix cache: the repeat is served from cache; with new text, at least the image's blocks still are.
    cached = details["prefix_cache"]["cached_tokens"]
    assert cached["cold"] == 0 and cached["same"] > cached["text"] > 0
    # Paged KV: at every step, less than one block per request holds no token (a property, not a timing).
    assert details["memory"]["worst_paged_waste_blocks_per_request"] < 1
    assert details["memory"]["paged_bytes"] < details["memory"]["contiguous_bytes"]
    assert all(n > 0 for n in details["panel_overhead"]["snapshots_per_run"])
    # Chunked prefill: every arrival of every run was answered, and the streams' tokens never changed.
    chunked = details["chunked_prefill"]
    assert chunked["stream_tokens_equal"] and all(len(v) == chunked["arrivals_per_run"]
                                                  for k, v in chunked["arrival_latency_s"].items() if k != "steady")
    page = md.read_text()  # the results page: this run's every row, once, and the command that measured them
    assert "`python -m bench --smoke --repeats 1" in page
    assert [line.split(" | ")[0].lstrip("| ") for line in page.split("## Every row")[1].splitlines()
            if line.startswith("| ") and not line.startswith("| row |")] == [r.metric for r in rows]
    raw = json.loads(js.read_text())
    assert set(raw) == {"throughput_varied", "throughput_uniform", "single_stream", "prefix_cache", "memory",
                        "panel_overhead", "events_overhead", "timeline_overhead", "chunked_prefill",
                        "kv_events_overhead",
                        "long_context_8", "long_context_1", "hybrid_qwen3_5", "hybrid_gemma3",
                        "speculative copy-heavy (its answer repeats)", "speculative no n-gram found", "speculative hf",
                        "speculative mtp k=3",
                        "structured_decode", "quantized", "busy_machine", "step_overhead"}
    assert all(r.same == "1/1" for r in rows if r.metric.startswith(("hybrid decode", "speculative decode, copy",
                                                                      "MTP speculation")))
    assert details["speculative mtp k=3"]["accepted"] > 0  # the trained head's guesses are taken
    # Long context: 1,536-token prompts, the same greedy tokens as HF's batch; decode steps were timed and counted.
    long_rows = [r for r in rows if r.metric.startswith("long context") and "throughput" in r.metric]
    assert [r.same for r in long_rows] == ["8/8", "1/1"]
    assert all(raw[f"long_context_{n}"]["decode_step_ops"] > 0 for n in (8, 1))
    kv = raw["kv_events_overhead"]  # every batch of both publishing engines was sent, none dropped
    assert all(s["batches"] == s["next_seq"] > 0 and not s.get("dropped_hwm") for s in kv["publisher"].values())


def test_stream_gaps_returns_when_the_streams_end_before_the_arrivals(checkpoints, capsys):
    """Streams that reach their token limit while arrivals are still being answered used to leave the bench
    waiting for a next token that never comes (a small token budget makes the arrivals that slow)."""
    import threading

    from bench.chunked_prefill import stream_gaps
    from minivlm import Engine, EngineConfig
    with Engine(EngineConfig(model=checkpoints["qwen3_vl"], device="cpu", dtype="float32", num_blocks=256, max_model_len=1024,
                             enable_chunked_prefill=True, max_num_batched_tokens=10)) as engine:
        box = {}
        t = threading.Thread(target=lambda: box.update(out=stream_gaps(engine, 2, 0.5, 0, stream_tokens=3)),
                             daemon=True)
        t.start()
        t.join(120)
    assert not t.is_alive(), "stream_gaps hung after its streams finished"
    gaps, tokens = box["out"]
    assert len(tokens["arrivals"]) == 2 and all(len(tokens[f"stream-{i}"]) == 3 for i in range(8))
    assert "reached 3 tokens before the arrivals were answered" in capsys.readouterr().err
