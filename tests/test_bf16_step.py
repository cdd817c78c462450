"""A bf16 engine's decode step on the CPU (cpu_kernels/bf16_step.py, decode_layer_bf16.c): the bf16 weights and pool
read in place, fp32 arithmetic in between. Checked against the fp32 C step on the same numbers (the pool rows it
writes, bit for bit), against HF fp32 (closer to it than HF bf16's own decode), and for its place in the engine:
prompts run PyTorch's bf16 ops, the calibration keeps the faster path, the status line says which."""
import pytest
import torch

from minivlm import Engine, EngineConfig, SamplingParams
from minivlm.model.backends.cpu_kernels import decode_layer
from tests.hf_reference import teacher_forced_logprobs
from tests.test_parity import requests

pytestmark = pytest.mark.skipif(decode_layer.KERNELS_BF16.get() is None, reason="decode_layer_bf16.c did not build")


def random_layers(g, hidden, heads, kv_heads, d, inter, n=2):
    """n layers' tensors, every value a bf16 number (so the fp32 kernel can read the same weights)."""
    shapes = [("input_norm", (hidden,)), ("post_norm", (hidden,)), ("q_norm", (d,)), ("k_norm", (d,)),
              ("qkv", ((heads + 2 * kv_heads) * d, hidden)), ("qkv_bias", ((heads + 2 * kv_heads) * d,)),
              ("o", (hidden, heads * d)), ("gate_up", (2 * inter, hidden)), ("down", (hidden, inter))]
    return [{k: (torch.randn(*s, generator=g) * (1.0 if "norm" in k else 0.05)).bfloat16() for k, s in shapes}
            for _ in range(n)]


MATRICES = ("qkv", "o", "gate_up", "down")


def structs(layers, shape, kind):
    """decode_layer.Layer structs over the tensors: matrices as `kind` (bf16, fp32 copies, or int8 with a scale a
    row: the bf16 values rounded to 127 steps of the row's largest), vectors fp32; and the tensors they point into."""
    keep, out = [], []
    for t in layers:
        scales = {}

        def ptr(k):
            v = t[k] if k in MATRICES and kind == "bf16" else t[k].float()
            if k in MATRICES and kind == "int8":
                scales[k] = v.abs().amax(1) / 127
                v = torch.round(v / scales[k][:, None]).to(torch.int8)
            keep.append(v)
            return v.data_ptr()
        ptrs = [ptr(k) if k in t else None for k in (
            "input_norm", "post_norm", "q_norm", "k_norm", "qkv", "qkv_bias", "o", "o_bias", "gate_up", "down")]
        keep.extend(scales.values())
        out.append(decode_layer.Layer(*ptrs, *shape, 1e-6, 1e-6, shape[3] ** -0.5,
                                      *[scales[k].data_ptr() if scales else None for k in MATRICES]))
    return out, keep


@pytest.mark.parametrize("weights", ["bf16", "int8"])
@pytest.mark.parametrize("rows", [1, 5])
def test_the_bf16_step_writes_the_fp32_steps_kv_rounded_and_stays_close_to_it(rows, weights):
    """The same layers (bf16 numbers; or int8 ones) through the step over a bf16 pool (decode_layers_bf16, or
    decode_layers_int8_bf16) and over the same pool in fp32 (decode_layers_f32, or decode_layers_int8): the first
    layer's new K/V rows are the fp32 pool's rounded to bf16 (round to nearest even, as torch's .to(bfloat16)), bit
    for bit; nothing else in the pool moves; the output differs only by what the rounded rows change downstream. A
    team of two gives a team of one's numbers exactly."""
    g = torch.Generator().manual_seed(0)
    hidden, heads, kv_heads, d, inter, block_size, ctx = 256, 4, 2, 64, 512, 16, 21
    layers = random_layers(g, hidden, heads, kv_heads, d, inter)
    shape = (hidden, heads, kv_heads, d, inter)
    tables = torch.arange(rows * 2, dtype=torch.int64).view(rows, 2).flip(0).contiguous()
    lens = torch.full((rows,), ctx, dtype=torch.int64)
    slots = tables.gather(1, ((lens - 1) // block_size)[:, None])[:, 0] * block_size + (lens - 1) % block_size
    pool16 = [tuple(torch.randn(rows * 2, block_size, kv_heads, d, generator=g).bfloat16() for _ in range(2))
              for _ in layers]
    angles = torch.rand(rows, d // 2, generator=g) * 40
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    x = torch.randn(rows, hidden, generator=g)
    norm = torch.nn.RMSNorm(hidden, eps=1e-5)
    results = {}
    for kind, threads in (("f32", 2), ("bf16", 1), ("bf16", 2)):  # the pool's dtype
        matrices = "f32" if kind == "f32" and weights == "bf16" else weights
        held, keep = structs(layers, shape, matrices)
        pool = [tuple(c.clone() if kind == "bf16" else c.float() for c in pair) for pair in pool16]
        step = decode_layer.DecodeStep(rows, slots, tables, lens, torch.arange(1, rows + 1), threads)
        out = decode_layer.run(decode_layer.StepWeights.of(held, norm, matrices), x.clone(), cos, sin, pool, step)
        results[kind, threads] = out, pool
    (out32, pool32), (out16, pool16_1), (out16_2, pool16_2) = results.values()
    assert torch.equal(out16, out16_2) and all(torch.equal(a, b) for p, q in zip(pool16_1, pool16_2)
                                               for a, b in zip(p, q))
    written = torch.zeros(rows * 2 * block_size, dtype=torch.bool)
    written[slots] = True
    for j in range(2):  # K, then V of the first layer
        flat16, flat32 = pool16_1[0][j].view(-1, kv_heads, d), pool32[0][j].view(-1, kv_heads, d)
        assert torch.equal(flat16[written], flat32[written].bfloat16())
        assert torch.equal(flat16[~written], pool16[0][j].view(-1, kv_heads, d)[~written])
    assert not torch.equal(out16, out32)  # the rounded rows do change what follows
    assert torch.allclose(out16, out32, rtol=0.02, atol=0.02)


def decode_rows_error(engine, path):
    """Largest |logprob - HF fp32's| over the reported tokens of the decode rows (the first token is the prompt's)."""
    reqs = requests()[:4]
    outs = engine.generate(reqs, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=5))
    worst = 0.0
    for request, out in zip(reqs, outs):
        ref = teacher_forced_logprobs(path, request, out.token_ids)
        worst = max([worst] + [abs(v - ref[i, t].item()) for i, lp in enumerate(out.logprobs) if i for t, v in
                               lp.items()])
    return worst, outs


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])  # a qkv bias; q/k norms
def test_a_bf16_engines_decode_is_closer_to_fp32_than_pytorchs_bf16_ops(family, checkpoints, monkeypatch):
    """The whole engine in bf16 on the CPU: decode steps in one C call each, prompts in PyTorch's bf16 ops (as HF);
    against HF fp32, its decode rows err less than the same engine's decode in PyTorch's bf16 ops (HF's arithmetic:
    tests/test_parity.py checks that one equals HF bf16's error)."""
    check_against_pytorchs_ops(checkpoints[family], family, monkeypatch, {}, 1.0)


def test_int8_weights_in_a_bf16_engine_decode_in_one_c_call_too(checkpoints, monkeypatch):
    """quantization="int8" with dtype="bfloat16": the int8 C step over the bf16 pool (its inputs quantized to int8
    blocks, as in an fp32 engine), within 1.25x the error of PyTorch's int8 kernel with bf16 inputs."""
    check_against_pytorchs_ops(checkpoints["qwen2_5_vl"], "qwen2_5_vl int8", monkeypatch, dict(quantization="int8"),
                               1.25)


def check_against_pytorchs_ops(path, label, monkeypatch, extra: dict, bound: float):
    """A bf16 engine (with `extra`): the C step runs its decode rows only, and their error against HF fp32 is below
    `bound` x that of the same engine on PyTorch's ops."""
    calls = []
    run = decode_layer.run
    monkeypatch.setattr(decode_layer, "run", lambda *a, **k: calls.append(a[5].rows) or run(*a, **k))
    config = EngineConfig(model=path, dtype="bfloat16", device="cpu", num_blocks=128, max_model_len=1024, **extra)
    with Engine(config) as engine:
        assert engine.decode_backend.key == "engine.decode_layer_bf16"
        assert engine.decode_backend.fields["weights"] == extra.get("quantization", "bf16")
        assert engine.attention_backend.key == "engine.attn_bf16_step"
        ours, outs = decode_rows_error(engine, path)
    assert calls and max(calls) <= 4 and sum(calls) == sum(len(o.token_ids) - 1 for o in outs)  # decode rows only
    monkeypatch.setenv("MINIVLM_DECODE_LAYER", "0")
    with Engine(config) as engine:
        assert engine.decode_backend.key == "engine.decode_torch"
        theirs, _ = decode_rows_error(engine, path)
    print(f"{label}: decode rows' max |Δ logprob| vs HF fp32: C step {ours:.4f}, PyTorch bf16 ops {theirs:.4f}")
    assert ours < bound * theirs


@pytest.mark.parametrize("c_ms, torch_ms, key", [(1.0, 2.0, "engine.decode_layer_bf16"),
                                                  (2.0, 1.0, "engine.decode_torch")])
def test_a_bf16_engine_times_both_steps_at_load_and_keeps_the_faster(monkeypatch, c_ms, torch_ms, key):
    """On a CPU with native bf16 (AMX) PyTorch's bf16 ops may beat the C step: the engine times both at load."""
    from minivlm.model.backends import calibrate
    from minivlm.model.backends.cpu_kernels.bf16_step import Bf16Step

    def timer(backend, decoder, kv_caches, block_size):
        return (c_ms if isinstance(backend, Bf16Step) else torch_ms) / 1e3
    monkeypatch.setattr(calibrate.choose_bf16, "__defaults__", (timer,))
    monkeypatch.setattr(calibrate, "MIN_BYTES", 0)  # the tiny model is timed too
    with Engine(EngineConfig(device="cpu", dtype="bfloat16", num_blocks=16)) as e:
        assert e.decode_backend.key == key
        assert f"bf16 weights {c_ms:.2f} ms" in e.calibration and f"bf16 ops {torch_ms:.2f} ms" in e.calibration
        assert len(e.generate(requests()[0], SamplingParams(max_tokens=6, ignore_eos=True)).token_ids) == 6


def test_enforce_eager_and_the_switch_run_pytorchs_bf16_ops(monkeypatch):
    with Engine(EngineConfig(device="cpu", dtype="bfloat16", num_blocks=16, enforce_eager=True)) as e:
        assert e.decode_backend == "PyTorch ops (enforce_eager)"
    monkeypatch.setenv("MINIVLM_DECODE_LAYER", "0")
    with Engine(EngineConfig(device="cpu", dtype="bfloat16", num_blocks=16)) as e:
        assert e.decode_backend == "PyTorch ops (MINIVLM_DECODE_LAYER=0)"


def test_kv_rows_round_to_nearest_even_as_torch_does():
    """A V row that is the bias alone (the V weights zero) is written as the bias rounded to bf16, bit for bit as
    torch rounds it: ties to even, up and down, negative ties, the largest finite fp32 (to infinity), infinities,
    subnormals; NaNs stay NaN (their bits differ between torch's own scalar and vector paths)."""
    g = torch.Generator().manual_seed(1)
    hidden, heads, kv_heads, d, inter, block_size = 64, 2, 1, 64, 128, 16
    t = random_layers(g, hidden, heads, kv_heads, d, inter, n=1)[0]
    t["qkv"][(heads + kv_heads) * d:] = 0  # the V rows: V = its bias exactly
    special = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.4028234e38, float("inf"), -float("inf"),
                            1e-40, -1e-41, float("nan"), 2 ** -126 * (1 + 2 ** -8), 255.5, 256.5, 1 + 2 ** -9])
    values = torch.cat([special, torch.randn(d - len(special), generator=g)])
    nan_bits = torch.tensor([0x7F800001, -0x00400000], dtype=torch.int32).view(torch.float32)  # a payload; -qNaN
    values[-2:] = nan_bits
    held, keep = structs([t], (hidden, heads, kv_heads, d, inter), "bf16")
    bias = torch.cat([t["qkv_bias"][:(heads + kv_heads) * d].float(), values])
    held[0].qkv_bias = bias.data_ptr()
    pool = [tuple(torch.zeros(2, block_size, kv_heads, d, dtype=torch.bfloat16) for _ in range(2))]
    step = decode_layer.DecodeStep(1, torch.tensor([5]), torch.tensor([[0, 1]]), torch.tensor([6]),
                                   torch.arange(1, 2), 1)
    cos, sin = torch.ones(1, d), torch.zeros(1, d)
    weights = decode_layer.StepWeights.of(held, torch.nn.RMSNorm(hidden, eps=1e-6), "bf16")
    decode_layer.run(weights, torch.randn(1, hidden, generator=g), cos, sin, pool, step)
    written = pool[0][1].view(-1, kv_heads, d)[5, 0]
    want, nan = values.bfloat16(), values.isnan()
    assert torch.equal(written[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert written[nan].isnan().all()
