"""The int8 layers' decode-row kernels (model/backends/int8_rows.py) and their calibration (calibrate.time_rows,
choose_int8, choose_int4; issue #57): fbgemm's dynamic int8 linear gives the dequantized product up to its
activation rounding, the calibration keeps the fastest kernel whose logits stay close to PyTorch's exact kernel's,
refuses one that does not, and an engine generates the same tokens on whichever it kept."""
import pytest
import torch
from PIL import Image
from torch import nn

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.model.backends import calibrate, int8_rows
from minivlm.model.backends.quantized import Int8Linear
from panels.holder import EXAMPLES_DIR

PICTURE = Image.open(f"{EXAMPLES_DIR}/red_circle.png").convert("RGB")
needs_fbgemm = pytest.mark.skipif(int8_rows.FBGEMM.available() is not None, reason=str(int8_rows.FBGEMM.available()))


@needs_fbgemm
@pytest.mark.parametrize("rows, in_features", [(1, 1024), (3, 100), (16, 64)])
def test_fbgemm_rows_give_the_dequantized_product(rows, in_features):
    """Its weights are the layer's own int8 numbers; only the activations are rounded (uint8, one scale a row)."""
    torch.manual_seed(rows)
    linear = nn.Linear(in_features, 48, bias=True)
    q8 = Int8Linear(linear, torch.float32)
    q8.small_rows, q8.rows_kernel = 16, int8_rows.FBGEMM
    int8_rows.FBGEMM.prepare(q8)
    x = torch.randn(rows, in_features)
    want = x.double() @ q8.dequantized().double().t() + linear.bias.double()
    got = q8(x)
    assert got.shape == (rows, 48)
    err = (got.double() - want).norm() / want.norm()
    assert err < 0.02, err  # 8-bit rows: ~0.5 % on Gaussian inputs
    int8_rows.FBGEMM.release(q8)
    assert q8.fbgemm_packed is None


def fake_timer(ms: dict):
    """A timer that says each candidate's time: the one call ("c"), else the int8 layers' rows kernel."""
    def timer(backend, decoder, kv_caches, block_size):
        if getattr(backend, "one_call", False):
            return ms["c"] / 1e3
        layer = next(m for m in decoder.modules() if isinstance(m, Int8Linear))
        return ms[layer.rows_kernel.name if layer.small_rows else "torch"] / 1e3
    return timer


@needs_fbgemm
@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_the_calibration_keeps_fbgemm_where_it_is_fastest_and_close(monkeypatch, quantization):
    """With fbgemm the fastest layer-by-layer rows (and the C step slower), an engine keeps it (int4: its int8
    lm_head), says so, and generates; ROWS_TOLERANCE raised so that the tiny model's logits pass."""
    from minivlm.model.backends.cpu_kernels import gemv_int8
    if gemv_int8.KERNELS.get() is None:
        pytest.skip("gemv_int8.c did not build")
    timer = fake_timer({"c": 9.0, "torch": 8.0, "gemv": 7.0, "fbgemm": 1.0})
    monkeypatch.setattr(calibrate.choose_int8, "__defaults__", (timer,))
    monkeypatch.setattr(calibrate.choose_int4, "__defaults__", (timer,))
    monkeypatch.setattr(calibrate, "MIN_BYTES", 0)
    monkeypatch.setattr(calibrate, "ROWS_TOLERANCE", 10.0)
    with Engine(EngineConfig(device="cpu", quantization=quantization, num_blocks=16)) as e:
        layers = [m for m in e.model.decoder.modules() if isinstance(m, Int8Linear)]
        assert layers and all(m.small_rows == 16 and m.rows_kernel is int8_rows.FBGEMM for m in layers)
        assert "fbgemm's dynamic int8 linear 1.00 ms" in e.calibration
        if quantization == "int8":
            assert not e.core.runner.backend.one_call and "fbgemm" in e.decode_backend
        else:
            assert "kept: fbgemm's dynamic int8 linear" in e.calibration
        out = e.generate(Request(prompt="What color is the shape?", images=[PICTURE]),
                         SamplingParams(max_tokens=6, ignore_eos=True))
        assert len(out.token_ids) == 6


@needs_fbgemm
def test_a_rows_kernel_whose_logits_drift_is_not_kept(monkeypatch):
    """A kernel past the bound (ROWS_TOLERANCE and ROWS_FACTOR x gemv_int8.c's error, both made tiny here) is not
    timed, whatever its speed, and the status says why; gemv_int8.c (the reference for the bound) stays a candidate,
    and its packed copies are freed."""
    from minivlm.model.backends.cpu_kernels import gemv_int8
    if gemv_int8.KERNELS.get() is None:
        pytest.skip("gemv_int8.c did not build")
    timer = fake_timer({"c": 9.0, "torch": 8.0, "gemv": 7.0, "fbgemm": 1.0})
    monkeypatch.setattr(calibrate.choose_int4, "__defaults__", (timer,))
    monkeypatch.setattr(calibrate, "MIN_BYTES", 0)
    monkeypatch.setattr(calibrate, "ROWS_TOLERANCE", 0.0)
    monkeypatch.setattr(calibrate, "ROWS_FACTOR", 0.0)
    with Engine(EngineConfig(device="cpu", quantization="int4", num_blocks=16)) as e:
        layers = [m for m in e.model.decoder.modules() if isinstance(m, Int8Linear)]
        assert all(m.rows_kernel is int8_rows.GEMV and m.small_rows == 16 for m in layers)
        assert "fbgemm's dynamic int8 linear not kept: |Δ logprob|" in e.calibration
        assert all(getattr(m, "fbgemm_packed", None) is None for m in layers)
