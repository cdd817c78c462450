"""The CPU fp32 step chosen at load by timed decode steps (model/backends/calibrate.py): whichever of the C kernels,
PyTorch's ops with oneDNN linears and PyTorch's ops with plain nn.Linear (MKL) the timings favour runs, each gives
the C step's tokens, the status line shows the times, and the C step stays unless another beats it by the margin."""
import pytest
import torch

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.model.backends import calibrate
from minivlm.model.backends.cpu_kernels.linears import FastLinear
from panels.holder import status_line

REQUEST = Request(prompt="Describe a red circle.")
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=0)


def timings(c: float, onednn: float, mkl: float):
    """A timer that reports the given seconds for each candidate (MKL: PyTorch's ops while the linears run plain)."""
    def timer(backend, decoder, kv_caches, block_size):
        if type(backend).__name__ == "CpuKernels":
            return c
        plain = next(m for m in decoder.modules() if isinstance(m, FastLinear)).plain
        return mkl if plain else onednn
    return timer


@pytest.fixture(scope="module")
def reference():
    with Engine(EngineConfig(device="cpu", num_blocks=32, enforce_eager=True)) as e:
        return e.generate(REQUEST, PARAMS)


@pytest.mark.parametrize("times, chosen", [((1.0, 2.0, 3.0), "c"), ((1.0, 0.5, 0.9), "onednn"),
                                           ((1.0, 0.9, 0.5), "mkl"), ((1.0, 0.95, 0.9), "c")])
def test_the_calibrated_step_is_the_fastest_and_gives_the_same_tokens(monkeypatch, reference, times, chosen):
    monkeypatch.setattr(calibrate.choose, "__defaults__", (timings(*times),))
    monkeypatch.setattr(calibrate, "MIN_BYTES", 0)  # the tiny model, timed as a big one would be
    with Engine(EngineConfig(device="cpu", num_blocks=32)) as e:
        decode = e.decode_backend
        assert "calibrated at load" in e.calibration and f"C kernels {times[0] * 1e3:.2f} ms" in e.calibration
        assert ("decode_layer.c" in decode) == (chosen == "c")
        assert ("oneDNN linears)" in decode) == (chosen == "onednn")
        assert ("nn.Linear (MKL))" in decode) == (chosen == "mkl")
        assert e.calibration in status_line(e)
        linears = [m for m in e.model.decoder.modules() if isinstance(m, FastLinear)]
        assert all(m.plain for m in linears) == (chosen == "mkl")
        if chosen == "mkl":  # the packed copies are freed: the dense weights are the weights
            assert not any(m.weight.is_mkldnn or hasattr(m, "dense") for m in linears)
        out = e.generate(REQUEST, PARAMS)
    assert out.token_ids == reference.token_ids
    assert max(abs(a[t] - b[t]) for a, b, t in zip(out.logprobs, reference.logprobs, out.token_ids)) < 1e-4


def test_a_real_calibration_keeps_the_c_step_on_the_tiny_model(monkeypatch):
    """Timed for real: the tiny model's C step is several times faster than PyTorch's ops (a few of its ops
    against hundreds), far past the margin; untimed, as a small model is, it says why."""
    with Engine(EngineConfig(device="cpu", num_blocks=32)) as e:
        assert "decode_layer.c" in e.decode_backend and e.calibration == ""
    monkeypatch.setattr(calibrate, "MIN_BYTES", 0)
    with Engine(EngineConfig(device="cpu", num_blocks=32)) as e:
        assert "decode_layer.c" in e.decode_backend and "calibrated at load" in e.calibration


def test_calibration_is_skipped_when_asked(monkeypatch):
    monkeypatch.setenv(calibrate.SWITCH, "0")
    with Engine(EngineConfig(device="cpu", num_blocks=32)) as e:
        assert e.calibration == ""
    with Engine(EngineConfig(device="cpu", num_blocks=32, enforce_eager=True)) as e:
        assert "enforce_eager" in e.decode_backend
