"""decode_ops.c, the decoder layer's small ops fused for the CPU, and decode_layer.c, a decode step's layers as one
call (minivlm/model/backends/cpu_kernels/): each small op equal to the PyTorch arithmetic it replaces (HF's RMSNorm,
rotate_half RoPE, the K/V scatter, SiLU-and-multiply) on random inputs; the engine's logprobs equal HF's on all
three paths, in every family; the layers in a thread team of two equal them in a team of one, bit for bit; a
decode step runs far fewer PyTorch ops; and the path is picked once, when the engine is built."""
import threading
import time
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.model import backends
from minivlm.model.attention import write_kv
from minivlm.model.backends.cpu_kernels import decode_layer, decode_ops, gemv
from minivlm.model.rope import apply_rope
from tests.conftest import FAMILIES
from tests.test_parity import check_against_hf, requests

pytestmark = pytest.mark.skipif(decode_ops.KERNELS.get() is None or decode_layer.KERNELS.get() is None,
                                reason=f"not built here: {decode_ops.KERNELS.error or decode_layer.KERNELS.error}")


def hf_rms_norm(x, weight, eps):  # transformers' Qwen2RMSNorm.forward in fp32
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("rows,n", [(1, 768), (3, 37), (40, 128)])  # 40 rows: the multi-threaded loop
def test_rms_norm_with_and_without_the_residual_add(rows, n):
    g = torch.Generator().manual_seed(rows * n)
    x, delta, w = torch.randn(rows, n, generator=g), torch.randn(rows, n, generator=g), torch.randn(n, generator=g)
    assert torch.allclose(decode_ops.rms_norm(x.clone(), w, 1e-6), hf_rms_norm(x, w, 1e-6), atol=1e-5)
    residual = x.clone()
    out = decode_ops.rms_norm(residual, w, 1e-6, delta=delta)
    assert torch.equal(residual, x + delta)  # the residual stream is updated in place
    assert torch.allclose(out, hf_rms_norm(x + delta, w, 1e-6), atol=1e-5)


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("rows,heads,kv_heads,d", [(1, 12, 2, 64), (5, 4, 2, 16), (33, 6, 3, 32)])
def test_rope_store_equals_rope_then_scatter(qk_norm, rows, heads, kv_heads, d):
    g = torch.Generator().manual_seed(rows + heads + d)
    qkv = torch.randn(rows, heads + 2 * kv_heads, d, generator=g)
    angles = torch.rand(rows, d // 2, generator=g) * 50
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    q_w, k_w = (torch.randn(d, generator=g), torch.randn(d, generator=g)) if qk_norm else (None, None)
    blocks, block_size = 16, 4
    slots = torch.randperm(blocks * block_size, generator=g)[:rows]
    k_cache, v_cache = (torch.zeros(blocks, block_size, kv_heads, d) for _ in range(2))

    want = qkv.clone()
    if qk_norm:
        want[:, :heads] = hf_rms_norm(want[:, :heads], q_w, 1e-6)
        want[:, heads:heads + kv_heads] = hf_rms_norm(want[:, heads:heads + kv_heads], k_w, 1e-6)
    want[:, :heads + kv_heads] = apply_rope(want[:, :heads + kv_heads], cos[:, None], sin[:, None])
    k_want, v_want = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    write_kv(k_want, v_want, want[:, heads:heads + kv_heads], want[:, heads + kv_heads:], slots)

    decode_ops.rope_store(qkv, cos, sin, heads, k_cache, v_cache, slots, q_w, k_w, 1e-6)
    assert torch.allclose(qkv, want, atol=2e-5)
    assert torch.allclose(k_cache, k_want, atol=2e-5) and torch.equal(v_cache, v_want)
    untouched = torch.ones(blocks * block_size, dtype=torch.bool)
    untouched[slots] = False
    assert not k_cache.view(-1, kv_heads, d)[untouched].any()  # nothing written outside the step's slots


@pytest.mark.parametrize("rows,n", [(1, 2560), (20, 96)])
def test_silu_mul(rows, n):
    gate_up = torch.randn(rows, 2 * n, generator=torch.Generator().manual_seed(n)) * 6
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.allclose(decode_ops.silu_mul(gate_up), F.silu(gate) * up, atol=1e-5)


MODES = {"decode_layer": {}, "decode_ops": {"MINIVLM_DECODE_LAYER": "0"}, "pytorch": {"MINIVLM_DECODE_OPS": "0"}}


def isolated_with(engine, monkeypatch, switches: dict, **overrides):
    """An engine on the same weights whose backend is picked with these MINIVLM_* switches (read once, there)."""
    for name in ("MINIVLM_DECODE_LAYER", "MINIVLM_DECODE_OPS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in switches.items():
        monkeypatch.setenv(name, value)
    return engine.isolated(**overrides)


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_equals_hf_on_every_path(family, checkpoints, engines, monkeypatch):
    """The same batch (images, text-only, multi-turn; four sequences, so decode steps fit decode_layer.c) through
    one C call a step, the fused small ops and PyTorch's: each within HF's tolerance, all the same tokens."""
    engine, reqs = engines[family], requests()[:4]
    params = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=1)
    tokens, layer_calls = {}, []
    real_run = decode_layer.run
    monkeypatch.setattr(decode_layer, "run", lambda *a: layer_calls.append(1) or real_run(*a))
    for mode, switches in MODES.items():
        layer_calls.clear()
        with isolated_with(engine, monkeypatch, switches) as picked:
            outs = picked.generate(reqs, params)
        assert bool(layer_calls) == (mode == "decode_layer"), mode  # decode steps in decode_layer.c exactly when on
        for request, out in zip(reqs, outs):
            check_against_hf(checkpoints[family], family, request, out)
        tokens[mode] = [o.token_ids for o in outs]
    assert tokens["decode_layer"] == tokens["decode_ops"] == tokens["pytorch"]


def test_a_large_decode_batch_in_one_c_call_equals_hf(checkpoints, engines, monkeypatch):
    """Thirteen sequences decode together (gemv.c's tiles of four rows and a remainder of one, paged attention
    over contexts of different lengths) in one C call a step: every sequence within HF's tolerance."""
    family = "qwen3_vl"
    engine, reqs = engines[family], (requests() * 3)[:13]
    assert len(reqs) <= gemv.MAX_ROWS
    rows = []
    real_run = decode_layer.run
    monkeypatch.setattr(decode_layer, "run",
                        lambda weights, x, *a: rows.append(x.shape[0]) or real_run(weights, x, *a))
    engine.reset_prefix_cache()
    outs = engine.generate(reqs, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=1))
    assert max(rows) == len(reqs)
    for request, out in zip(reqs, outs):
        check_against_hf(checkpoints[family], family, request, out)


BARRIERS = {"spin, then sleep": (), "always sleeps": ("SPIN_NS=1",), "OpenMP's": ("SPIN_NS=0",)}


@pytest.mark.parametrize("barrier", BARRIERS)
@pytest.mark.parametrize("mixed", [False, True])
def test_the_layers_in_a_team_of_two_equal_them_in_one_bit_for_bit(mixed, barrier):
    """decode_layer.c runs a step's layers in one thread team, waiting only after each matrix product; each output
    element is computed by one thread in a fixed order, so a team of two must give exactly a team of one's numbers.
    At the bench model's size (an op takes long enough for the threads to drift apart), an op that started before
    the one it reads had finished on the other thread (a barrier missing, or one that lets a thread through early)
    would not. Each barrier: team_barrier.c's as built, the same forced to sleep at once (its futex path), and
    OpenMP's (where there is no futex). A mixed step: the first four rows are one sequence's chunk, each token
    attending to the ones before it."""
    fn = decode_layer.kernel_variant(*BARRIERS[barrier])
    g = torch.Generator().manual_seed(0)
    hidden, heads, kv_heads, d, inter, rows, block_size, ctx = 768, 12, 2, 64, 2560, 16, 16, 40
    layers = []
    for _ in range(2):
        t = {name: torch.randn(*shape, generator=g) * 0.05 for name, shape in [
            ("input_norm", (hidden,)), ("post_norm", (hidden,)), ("q_norm", (d,)), ("k_norm", (d,)),
            ("qkv", ((heads + 2 * kv_heads) * d, hidden)), ("qkv_bias", ((heads + 2 * kv_heads) * d,)),
            ("o", (hidden, heads * d)), ("gate_up", (2 * inter, hidden)), ("down", (hidden, inter))]}
        layers.append((t, decode_layer.Layer(*[t[k].data_ptr() if k in t else None for k in (
            "input_norm", "post_norm", "q_norm", "k_norm", "qkv", "qkv_bias", "o", "o_bias", "gate_up", "down")],
            hidden, heads, kv_heads, d, inter, 1e-6, 1e-6, d ** -0.5)))
    final_norm = torch.nn.RMSNorm(hidden, eps=1e-5)
    final_norm.weight.data = torch.randn(hidden, generator=g)
    lm_head = torch.nn.Linear(hidden, 300)  # with a bias; a vocabulary that is no multiple of the tile
    last = torch.tensor([3, 4, 9, 15]) if mixed else torch.arange(rows)
    tables = torch.arange(rows * 3, dtype=torch.int64).view(rows, 3).flip(0).contiguous()  # blocks out of order
    lens = torch.full((rows,), ctx, dtype=torch.int64)
    seq_ends = torch.arange(1, rows + 1)
    if mixed:
        tables[:4], lens[:4], seq_ends = tables[0], torch.arange(ctx - 3, ctx + 1), torch.arange(4, rows + 1)
    slots = tables.gather(1, ((lens - 1) // block_size)[:, None])[:, 0] * block_size + (lens - 1) % block_size
    caches = [tuple(torch.randn(rows * 3, block_size, kv_heads, d, generator=g) for _ in range(2)) for _ in layers]
    angles = torch.rand(rows, d // 2, generator=g) * 40
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    x = torch.randn(rows, hidden, generator=g)
    weights = decode_layer.StepWeights.of([c for _, c in layers], final_norm)
    outs = []
    for threads in (1, 2, 2, 2, 2, 2, 2):
        step = decode_layer.DecodeStep(rows, slots, tables, lens, seq_ends, threads)
        kv = [(k.clone(), v.clone()) for k, v in caches]
        out = decode_layer.run(weights, x.clone(), cos, sin, kv, step, fn=fn)
        logits = decode_layer.run(weights, x.clone(), cos, sin, kv, step, lm_head, last, fn=fn)
        outs.append([out, logits] + [c for pair in kv for c in pair])
    assert not torch.equal(outs[0][0], x)
    assert torch.allclose(outs[0][1], lm_head(outs[0][0][last]), atol=1e-5)  # the logits of the rows asked for
    for got in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got, outs[0]))


def test_chunked_prefills_mixed_steps_in_one_c_call_equal_hf(checkpoints, monkeypatch):
    """Chunked prefill with an 8-token budget: steps that mix decodes with a chunk of a prompt (image tokens
    included) run as one C call a step, each chunk token a query over its own sequence up to itself; every
    sequence within HF's tolerance."""
    family = "qwen2_5_vl"
    kinds = []
    real_prepare = decode_layer.prepare

    def prepare(x, meta):
        step = real_prepare(x, meta)
        kinds.append((meta.is_prefill, step is not None))
        return step
    monkeypatch.setattr(decode_layer, "prepare", prepare)
    with Engine(EngineConfig(model=checkpoints[family], device="cpu", dtype="float32", num_blocks=128,
                             enable_chunked_prefill=True, max_num_batched_tokens=8)) as engine:
        reqs = requests()
        outs = engine.generate(reqs, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=1))
    assert (True, True) in kinds and (False, True) in kinds  # mixed (or chunk-only) steps and decodes in C
    for request, out in zip(reqs, outs):
        check_against_hf(checkpoints[family], family, request, out)


def test_a_decode_step_runs_far_fewer_ops(checkpoints, engines, monkeypatch):
    """PyTorch ops of one single-sequence decode step (the profiler's top-level events) on the three paths."""
    from torch.profiler import profile
    layers = len(engines["qwen2_5_vl"].model.decoder.layers)

    def ops_per_step(engine) -> int:  # step-through, so that the profiled step runs on this thread
        engine.pause()
        caller = threading.Thread(target=engine.generate, args=(Request(prompt="Count to ten."),
                                                                SamplingParams(max_tokens=4, ignore_eos=True)))
        caller.start()
        while not engine.has_unfinished():
            time.sleep(0.01)
        engine.step(), engine.step()  # the prefill and a first decode step
        with profile() as prof:
            engine.step()
        engine.resume()
        caller.join(timeout=60)
        return sum(1 for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::"))
    ops = {}
    for mode, switches in MODES.items():
        with isolated_with(engines["qwen2_5_vl"], monkeypatch, switches, num_blocks=64) as engine:
            ops[mode] = ops_per_step(engine)
    whole, fused, eager = ops["decode_layer"], ops["decode_ops"], ops["pytorch"]
    print(f"ops per decode step: {whole} (decode_layer), {fused} (decode_ops), {eager} (PyTorch)")
    assert eager - fused >= 10 * layers, (eager, fused)  # RoPE, norms, adds, the K/V scatter, SiLU: ~15 a layer
    assert fused - whole >= 4 * layers, (fused, whole)  # and the outputs, views and residual adds around them


def test_the_status_line_says_which_path_runs(engines, monkeypatch):
    """The status line, and the rows the chunked budget may give a step (runner.limits), agree in every state."""
    engine = engines["qwen3_vl"]
    assert engine.decode_backend.startswith(f"one C call a step for 1-{gemv.MAX_ROWS} sequences (decode_layer.c)")
    assert engine.decode_backend.key == "engine.decode_layer" and engine.decode_backend.fields["rows"] == 16
    assert engine.core.runner.limits.fast_rows == gemv.MAX_ROWS
    with isolated_with(engine, monkeypatch, MODES["decode_ops"], num_blocks=32) as picked:
        assert picked.decode_backend == "fused small ops (decode_ops.c); decode_layer.c off: MINIVLM_DECODE_LAYER=0"
        assert picked.core.runner.limits.fast_rows is None
    with isolated_with(engine, monkeypatch, MODES["pytorch"], num_blocks=32) as picked:
        assert picked.decode_backend == "PyTorch ops (decode_ops.c off: MINIVLM_DECODE_OPS=0)"
        assert picked.core.runner.limits.fast_rows is None
    bf16 = SimpleNamespace(device=torch.device("cpu"), dtype=torch.bfloat16, decoder=engine.model.decoder)
    other = backends.pick(bf16, engine.config, None)  # bf16's C step needs bf16 weights (tests/test_bf16_step.py)
    assert other.describe()["decode"] == "PyTorch ops (a bf16 engine's C step reads bf16 or int8 weights only)"
    assert other.describe()["attention"] == "SDPA over gathered blocks (in-place kernel: fp32 only)"
    assert other.limits.fast_rows is None


def test_enforce_eager_runs_pytorch_ops_only(engines, monkeypatch):
    """vLLM's switch, per engine: an isolated engine with enforce_eager=True beside the default one, the same
    weights, the same tokens; only the default one calls the C layers."""
    engine = engines["qwen2_vl"]
    calls = []
    for name in ("run", "prepare"):
        real = getattr(decode_layer, name)
        monkeypatch.setattr(decode_layer, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    params, req = SamplingParams(max_tokens=6, ignore_eos=True), Request(prompt="Count to ten.")
    with engine.isolated(enforce_eager=True, num_blocks=64) as eager:
        assert eager.decode_backend == "PyTorch ops (enforce_eager)"
        want = eager.generate(req, params).token_ids
        assert not calls
    engine.reset_prefix_cache()
    assert engine.generate(req, params).token_ids == want and "run" in calls
    with pytest.raises(ValueError, match="enforce_eager must be True or False"):
        EngineConfig(enforce_eager="yes")


def test_the_backend_is_picked_once_when_the_engine_is_built(engines, monkeypatch):
    """A switch changed after an engine was built changes nothing there (no step asks again); the next engine
    built picks by it."""
    engine = engines["qwen2_5_vl"]
    calls, real_run = [], decode_layer.run
    monkeypatch.setattr(decode_layer, "run", lambda *a: calls.append(1) or real_run(*a))
    params, req = SamplingParams(max_tokens=6, ignore_eos=True), Request(prompt="Count to ten.")
    monkeypatch.setenv("MINIVLM_DECODE_LAYER", "0")
    engine.reset_prefix_cache()
    first = engine.generate(req, params).token_ids
    assert calls and engine.decode_backend.startswith("one C call a step")
    calls.clear()
    with engine.isolated(num_blocks=64) as later:
        assert later.decode_backend.startswith("fused small ops") and later.generate(req, params).token_ids == first
    assert not calls
