"""bench/quantized_linears.py (issue #57 step 1) runs end to end on one layer's matrices: every candidate prints a
figure or why it does not run here, the engine's own kernels among the figures."""
import pytest

from bench import quantized_linears


@pytest.mark.slow  # ~12 s of CPU: the reference loops (_dyn_quant_matmul_4bit off ARM) are timed too
def test_the_quantized_linears_bench_prints_every_candidate(capsys):
    quantized_linears.main(["--layers", "1", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "int4 torch int4pack (engine Int4Linear):" in out and "int8 read (sum):" in out
    assert "int8 fbgemm dynamic int8 (quantize_dynamic):" in out
    for line in out.splitlines()[1:]:
        assert "GB/s" in line or "does not run here" in line, line
