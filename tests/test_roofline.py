"""The roofline (#56 part 2) against independent truths: the bytes a step reads equal the loaded model's own tensors
and the engine's real KV / state allocations (and the VRAM calculator's counts), a point's sentence does its
arithmetic right, the machine's measurement keeps to its time budget, and the measured points are the engine's own
step times read from its event log (an injected clock)."""
import itertools
import re
import time

import pytest

from minivlm import Engine, SamplingParams
from minivlm.budget import estimate
from minivlm.budget.machine import Machine, measure_machine, timed_runs
from minivlm.budget.roofline import decode_cost, image_cost, model_costs, step_cost
from minivlm.views.roofline_points import Point, engine_costs, measure_points, point, timed_steps
from panels.i18n import EN, ZH
from panels.roofline_figure import roofline_figure, sentence
from tools.make_checkpoint import make_random_checkpoint
from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    """A Qwen2.5-VL-shaped random checkpoint with its own LM head (the shipped tiny model's is tied)."""
    return make_random_checkpoint("qwen2_5_vl", str(tmp_path_factory.mktemp("untied")), tie=False)


def tensor_bytes(engine) -> dict[str, int]:
    """The loaded decoder's own parameters, by the part the roofline names."""
    parts = {"decoder": 0, "table": 0, "head": 0}
    for name, p in engine.model.decoder.named_parameters():
        part = "table" if name.startswith("embed_tokens") else "head" if name.startswith("lm_head") else "decoder"
        parts[part] += p.nbytes
    return parts


@pytest.mark.parametrize("which", ["tiny", "untied"])
def test_the_byte_split_is_the_loaded_tensors_and_the_calculators(which, untied):
    path = "assets/tiny-qwen-vl" if which == "tiny" else untied
    with Engine(model=path, device="cpu", dtype="float32", num_blocks=8) as engine:
        report, real = engine.memory_report(), tensor_bytes(engine)
        costs = engine_costs(engine)
    assert costs.decoder == real["decoder"] > 0  # every layer and the final norm, read once a step
    assert costs.embedding_table == real["table"]
    assert costs.lm_head == (real["table"] if costs.tied else real["head"]) > 0  # a tied head is the table
    assert costs.tied == (which == "tiny") and costs.vision == report.vision_weights_bytes
    assert costs.text_bytes + costs.vision == report.weights_bytes
    est = estimate(path, dtype="float32", kv_dtype="float32", device_memory_gb=1)
    assert (costs.text_bytes, costs.vision) == (est.text_weights_bytes, est.vision_weights_bytes)
    per_token = report.kv_cache_bytes // (report.num_blocks * report.block_size)  # the pool as allocated
    assert per_token == est.kv_bytes_per_token
    for batch, context in [(1, 1), (4, 15), (4, 16), (16, 17)]:  # around a block's edge: tokens, not whole blocks
        step = decode_cost(costs, batch, context)
        assert step.parts["KV reads"] == batch * context * per_token
        assert step.parts["decoder weights"] + step.parts["LM head"] == costs.decoder + costs.lm_head


def test_a_hybrid_step_reads_each_state_slot_as_allocated_and_the_quantized_split(tmp_path):
    path = make_qwen3_5_checkpoint(str(tmp_path / "qwen3_5"), seed=3)
    with Engine(model=path, device="cpu", dtype="float32", num_blocks=16, max_model_len=256) as engine:
        groups = {g["kind"]: g for g in engine.memory_report().groups}
        costs = engine_costs(engine)
    slot = groups["recurrent"]["bytes"] // groups["recurrent"]["size"]  # one request's state, as allocated
    full = groups["full_attention"]["bytes"] // (groups["full_attention"]["size"] * 16)
    step = decode_cost(costs, 3, 40)
    assert step.parts["recurrent state"] == 3 * 2 * slot  # read and written back whole, whatever the context
    assert step.parts["KV reads"] == 3 * 40 * full  # only the full-attention layers keep every token
    for dtype in ("int8", "int4"):  # the calculator's quantized bytes, split: nothing lost or counted twice
        q, est = model_costs("Qwen2.5-VL-3B-Instruct", dtype), estimate("Qwen2.5-VL-3B-Instruct", dtype, device="L4")
        assert (q.text_bytes, q.vision) == (est.text_weights_bytes, est.vision_weights_bytes)
        assert q.decoder < model_costs("Qwen2.5-VL-3B-Instruct", "bfloat16").decoder


def test_flops_count_every_weight_twice_a_row_and_attention_by_hand():
    costs = model_costs("Qwen2.5-VL-3B-Instruct", "bfloat16")
    t = estimate("Qwen2.5-VL-3B-Instruct", device="L4")
    layers, heads, head_dim = 36, 16, 128  # the published config
    one = decode_cost(costs, 1, 100)
    attention = layers * 4 * heads * head_dim * 100  # QKᵀ and AV over 100 keys
    assert one.flops == 2 * costs.linear_params + 2 * costs.head_params + attention
    prefill = step_cost(costs, [(0, 64)])  # query i sees i keys: 64·65/2 in all; one row goes through the head
    assert prefill.flops == 2 * costs.linear_params * 64 + 2 * costs.head_params + layers * 4 * heads * head_dim * 2080
    assert prefill.intensity > 40 * one.intensity  # a prefill reuses each weight 64 times
    chunk = step_cost(costs, [(0, 64)], sampled=0)  # a chunk mid-prompt samples nothing: the head is not read
    assert chunk.parts["LM head"] == 0 and prefill.flops - chunk.flops == 2 * costs.head_params
    assert t.kv_bytes_per_token == costs.groups[0].bytes_per_token("bfloat16")
    big = decode_cost(costs, 16, 1024)  # the lesson's figures (README step 7, LESSON.md): ~6.2 GB of weights, 0.6 of KV
    assert round((big.parts["decoder weights"] + big.parts["LM head"]) / 1e9, 1) == 6.2
    assert round(big.parts["KV reads"] / 1e9, 1) == 0.6 and big.parts["KV reads"] == 16 * 1024 * t.kv_bytes_per_token
    img = image_cost("Qwen2.5-VL-3B-Instruct", "bfloat16", 448, 448)
    assert img.notes["patches"] == 1024 and img.parts["vision weights"] == t.vision_weights_bytes
    with pytest.raises(ValueError, match="cached >= 0 and new >= 1"):
        step_cost(costs, [(5, 0)])
    with pytest.raises(ValueError, match="batch >= 1"):
        decode_cost(costs, 0, 10)
    with pytest.raises(ValueError, match="text-only"):
        image_cost("Qwen3-0.6B")


NUMBER = r"([\d,.]+)"


def test_each_sentence_does_its_arithmetic():
    machine = Machine("cpu", "float32", bandwidth=25e9, flops=400e9, seconds=0.5, copy_runs=3, matmul_runs=2)
    costs = model_costs("Qwen2.5-VL-3B-Instruct", "bfloat16")
    p = point("decode", 1, 70, decode_cost(costs, 1, 70), machine, seconds=0.0951, steps=4)
    said = sentence(p, machine, EN)
    m = re.fullmatch(rf"a 1-request decode step at 70 tokens of context reads {NUMBER} MB; at {NUMBER} GB/s that is "
                     rf"at best {NUMBER} ms; it took {NUMBER} ms \({NUMBER} % of the bound\)", said)
    assert m, said
    mb, gbs, best, took, pct = (float(x.replace(",", "")) for x in m.groups())
    assert mb == round(p.cost.bytes / 1e6) and gbs == 25.0 and took == 95.1
    assert best == round(mb / gbs)  # MB over GB/s is ms, to the digits shown
    assert abs(pct - 100 * best / took) < 1  # the share of the bound, from the numbers on the page
    prefill = point("prefill", 1, 512, step_cost(costs, [(0, 512)]), machine)
    said = sentence(prefill, machine, EN)
    m = re.fullmatch(rf"a 1-request prefill step of 512 tokens computes {NUMBER} GFLOP; at 400 GFLOP/s that is at "
                     rf"best {NUMBER} ms \(predicted: not run\)", said)
    assert m and not prefill.memory_bound, said
    gflop, best = (float(x.replace(",", "")) for x in m.groups())
    assert abs(best - gflop / 400 * 1e3) <= 0.5 + 1e-3 * best  # GFLOP over GFLOP/s is s, to the digits shown
    assert "预测值" in sentence(prefill, machine, ZH) and "最快" in sentence(prefill, machine, ZH)


def test_the_machine_is_measured_within_its_budget_and_once_a_process():
    for budget, one in ((0.3, 0.04), (0.1, 0.07), (0.05, 0.2)):  # runs of a known length (sleeps: a busy CPU waits)
        start = time.perf_counter()
        best, runs = timed_runs(lambda: time.sleep(one), lambda: None, budget, start)
        took = time.perf_counter() - start
        assert runs >= 1 and best >= one  # at least one timed run, after the untimed warm one
        assert took <= max(budget, 2 * one) + 0.1, (budget, one, took, runs)  # the budget, or warm + one run
    start = time.perf_counter()
    m = measure_machine(budget_s=0.5, fresh=True)  # the real one, on a shared 2-core box: a generous margin
    assert time.perf_counter() - start < 0.5 + 1.5 and m.seconds < 2.0, m
    assert m.bandwidth > 1e8 and m.flops > 1e8 and m.copy_runs >= 1 and m.matmul_runs >= 1
    start = time.perf_counter()
    assert measure_machine() is measure_machine() and time.perf_counter() - start < 0.05
    with pytest.raises(ValueError, match="budget_s must be positive"):
        measure_machine(budget_s=0, fresh=True)


def test_points_are_the_engines_own_step_times(tmp_path):
    """A clock that advances 5 ms a reading: every step's time is a whole number of readings, exactly what its
    scheduled event's started / ended say, and each decode point costs what decode_cost says of its plan."""
    with Engine(num_blocks=64) as engine:
        ticks = itertools.count()
        engine.core.clock = lambda: 0.005 * next(ticks)  # the engine's clock (docs/API.md: the event log's time)
        since = engine.snapshot().last_event_seq
        engine.generate([engine_request(engine, 40)], SamplingParams(max_tokens=4, ignore_eos=True))
        events = engine.events(since)
        costs = engine_costs(engine)
        scheduled = [e for e in events if e.kind == "scheduled"]
        if not scheduled or scheduled[0].fields.get("ended") is None:
            pytest.skip("this engine's event log does not time its steps yet")
        steps = timed_steps(events, costs)
        assert [round(s[4], 6) for s in steps] == [round(e.ended - e.started, 6) for e in scheduled]
        for kind, n, context, cost, _ in steps:
            if kind == "decode":
                assert cost == decode_cost(costs, n, context)
        machine = Machine("cpu", "float32", 10e9, 100e9, 0.1)
        points = measure_points(engine, machine, batches=(1, 4), contexts=(32,), new_tokens=4)
        decodes = [p for p in points if p.kind == "decode"]
        assert [p.batch for p in decodes] == [1, 4] and all(p.steps == 2 for p in decodes)
        assert all(isinstance(p, Point) and p.seconds > 0 for p in points)
        slow = Machine("cpu", "float32", 10e9, 1e3, 0.1)  # at 1 kFLOP/s no prefill fits a minute: nothing is run
        assert measure_points(engine, slow, batches=(1,), contexts=(32,), budget_s=60) == []
    fig = roofline_figure(machine, points, "tiny", EN)
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"


def engine_request(engine, tokens):
    from minivlm import Request
    from minivlm.views.roofline_points import prompt_of
    return Request(prompt=prompt_of(engine, tokens, 0))
