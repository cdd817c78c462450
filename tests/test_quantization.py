"""Weight-only quantization (#44 item 1): PyTorch's int8 and int4 kernels against the dequantized weights they stand
for; the int8 engine's logprobs against the fp32 engine's within a stated bound, greedy tokens mostly the same; the
memory report's weight bytes equal the tensors' own sizes; a device without the kernels is refused."""
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image
from torch import nn

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.model.backends.quantized import GROUP, Int4Linear, Int8Linear, padded_layers, quantize
from panels.holder import EXAMPLES_DIR

PICTURES = [Image.open(os.path.join(EXAMPLES_DIR, n)) for n in ("three_shapes.png", "red_circle.png",
                                                                 "two_shapes.png")]
INT8_BOUND = 0.08  # max |Δ logprob| of the chosen tokens, int8 vs fp32 engine, tiny model (measured 0.050 with int8
# inputs on AVX2, 0.043 with fp32 inputs; 48/48 tokens equal; on AVX-512, issue #52: 0.060, bf16 engine 0.070)
INT4_BOUND = 0.3  # the same for int4 (issue #52, AVX-512: 0.157, bf16 engine 0.217; 48/48 tokens equal)
DRIFT_AT_BOUND = 0.032  # the same measure for the tiny model's unquantized bf16 engine (issue #52): how far rounding
# alone moves it (tests/test_quantization_matrix.py scales the bounds for checkpoints that move more)


def test_int8_and_int4_matmuls_equal_the_dequantized_weights():
    torch.manual_seed(0)
    linear = nn.Linear(2 * GROUP, 96, bias=True)
    x = torch.randn(5, 2 * GROUP)
    q8 = Int8Linear(linear, torch.float32)
    ref8 = x.bfloat16().float() @ q8.dequantized().t() + linear.bias  # the kernel takes bf16 inputs
    assert q8(x).dtype == torch.float32 and torch.allclose(q8(x), ref8, atol=1e-2, rtol=4e-3)  # bf16 output rounding
    step = q8.scales.float()[:, None]  # at most half a step (bf16's scale rounding: a 127th can spill over the clamp)
    assert ((q8.dequantized() - linear.weight).abs() <= step / 2 * 1.01 + 1e-7).all()
    q4 = Int4Linear(linear, torch.bfloat16)
    xb = x.to(torch.bfloat16)
    ref4 = xb.float() @ q4.dequantized().t() + linear.bias
    assert torch.allclose(q4(xb).float(), ref4, atol=0.05, rtol=0.02)
    step = (linear.weight.reshape(96, 2, GROUP).amax(-1) - linear.weight.reshape(96, 2, GROUP).amin(-1)) / 15
    err = (q4.dequantized() - linear.weight).abs().reshape(96, 2, GROUP).amax(-1)
    assert (err <= step / 2 + 0.01).all()  # half a step, plus bf16's rounding of scales and zeros
    assert torch.allclose(Int4Linear(linear, torch.float32)(x), ref4, atol=0.05, rtol=0.02)  # fp32 in and out


def test_int8_engine_stays_close_to_fp32_and_counts_its_bytes():
    reqs = [Request(prompt=q, images=[p]) for q, p in zip(("Describe the picture.", "What color is the shape?",
                                                             "How many shapes are there?"), PICTURES)]
    params = SamplingParams(max_tokens=16, ignore_eos=True, logprobs=0)
    with Engine(EngineConfig(device="cpu")) as fp32:
        ref = fp32.generate(reqs, params)
        fp32_bytes = fp32.memory_report().weights_bytes
        decoder = fp32.core.model.decoder
        shapes = [m.weight.shape for layer in decoder.layers for m in layer.modules() if isinstance(m, nn.Linear)]
        vocab, hidden = decoder.lm_head.weight.shape
        tied = decoder.lm_head.weight is decoder.embed_tokens.weight
    with Engine(EngineConfig(device="cpu", dtype="float32", quantization="int8")) as e:
        outs = e.generate(reqs, params)
        report = e.memory_report()
        assert "int8" in e.linear_backend and isinstance(e.core.model.decoder.lm_head, Int8Linear)
    # each decoder linear: fp32 weights (4 bytes) become int8 (1 byte) plus a scale per output channel, in bf16 for
    # PyTorch's kernel and in fp32 for gemv_int8.c; the lm_head too, but a tied one's fp32 rows stay the embeddings'
    lm_head = vocab * hidden + vocab * 6 - (0 if tied else vocab * hidden * 4)
    assert report.weights_bytes == fp32_bytes - sum(o * i * 4 - o * i - o * 2 - o * 4 for o, i in shapes) + lm_head
    assert report.weights_bytes < fp32_bytes
    same = worst = 0
    total = 0
    for o, r in zip(outs, ref):
        for j, (a, b) in enumerate(zip(o.token_ids, r.token_ids)):
            total += 1
            same += a == b
            if o.token_ids[:j] == r.token_ids[:j]:  # the same prefix: the same position to compare
                worst = max(worst, abs(o.logprobs[j][a] - r.logprobs[j][a]) if a == b else 0)
    print(f"int8 vs fp32: max |Δ logprob| {worst:.4f}, greedy agreement {same}/{total}")
    assert worst <= INT8_BOUND and same / total >= 0.9, (worst, same, total)


# width -> int4 group: 8-136 are widths whose rows PyTorch's int8 kernel read past or faulted on (issue #52: K not a
# multiple of 16), padded to a multiple of 32 for int4 (56 -> 64, 100 -> 128); 576: SmolVLM2-256M's hidden, a multiple
# of 64 but not of 128
ODD_WIDTHS = {8: 32, 24: 32, 56: 64, 72: 32, 88: 32, 100: GROUP, 120: GROUP, 136: 32, 576: 64}


def check_odd_widths_and_addresses():
    """Every width, 1 to 17 rows, fp32 and bf16 inputs, one starting 6 bytes past an aligned address: each layer's
    output is the product with the weights it stands for (run by the test below in a subprocess)."""
    torch.manual_seed(0)
    for k in ODD_WIDTHS:
        linear = nn.Linear(k, 40)  # 40 outputs: int4 pads them to 48
        q8, q4 = Int8Linear(linear, torch.float32), Int4Linear(linear, torch.float32)
        assert q8.qweight.shape == (40, -(-k // 16) * 16) and q4.group == ODD_WIDTHS[k]
        for rows in (1, 5, 17):
            x = torch.randn(rows * k + 3).bfloat16()[3:].view(rows, k)  # contiguous, 6 bytes past an aligned start
            for q in (q8, q4):
                want = x.float() @ q.dequantized().t() + linear.bias
                for inp in (x, x.float()):
                    got = q(inp)
                    assert got.shape == (rows, 40)  # (dtype: the bias's, fp32 here, as PyTorch promotes)
                    assert torch.allclose(got.float(), want, atol=0.05, rtol=0.02), (type(q).__name__, k, rows)


def test_any_width_and_any_input_address_gives_the_product_it_stands_for():
    """Issue #52: `_weight_int8pack_mm` assumes K a multiple of 16 and rows starting 32 bytes aligned; the layers pad
    their weights and align their inputs so that no width or address reaches it otherwise (in a subprocess: before,
    these ended the process instead of failing)."""
    code = "from tests.test_quantization import check_odd_widths_and_addresses as c; c()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    linear = nn.Linear(100, 438)  # Qwen3.5's fused in_proj at test size has 438 outputs
    q4 = Int4Linear(linear, torch.float32)
    assert (q4.in_features, q4.out_features, q4.group, tuple(q4.scales_zeros.shape)) == (100, 438, GROUP, (1, 448, 2))
    step = (linear.weight.amax(1) - linear.weight.amin(1))[:, None] / 15  # the padded columns repeat the last one:
    assert ((q4.dequantized() - linear.weight).abs() <= step / 2 + 0.01).all()  # the group's range is the real one's


def test_a_layer_that_cannot_be_quantized_is_refused_by_name():
    decoder = nn.Module()
    decoder.layers = nn.ModuleList([nn.Module()])
    decoder.layers[0].mlp = nn.Module()
    decoder.layers[0].mlp.down_proj = nn.Linear(0, 16)  # no input channels: no scale to take
    refusal = r"quantization='int8': layer layers\.0\.mlp\.down_proj \(0 inputs, 16 outputs\) cannot be quantized"
    with pytest.raises(ValueError, match=refusal):
        quantize(decoder, "int8", "cpu", torch.float32)
    decoder.layers[0].mlp.down_proj = nn.Linear(24, 16)
    assert quantize(decoder, "int8", "cpu", torch.float32) == 1
    assert padded_layers(decoder) == {"layers.0.mlp.down_proj": (32, 16)}


def test_int4_engine_stays_within_its_bound_of_fp32():
    """INT4_BOUND's measure (the int8 test's): int4 layers, int8 lm_head, against the fp32 engine's chosen tokens."""
    from tools.quantization_matrix import LOGPROBS, closeness
    reqs = [Request(prompt=q, images=[p]) for q, p in zip(("Describe the picture.", "What color is the shape?",
                                                             "How many shapes are there?"), PICTURES)]
    params = SamplingParams(max_tokens=16, ignore_eos=True, logprobs=LOGPROBS)
    with Engine(EngineConfig(device="cpu", dtype="float32")) as fp32:
        ref = fp32.generate(reqs, params)
    with Engine(EngineConfig(device="cpu", dtype="float32", quantization="int4")) as e:
        assert isinstance(e.model.decoder.layers[0].mlp.down_proj, Int4Linear)
        worst, same, total = closeness(e.generate(reqs, params), ref)
    print(f"int4 vs fp32: max |Δ logprob| {worst:.4f}, greedy agreement {same}/{total}")
    assert worst <= INT4_BOUND and same / total >= 0.9, (worst, same, total)


@pytest.mark.parametrize("case", ["tiny", "qwen3_5"])
def test_a_dequantized_checkpoint_holds_exactly_the_weights_the_kernels_multiply_by(case, tmp_path):
    """tools/dequantized_checkpoint.py, the matrix's truth for the serving path: loaded as a plain checkpoint, every
    quantized layer's weight is its dequantized one (through fused q/k/v, gate/up and Qwen3.5's in_proj), the
    lm_head its int8 one (the tiny checkpoint's, tied, untied from the embeddings), every other tensor the original."""
    from minivlm.loader import LoadedModel
    from tools.dequantized_checkpoint import quantized_weights, write_dequantized
    from tools.quantization_matrix import make_checkpoint

    def weights(model: LoadedModel) -> dict:  # oneDNN's prepacked weights read back dense (a reorder: exact)
        return {n: p.to_dense() if p.layout == torch._mkldnn else p
                for n, p in model.decoder.named_parameters(remove_duplicate=False)}
    path = make_checkpoint(case, str(tmp_path / "ckpt"))
    original = weights(LoadedModel(EngineConfig(model=path, device="cpu", dtype="float32")))
    assert torch.equal(original["lm_head.weight"], original["embed_tokens.weight"]) == (case == "tiny")  # tied
    for method in ("int8", "int4"):
        quantized = LoadedModel(EngineConfig(model=path, device="cpu", dtype="float32", quantization=method))
        want = {**original, **quantized_weights(quantized.decoder)}
        plain = LoadedModel(EngineConfig(model=write_dequantized(path, quantized.decoder, str(tmp_path / method)),
                                         device="cpu", dtype="float32"))
        got = weights(plain)
        assert got.keys() == want.keys() and "layers.0.mlp.down_proj.weight" in quantized_weights(quantized.decoder)
        assert all(torch.equal(got[n], want[n]) for n in want), [n for n in want if not torch.equal(got[n], want[n])]
        assert not torch.equal(got["lm_head.weight"], got["embed_tokens.weight"])  # int8's lm_head, its own


def test_quantization_is_refused_where_pytorchs_kernels_do_not_run():
    with pytest.raises(ValueError, match="runs on the CPU"):
        quantize(nn.Module(), "int8", "cuda", torch.bfloat16)
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="fp8")


def test_auto_dtype_on_the_cpu_follows_the_checkpoints_saved_dtype():
    """dtype="auto" on the CPU (issue #57), as transformers and vLLM: the config's saved dtype (bf16 -> bf16, fp32 ->
    fp32; `torch_dtype` in older configs, the text config's where the outer has none), else the weights'; fp16 runs
    as bf16 (no fp16 kernels here); quantized weights run in fp32. Each choice says why."""
    from types import SimpleNamespace

    from minivlm.cpu_dtype import pick_cpu_dtype, saved_dtype
    cfg = SimpleNamespace(hidden_size=64)
    assert saved_dtype(SimpleNamespace(dtype=torch.bfloat16)) == torch.bfloat16
    assert saved_dtype(SimpleNamespace(torch_dtype="float32")) == torch.float32
    assert saved_dtype(SimpleNamespace(dtype=None, text_config=SimpleNamespace(dtype="bfloat16"))) == torch.bfloat16
    assert saved_dtype(SimpleNamespace(), {"ids": torch.zeros(2, dtype=torch.long),
                                           "w": torch.zeros(2, dtype=torch.float16)}) == torch.float16
    assert saved_dtype(SimpleNamespace(), {}) is None
    for saved, want, key in [(torch.bfloat16, torch.bfloat16, "engine.dtype_checkpoint"),
                             (torch.float32, torch.float32, "engine.dtype_checkpoint"),
                             (torch.float16, torch.bfloat16, "engine.dtype_checkpoint_fp16"),
                             (torch.float64, torch.float32, "engine.dtype_checkpoint_other"),
                             (None, torch.float32, "engine.dtype_unsaved")]:
        dtype, why = pick_cpu_dtype(cfg, None, saved)
        assert (dtype, why.key) == (want, key), saved
    assert pick_cpu_dtype(cfg, None, torch.bfloat16)[1] == "auto: the checkpoint's saved dtype, bfloat16"
    assert pick_cpu_dtype(cfg, "int4", torch.bfloat16)[0] == torch.float32


def test_an_auto_engine_runs_a_bf16_checkpoint_in_bf16(tmp_path):
    """The loader passes the saved dtype: the tiny model saved in bf16 loads as a bf16 engine under dtype="auto"."""
    import json
    import shutil
    src = "assets/tiny-qwen-vl"
    dst = tmp_path / "tiny-bf16"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    cfg.get("text_config", {})["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(cfg))
    with Engine(EngineConfig(model=str(dst), device="cpu", num_blocks=16)) as e:
        assert e.model.dtype == torch.bfloat16 and e.dtype_reason.key == "engine.dtype_checkpoint"
        assert e.generate(Request(prompt="What color is the shape?", images=[PICTURES[0]]),
                          SamplingParams(max_tokens=2)).token_ids


def test_an_auto_int8_engine_runs_the_fused_c_ops_in_fp32_and_says_why():
    with Engine(EngineConfig(device="cpu", quantization="int8", num_blocks=16)) as e:
        assert e.model.dtype == torch.float32 and e.dtype_reason.key == "engine.dtype_quantized"
        assert e.decode_backend.startswith(("one C call", "fused small ops")) and "in-place paged decode" in e.attention_backend
        assert e.generate(Request(prompt="Describe the picture.", images=[PICTURES[0]]),
                          SamplingParams(max_tokens=4)).token_ids
    with Engine(EngineConfig(device="cpu", num_blocks=16)) as e:  # the tiny model: fp32 wherever it runs
        assert e.model.dtype == torch.float32 and e.dtype_reason.key == "engine.dtype_checkpoint"


@pytest.mark.parametrize("rows, in_features", [(1, 2 * GROUP), (3, 100), (16, 777), (5, 8), (4, 96), (16, 1024)])
def test_gemv_int8_equals_the_dequantized_product(rows, in_features):
    """gemv_int8.c (decode rows of an int8 layer): the product with the dequantized weights, for widths that fill its
    vectors and ones that leave a tail, one row to sixteen; where the build takes int8 inputs (AVX2, a width that is a
    multiple of 32) the input is the one quantized in blocks of 32 (exact integer sums: the same bound)."""
    from minivlm.model.backends.cpu_kernels import gemv_int8
    if gemv_int8.KERNELS.get() is None:
        pytest.skip(f"gemv_int8.c did not build: {gemv_int8.KERNELS.error}")
    torch.manual_seed(rows)
    linear = nn.Linear(in_features, 37, bias=True)
    q8 = Int8Linear(linear, torch.float32)
    x = torch.randn(rows, in_features)
    want = (gemv_int8.q8_reference(x) @ q8.dequantized().double().t() + linear.bias.double()).float()
    q = q8.qweight[:, :in_features].contiguous()  # the kernel takes any width: the layer's own is padded to 16
    got = gemv_int8.linear(x, q, q8.scales_f32, linear.bias)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    q8.small_rows = 16  # the layer sends decode rows there once the calibration chose it, zero-padded as its weight
    padded = torch.nn.functional.pad(x, (0, q8.pad))
    want = (gemv_int8.q8_reference(padded) @ (q8.qweight.double() * q8.scales.double()[:, None]).t()
            + linear.bias.double()).float()
    assert torch.allclose(q8(x), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gemv_ms, torch_ms, rows", [(1.0, 2.0, 16), (2.0, 1.0, 0)])
def test_an_int8_engine_times_both_kernels_at_load_and_keeps_the_faster(monkeypatch, gemv_ms, torch_ms, rows):
    """The C step over int8 weights (one call, decode_layer_int8.c) against the fused ops layer by layer around
    PyTorch's int8 kernel: the faster runs, and either gives the tokens the other does."""
    from minivlm.model.backends import calibrate
    from minivlm.model.backends.cpu_kernels import gemv_int8
    if gemv_int8.KERNELS.get() is None:
        pytest.skip("gemv_int8.c did not build")

    def timer(backend, decoder, kv_caches, block_size):
        return (gemv_ms if backend.one_call else torch_ms) / 1e3
    monkeypatch.setattr(calibrate.choose_int8, "__defaults__", (timer,))
    monkeypatch.setattr(calibrate, "MIN_BYTES", 0)  # the tiny model is timed too
    request = Request(prompt="Describe the picture.", images=[PICTURES[0]])
    with Engine(EngineConfig(device="cpu", quantization="int8", num_blocks=16)) as e:
        layers = [m for m in e.model.decoder.modules() if isinstance(m, Int8Linear)]
        assert layers and all(m.small_rows == rows for m in layers)
        assert e.core.runner.backend.one_call == (rows == 16)
        assert f"int8 weights {gemv_ms:.2f} ms" in e.calibration and f"int8 kernel {torch_ms:.2f} ms" in e.calibration
        assert len(e.generate(request, SamplingParams(max_tokens=12, ignore_eos=True)).token_ids) == 12


def test_the_one_call_int8_step_gives_the_layer_by_layer_tokens_and_logprobs(monkeypatch):
    """decode_layer_int8.c against the same int8 layers run one op at a time (gemv_int8.c, the same arithmetic)."""
    from minivlm.model.backends.cpu_kernels import decode_layer
    if decode_layer.KERNELS_INT8.get() is None:
        pytest.skip("decode_layer_int8.c did not build")
    reqs = [Request(prompt=q, images=[p]) for q, p in zip(("Describe the picture.", "How many shapes are there?"),
                                                          PICTURES)]
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=0)
    with Engine(EngineConfig(device="cpu", quantization="int8", num_blocks=32)) as e:
        assert e.core.runner.backend.one_call and "decode_layer.c" in e.decode_backend
        assert e.calibration == ""  # a small model is not timed: its C step, whatever else the machine runs
        one_call = e.generate(reqs, params)
    monkeypatch.setenv("MINIVLM_DECODE_LAYER", "0")
    with Engine(EngineConfig(device="cpu", quantization="int8", num_blocks=32)) as e:
        assert not e.core.runner.backend.one_call
        layered = e.generate(reqs, params)
    for a, b in zip(one_call, layered):
        assert a.token_ids == b.token_ids
        assert max(abs(x[t] - y[t]) for x, y, t in zip(a.logprobs, b.logprobs, a.token_ids)) < 1e-4
