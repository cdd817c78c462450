"""The int4 x Q8 C kernels (int4_weights.h; issue #57, int4 first): the product against the dequantized int4 weights
times the input rounded to int8 blocks as the kernel rounds it, on each of its paths (AVX-512 VNNI, AVX2, portable
C); the one-call int4 step on the tiny model against fp32 (greedy tokens and logprobs) and against PyTorch's int4
kernel layer by layer; the calibration keeping the faster of the two and refusing a C step whose logits drift."""
import ctypes

import pytest
import torch
from torch import nn

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.model.backends import calibrate
from minivlm.model.backends.cpu_kernels import decode_layer, gemv_int4
from minivlm.model.backends.quantized import Int4Linear
from tests.test_quantization import INT4_BOUND, PICTURES

needs_kernels = pytest.mark.skipif(gemv_int4.KERNELS.get() is None or decode_layer.KERNELS_INT4.get() is None,
                                   reason="the int4 kernels did not build")
VARIANTS = ((), ("I4_NO_VNNI",), ("I4_PORTABLE",))  # the CPU's best path, then the ones below it


def product(lib, x, layer, bias):
    y = torch.empty(x.shape[0], layer.out_features)
    lib.gemv_int4(x.data_ptr(), layer.c_nibbles.data_ptr(), layer.c_sm.data_ptr(), layer.group,
                  bias.data_ptr() if bias is not None else None, y.data_ptr(), x.shape[0], layer.out_features,
                  x.shape[1], 2)
    return y


@needs_kernels
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v[0] if v else "native")
@pytest.mark.parametrize("rows, in_features, out_features", [(1, 128, 37), (3, 192, 8), (16, 1024, 21),
                                                              (2, 4096, 5), (5, 576, 16)])
def test_the_int4_kernel_equals_the_dequantized_weights_times_the_q8_input(variant, rows, in_features, out_features):
    """Exact integer sums a block: the float reference differs by summation order only. Groups of 128 and 64 (576:
    SmolVLM2-256M's width); weight rows that fill the tile and ones left over; 1 to 16 input rows."""
    lib = gemv_int4.KERNELS.variant(*[f"{d}=1" for d in variant]) if variant else gemv_int4.KERNELS.get()
    torch.manual_seed(rows * in_features)
    linear = nn.Linear(in_features, out_features, bias=True)
    layer = Int4Linear(linear, torch.float32)
    assert layer.c_nibbles is not None and layer.group in (64, 128)
    w = layer.c_dequantized().double()
    assert torch.allclose(w.float(), layer.dequantized(), atol=2e-3)  # PyTorch's kernel's weights (bf16 out)
    x = torch.randn(rows, in_features) * torch.linspace(0.1, 8, in_features)  # blocks of different ranges
    xq = gemv_int4.q8_round(x)
    want = xq @ w.t() + linear.bias.double()
    # a group's sum is s * sum(q x) + min * sum(x) in fp32 (llama.cpp's Q4_1 form), two terms that largely cancel:
    # the error is fp32 rounding of their size, sum |w| |x| at most (exact integer sums inside a block)
    bound = 1e-6 * (xq.abs() @ (w.abs() + 16 * layer.c_sm[..., 0].double().repeat_interleave(layer.group, 1)).t())
    got = product(lib, x, layer, linear.bias.detach())
    assert ((got.double() - want).abs() <= bound + 1e-6).all(), ((got.double() - want).abs() / bound).max()
    assert torch.allclose(product(lib, x, layer, None), got - linear.bias.detach(), atol=1e-5)


def test_a_width_the_kernels_do_not_take_keeps_no_copy():
    """Widths that are not a multiple of 64 (groups of 32, or padded columns): PyTorch's kernel only."""
    for width in (96, 100):
        assert Int4Linear(nn.Linear(width, 16), torch.float32).c_nibbles is None


def generate(reqs, params, **kw):
    with Engine(EngineConfig(device="cpu", dtype="float32", num_blocks=64, **kw)) as e:
        return e.generate(reqs, params), e.core.runner.backend.one_call, e.decode_backend


@needs_kernels
def test_the_int4_c_step_stays_within_the_bound_of_fp32_and_near_pytorchs_kernel(monkeypatch):
    """The tiny model with quantization="int4" runs the one-call C step (a small model is not timed: it passed the
    logit check) and its chosen tokens' logprobs stay within INT4_BOUND of fp32's, greedy tokens mostly equal; the
    same layers on PyTorch's int4 kernel (the C step refused) agree with it as closely."""
    from tools.quantization_matrix import LOGPROBS, closeness
    reqs = [Request(prompt=q, images=[p]) for q, p in zip(("Describe the picture.", "What color is the shape?",
                                                             "How many shapes are there?"), PICTURES)]
    params = SamplingParams(max_tokens=16, ignore_eos=True, logprobs=LOGPROBS)
    ref, _, _ = generate(reqs, params)
    c, one_call, said = generate(reqs, params, quantization="int4")
    assert one_call and "decode_layer.c" in said
    monkeypatch.setattr(calibrate, "ROWS_TOLERANCE", -1.0)  # the C step refused: PyTorch's kernel layer by layer
    monkeypatch.setattr(calibrate, "ROWS_FACTOR", 0.0)
    theirs, one_call, said = generate(reqs, params, quantization="int4")
    assert not one_call and "PyTorch's int4 kernel" in said
    for name, out in (("C step", c), ("PyTorch's int4 kernel", theirs)):
        worst, same, total = closeness(out, ref)
        print(f"int4 ({name}) vs fp32: max |Δ logprob| {worst:.4f}, greedy agreement {same}/{total}")
        assert worst <= INT4_BOUND and same / total >= 0.9, (name, worst, same, total)


@needs_kernels
@pytest.mark.parametrize("c_ms, torch_ms", [(1.0, 2.0), (2.0, 1.0)])
def test_the_calibration_keeps_the_faster_of_the_c_step_and_pytorchs_int4_kernel(monkeypatch, c_ms, torch_ms):
    """Timed (MIN_BYTES 0): the faster runs and says the times; where PyTorch's kernel is kept, the C copy of the
    weights is freed; either generates."""
    def timer(backend, decoder, kv_caches, block_size):
        return (c_ms if backend.one_call else torch_ms) / 1e3
    monkeypatch.setattr(calibrate.choose_int4, "__defaults__", (timer,))
    monkeypatch.setattr(calibrate, "MIN_BYTES", 0)
    with Engine(EngineConfig(device="cpu", quantization="int4", num_blocks=16)) as e:
        layers = [m for m in e.model.decoder.modules() if isinstance(m, Int4Linear)]
        assert e.core.runner.backend.one_call == (c_ms < torch_ms)
        assert all((m.c_nibbles is not None) == (c_ms < torch_ms) for m in layers)
        assert f"int4 weights {c_ms:.2f} ms" in e.calibration and f"int4 kernel {torch_ms:.2f} ms" in e.calibration
        out = e.generate(Request(prompt="What color is the shape?", images=[PICTURES[1]]),
                         SamplingParams(max_tokens=6, ignore_eos=True))
        assert len(out.token_ids) == 6


@needs_kernels
def test_a_c_step_whose_logits_drift_is_not_kept(monkeypatch):
    """Past the bound (made zero here) the C step is not timed, whatever its speed, and the status says why."""
    monkeypatch.setattr(calibrate.choose_int4, "__defaults__", (lambda b, *a: 1e-3 if b.one_call else 9e-3,))
    monkeypatch.setattr(calibrate, "MIN_BYTES", 0)
    monkeypatch.setattr(calibrate, "ROWS_TOLERANCE", 0.0)
    monkeypatch.setattr(calibrate, "ROWS_FACTOR", 0.0)
    with Engine(EngineConfig(device="cpu", quantization="int4", num_blocks=16)) as e:
        assert not e.core.runner.backend.one_call
        assert "int4 weights not kept: |Δ logprob|" in e.calibration


def test_the_int4_path_is_named():
    assert gemv_int4.path() in (*gemv_int4.PATHS.values(), None)
    if gemv_int4.KERNELS.get() is not None:
        which = ctypes.c_int(-1)
        gemv_int4.KERNELS.get().int4_path(ctypes.byref(which))
        assert which.value in gemv_int4.PATHS
