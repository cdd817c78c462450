"""Issue #52: every family x quantization (int8, int4) x dtype (float32, bfloat16) on its test checkpoint serves, or
is refused with a message naming the setting; never ends the process. Each family runs in a subprocess of its own
(tools/quantization_matrix.py), so a kernel that crashes fails that family's case instead of the run. Two cases use
checkpoints whose widths are not multiples of 16 (hidden 40, intermediate 88): the widths that crashed PyTorch's
int8 kernel before quantized.py padded its weights; the status line says how many layers were padded.

Two measures, each max |Δ logprob| of the reference's token where both engines saw the same prefix:

- against the unquantized fp32 engine: the quantization's own error. int8 stays within INT8_BOUND
  (tests/test_quantization.py), stated on the tiny Qwen2.5-VL checkpoint, whose own bf16 engine moves a chosen
  token's logprob by DRIFT_AT_BOUND against fp32; a random checkpoint that amplifies rounding more (Gemma 3's: six
  layers, norm weights stored as offsets from 1, so near 2) gets the bound scaled by its drift over that one, and a
  bf16 engine also carries its dtype's drift. int4's is printed, not bounded: on the random Gemma 3 checkpoints (flat
  distributions over a 446-token vocabulary) it moved logprobs 0.41-0.57, as far as another checkpoint of the family.
- against the fp32 engine loaded with the quantized engine's own dequantized weights (tools/dequantized_checkpoint.py):
  whether the serving path computes exactly the model its quantized weights define, whatever the quantization's
  error, on every family and both methods. The two engines multiply by the same weights; they differ only where the
  kernels round: their inputs to bf16 (gemv_int8.c's decode rows: int8 in blocks of 32) and their outputs to bf16.
  That is rounding of the size the unquantized bf16 engine of the same model does (bf16, or int8 steps of a
  block's largest / 127), which also rounds weights, norms and attention; so the yardstick is that engine's drift d
  from the fp32 one (`exact_drift`, measured in the same run), and the bound EXACT_RATIO x d: on the tiny trained
  checkpoint (`python -m tools.quantization_matrix tiny`) the fp32 engines measured 0.57 d (int8) and 1.0 d (int4),
  and the worst of a few dozen positions under one rounding is not ordered against another's, hence 2. A bf16
  engine adds d (its rounding everywhere else: the random Gemma 3's int8 model drifts 0.112 in bf16, and its bf16
  int8 engine is 0.172 from the truth). A wrong layout, group or padded column is a wrong weight: int4's own error
  against fp32 is 2.5-18 d on the fp32 engines (Qwen3-VL's random checkpoint the least; 0.02-0.04 where d is
  0.002; 0.4-0.57 on Gemma 3 and the tiny one), so this bound tells the model the weights define from the original."""
import pytest

from minivlm.model.backends import Said
from minivlm.model.backends.quantized import GROUPS, K_MULTIPLE, N_MULTIPLE
from panels.i18n import ZH
from panels.i18n.errors import localize_status
from tests.test_quantization import DRIFT_AT_BOUND, INT8_BOUND
from tools.quantization_matrix import CASES, run_in_subprocess, table

BOUNDS = {"int8": INT8_BOUND}
# x the dequantized model's own bf16 drift (above: the tiny checkpoint measured 0.57 and 1.0); int4's one-call C step
# (#57) rounds each product's input to Q8 blocks as int8's rows do, besides its bf16 output: 2.17 d on the random
# Qwen2 checkpoint; a wrong layout or group measured 2.5-18 d (above), so this bound sits at the least of those
EXACT_RATIO = {"int8": 2, "int4": 2.5}
# the default run: Gemma 3 with the widths that crashed (padding, both methods, both dtypes); each case is ~15-70 s
# on 2 cores, so the hybrid family (Qwen3.5, whose dequantized weights test_quantization.py checks in the
# default run) and the rest run with -m slow (the whole matrix: some ten minutes)
DEFAULT = ("gemma3:odd",)


def drift(rows: list[dict]) -> float:
    return next(r["worst"] for r in rows if r["method"] == "none")  # this checkpoint's bf16 engine against fp32


def allowed(rows: list[dict], row: dict) -> float:
    d = drift(rows)
    return BOUNDS[row["method"]] * max(1.0, d / DRIFT_AT_BOUND) + (d if row["dtype"] == "bfloat16" else 0.0)


def allowed_exact(row: dict) -> float:
    d = row["exact_drift"]  # the dequantized model's bf16 engine against its fp32 one
    return EXACT_RATIO[row["method"]] * d + (d if row["dtype"] == "bfloat16" else 0.0)


def padded_by_the_kernels_rules(widths) -> int:
    """Layers whose width PyTorch's kernels do not take: int8 K not a multiple of 16; int4 K not a whole number of
    its smallest group, or N not a multiple of 16 (quantized.py's module docstring)."""
    return sum(k % K_MULTIPLE != 0 if kind == "Int8Linear" else (k % GROUPS[-1] != 0 or n % N_MULTIPLE != 0)
               for kind, k, n in widths)


@pytest.mark.parametrize("case", [c if c in DEFAULT else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_each_quantization_serves_the_model_its_weights_define_or_is_refused_by_name(case):
    rows = run_in_subprocess(case)
    print("\n" + table(rows))
    assert not any(r.get("crashed") for r in rows), table(rows)
    for r in rows:
        if not r["served"]:
            assert f"quantization={r['method']!r}" in r["message"], r
            continue
        assert r["worst"] < float("inf"), r  # a number, not inf / nan from a kernel reading past its rows
        if r["method"] == "none":
            continue
        assert r["exact"] <= allowed_exact(r), (r, allowed_exact(r))
        if r["method"] in BOUNDS:
            assert r["worst"] <= allowed(rows, r), (r, allowed(rows, r))
        padded = padded_by_the_kernels_rules(r["widths"])
        said = f"in {len(r['widths'])} layers" + (f" ({padded} padded to the kernel's width)" if padded else "")
        assert said in r["status"] and (padded or "padded" not in r["status"]), r
        zh = localize_status(Said(r["status_key"], **r["status_fields"]), ZH)
        assert f"共 {len(r['widths'])} 层" + (f"（其中 {padded} 层补齐" if padded else "") in zh, zh
        assert padded or "补齐" not in zh, zh
    if case.endswith(":odd"):  # the widths are the point: they reached PyTorch's kernels padded, and it is said
        assert all(r["padded"] and f"({r['padded']} padded" in r["status"] for r in rows
                   if r["served"] and r["method"] != "none")
