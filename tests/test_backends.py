"""The model backends (minivlm/model/backends/): picked once per engine, said by id in the status line (the Chinese
page keys on the id, not the English), the C kernels giving the same numbers when built without OpenMP (macOS's
Apple clang), and the reference path in minivlm/model/ small and free of C."""
import glob
import os

import pytest

from minivlm import SamplingParams
from minivlm.model.backends.base import WORDS, Said
from minivlm.model.backends.cpu_kernels import decode_layer, decode_ops, gemv, paged_cpu
from minivlm.model.backends.cpu_kernels.c_build import LazyKernels
from tests.test_parity import check_against_hf, requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_reference_path_is_small_and_loads_no_c_code():
    files = glob.glob(os.path.join(ROOT, "minivlm", "model", "*.py"))
    lines = sum(len(open(f, encoding="utf-8").readlines()) for f in files)
    # 613 lines for the dense families after #39; #41 added two hybrid decoders (Qwen3.5, Gemma 3: ~380 lines),
    # Gemma's tower, the cache specs and the window / span masks; #54 Gemma 4 (its decoder with shared-KV layers and
    # per-layer embeddings, its tower: ~360 lines) and #55 Qwen3.5's MTP head (~60); then Gemma 4 12B (its
    # encoder-free embedder, images that see each other past the window, placeholders as pad: ~120) and the MTP
    # verify's delta rule kept per token (~50)
    assert lines <= 1900, lines
    for f in files:
        text = open(f, encoding="utf-8").read()
        assert "ctypes" not in text and "c_build" not in text and "backends import" not in text, f


def test_the_catalogue_says_every_backend_word_by_its_id():
    from panels.i18n import CATALOGUE
    assert {key: CATALOGUE[key][0] for key in WORDS} == WORDS


def test_the_chinese_status_line_keys_on_the_id_not_the_english(engines, monkeypatch):
    from panels.holder import status_line
    from panels.i18n import ZH
    from panels.i18n.errors import localize_status
    engine = engines["qwen2_5_vl"]
    zh = status_line(engine, ZH)
    assert "原地分页解码（直接在块表上运行的 C 内核）" in zh
    assert "每步一次 C 调用（decode_layer.c）" in zh
    assert "1–16 行的解码批次用 gemv.c" in zh
    monkeypatch.setitem(WORDS, "engine.decode_layer", "{rows} rows a call, reworded{threads}")
    with engine.isolated(num_blocks=32) as reworded:
        assert reworded.decode_backend == "16 rows a call, reworded"
        assert localize_status(reworded.decode_backend, ZH) == localize_status(engine.decode_backend, ZH)
    with engine.isolated(num_blocks=32, enforce_eager=True) as eager:  # a field that is a word of its own
        assert localize_status(eager.decode_backend, ZH) == "PyTorch 算子（enforce_eager）"


@pytest.mark.skipif(paged_cpu.KERNELS.get() is None or decode_layer.KERNELS.get() is None, reason="no C compiler")
def test_kernels_built_without_openmp_give_the_same_numbers_on_one_thread(engines, checkpoints, monkeypatch):
    """Where the compiler has no OpenMP (Apple clang) the kernels are built without it (MINIVLM_OPENMP=0 forces
    that here): the status line says so, and every kernel computes each output element as before, so the tokens
    and logprobs equal the thread team's, bit for bit, and HF's within its tolerance."""
    engine, reqs = engines["qwen2_5_vl"], requests()[:4]
    params = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=1)
    engine.reset_prefix_cache()
    want = engine.generate(reqs, params)
    monkeypatch.setenv("MINIVLM_OPENMP", "0")
    for module in (gemv, paged_cpu, decode_ops, decode_layer):
        monkeypatch.setattr(module, "KERNELS", LazyKernels(module.KERNELS.source, module.KERNELS.signatures))
    with engine.isolated(num_blocks=128) as single:
        assert single.decode_backend.endswith("above; one thread (built without OpenMP: MINIVLM_OPENMP=0)")
        assert single.attention_backend.startswith("in-place paged decode (C kernel over the block tables; one "
                                                   "thread (built without OpenMP: MINIVLM_OPENMP=0))")
        assert all(m.KERNELS.get().no_openmp == "MINIVLM_OPENMP=0" for m in (gemv, paged_cpu, decode_ops))
        got = single.generate(reqs, params)
    for request, a, b in zip(reqs, want, got):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
        check_against_hf(checkpoints["qwen2_5_vl"], "qwen2_5_vl", request, b)


APPLE_CLANG = """#!/bin/sh
# like Apple clang: no -fopenmp, no -march=native (only -mcpu=native); gcc underneath
for a in "$@"; do
  case "$a" in
    -fopenmp) echo "clang: error: unsupported option '-fopenmp'" >&2; exit 1;;
    -march=native) echo "clang: error: the clang compiler does not support '-march=native'" >&2; exit 1;;
  esac
done
exec gcc $(printf '%s\\n' "$@" | sed 's/^-mcpu=native$/-march=native/')
"""


@pytest.mark.skipif(gemv.KERNELS.get() is None, reason="no C compiler")
def test_a_compiler_without_openmp_builds_the_kernels_for_one_thread(tmp_path, monkeypatch):
    """macOS: Apple clang refuses -fopenmp (and, in older versions, -march=native). The build falls back to the
    flags it takes, remembers the refusals in the cache, and the library says why it has no thread team."""
    import torch
    import torch.nn.functional as F
    cc = tmp_path / "cc"
    cc.write_text(APPLE_CLANG)
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("MINIVLM_CACHE", str(tmp_path / "cache"))
    for _ in range(2):  # a fresh build, then one that reads the refusals from the cache
        lib = gemv.KERNELS.variant()
        assert lib.no_openmp == "clang: error: unsupported option '-fopenmp'"
    cache = tmp_path / "cache"
    assert len(list(cache.glob("gemv_*.so.refused"))) == 3 and len(list(cache.glob("gemv_*.so"))) == 1
    x, w, b = torch.randn(5, 96), torch.randn(40, 96), torch.randn(40)
    assert torch.allclose(gemv.linear(x, w, b, lib.gemv_f32), F.linear(x, w, b), atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_backend_keeps_its_kernel_state_itself_and_runs_the_decoders_one_loop(dtype):
    """The C step's state (each layer's struct of weight pointers, a bf16 engine's fp32 norm copies) is the backend's
    own: picking it leaves every module of the decoder with the attributes it had, and two backends on the same
    weights hold state of their own. The step runs the decoder's forward with its hooks (no loop of its own)."""
    import torch
    from minivlm import EngineConfig
    from minivlm.loader import LoadedModel
    from minivlm.model import backends
    from minivlm.model.backends.base import Hooks
    config = EngineConfig(device="cpu", dtype=dtype, num_blocks=16)
    model = LoadedModel(config)
    before = {name: dict(vars(m)) for name, m in model.decoder.named_modules()}
    kv_caches = [tuple(torch.zeros(16, config.block_size, model.text_config.num_key_value_heads,
                                   model.text_config.head_dim, dtype=model.dtype) for _ in range(2))
                 for _ in model.decoder.layers]
    first, second = (backends.pick(model, config, kv_caches) for _ in range(2))
    after = {name: dict(vars(m)) for name, m in model.decoder.named_modules()}
    assert before.keys() == after.keys()
    for name in before:  # the same attributes, each the same object (parameters and buffers in their dicts)
        assert before[name].keys() == after[name].keys(), name
        assert all(before[name][k] is after[name][k] for k in before[name]), name
    assert isinstance(first, Hooks) and first.step_weights is not second.step_weights
    assert type(first).forward is Hooks.forward and type(first).whole_step is not Hooks.whole_step


@pytest.mark.parametrize("device, dtype, decode, attention", [
    ("mps", "float32", "PyTorch ops (the fused C paths are for the CPU in fp32)", "SDPA over gathered blocks"),
    ("cpu", "float16", "PyTorch ops (the fused C paths are for the CPU in fp32)",
     "SDPA over gathered blocks (in-place kernel: fp32 only)")])
def test_where_no_class_of_the_registry_serves_the_reference_says_the_first_reason(device, dtype, decode, attention):
    """pick asks only the classes made for the device and dtype (runs_on): on MPS none is, so the reference runs
    without a reason for attention; on the CPU in fp16 the C attention kernel is, and says why it does not serve."""
    from types import SimpleNamespace

    import torch
    from minivlm import EngineConfig
    from minivlm.model import backends
    model = SimpleNamespace(device=torch.device(device), dtype=getattr(torch, dtype), decoder=SimpleNamespace())
    picked = backends.pick(model, EngineConfig(), None)
    assert type(picked) is backends.Backend and type(picked.attention) is backends.Attention
    assert picked.describe() == {"decode": decode, "attention": attention}
    assert picked.passed_over == ({"paged_decode.c": Said("engine.why_kernel", why=Said("engine.fp32_only"))}
                                  if device == "cpu" else {})  # those asked, by name: why not


def test_the_registry_says_why_each_class_asked_before_the_picked_one_did_not_serve(engines):
    from minivlm.model.backends.cpu_kernels import CpuKernels
    engine = engines["qwen2_5_vl"]
    assert type(engine.core.runner.backend) is CpuKernels and engine.core.runner.backend.passed_over == {}
    with engine.isolated(num_blocks=32, enforce_eager=True) as eager:
        assert eager.core.runner.backend.passed_over == {"cpu_kernels": "enforce_eager"}
