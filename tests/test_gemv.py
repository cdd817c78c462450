"""gemv.c, the CPU fp32 matrix product of decode batches: equal to PyTorch's F.linear on the same numbers (rows 1
to MAX_ROWS, so every tile shape and remainder, odd widths, bias or none, strided inputs), and used by the decoder exactly where it should
be (a few rows, the dense copies counted in memory_report)."""
import pytest
import torch
import torch.nn.functional as F

from minivlm import Engine, Request, SamplingParams
from minivlm.model.backends.cpu_kernels import gemv
from minivlm.model.backends.cpu_kernels.linears import ONEDNN, FastLinear

pytestmark = pytest.mark.skipif(not (ONEDNN and gemv.KERNELS.get() is not None),
                                reason=f"gemv.c not built here: {gemv.KERNELS.error}")


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 13, gemv.MAX_ROWS])
@pytest.mark.parametrize("out_features,in_features", [(1, 1), (37, 45), (896, 768), (64, 2560), (5, 33)])
def test_equals_f_linear(rows, out_features, in_features):
    g = torch.Generator().manual_seed(rows * 1000 + in_features)
    w = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g)
    x = torch.randn(rows, 2 * in_features, generator=g)[:, ::2]  # strided: the wrapper makes it contiguous
    for bias in (b, None):
        got = gemv.linear(x, w, bias)
        want = F.linear(x, w, bias)
        assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-5 * in_features ** 0.5)
    x3 = torch.randn(rows, 1, in_features, generator=g)  # [tokens, 1, in] keeps its leading axes
    assert torch.allclose(gemv.linear(x3, w, b), F.linear(x3, w, b), rtol=1e-5, atol=1e-4)


def test_the_8_wide_tile_equals_f_linear_on_any_cpu():
    """The kernel picks its tile from the CPU it is compiled for (4x6 of 16 floats with AVX-512, 4x3 of 8 without):
    the 8-wide one, built on its own, is checked here too, so an AVX-512 machine's run covers both."""
    fn = gemv.kernel_variant("GEMV_NO_512")
    g = torch.Generator().manual_seed(7)
    for rows, out_features, in_features in [(1, 37, 45), (5, 896, 768), (16, 64, 2560), (3, 5, 33), (13, 7, 17)]:
        w, b = torch.randn(out_features, in_features, generator=g), torch.randn(out_features, generator=g)
        x = torch.randn(rows, in_features, generator=g)
        assert torch.allclose(gemv.linear(x, w, b, fn), F.linear(x, w, b), rtol=1e-5, atol=1e-5 * in_features ** 0.5)


def test_the_decoder_uses_it_for_a_few_rows_only(checkpoints, monkeypatch):
    with Engine(model=checkpoints["qwen2_5_vl"], device="cpu", dtype="float32", num_blocks=64) as engine:
        layers = [m for m in engine.model.decoder.modules() if isinstance(m, FastLinear) and m.weight.is_mkldnn]
        assert layers and all(m.dense.shape == m.weight.shape for m in layers)
        copies = sum(m.dense.numel() * 4 for m in layers)
        assert engine.memory_report().weight_copies_bytes == copies
        calls = []
        real = gemv.linear
        monkeypatch.setattr(gemv, "linear", lambda x, w, b: calls.append(x.shape[0]) or real(x, w, b))
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        one = engine.generate(Request(prompt="Count to ten."), params)
        assert calls and max(calls) <= gemv.MAX_ROWS  # decode steps of one sequence; the prefill went to oneDNN
    monkeypatch.setenv("MINIVLM_GEMV", "0")  # the same request on oneDNN alone (read at load): the same tokens
    with Engine(model=checkpoints["qwen2_5_vl"], device="cpu", dtype="float32", num_blocks=64) as engine:
        assert engine.linear_backend == "oneDNN (prepacked); gemv.c off: MINIVLM_GEMV=0"
        assert engine.memory_report().weight_copies_bytes == 0
        calls.clear()
        assert engine.generate(Request(prompt="Count to ten."), params).token_ids == one.token_ids and not calls
