"""The CUDA path, as tests: tools/gpu_check.py's checks at full size where a GPU is visible (marked `cuda`,
skipped elsewhere saying why), and the same code paths at small sizes on CPU, which run everywhere."""
import pytest
import torch

from tools import gpu_check

NO_CUDA = ("no CUDA GPU visible to this torch build; on a GPU machine run `python -m tools.gpu_check` "
           "(see bench/RESULTS.md)")
ON_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]
DEVICES = [pytest.param("cuda", marks=ON_CUDA), "cpu"]


def assert_no_failure(rows):
    assert rows, "a check produced no rows"
    failed = [r for r in rows if r.status == "FAIL"]
    assert not failed, gpu_check.table(failed)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return str(tmp_path_factory.mktemp("gpu_check"))


@pytest.mark.parametrize("device", DEVICES)
def test_parity_all_families_fp32_and_bf16(device, work):
    rows = gpu_check.check_parity(device, work)
    assert_no_failure(rows)
    assert {r.name.split()[1] for r in rows} == {"fp32", "bf16"} and len(rows) == 6


@pytest.mark.parametrize("device", DEVICES)
def test_tiny_model_answers_equal_hf_generate(device):
    rows = gpu_check.check_tiny_answers(device, 50 if device == "cuda" else 5)
    assert_no_failure(rows)


@pytest.mark.parametrize("device", DEVICES)
def test_real_dimensions_memory(device, work):
    cuda = device == "cuda"
    for preset in gpu_check.PRESETS:
        rows = gpu_check.check_memory(preset, device, work, 128 if cuda else 2, 32768 if cuda else 2048)
        assert_no_failure(rows)
        statuses = {r.status for r in rows}
        assert ("skip" not in statuses) if cuda else any("allocator counters" in r.detail for r in rows)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_attention_block_256(device, work):
    rows = gpu_check.check_attention(device, work)
    assert_no_failure(rows)
    if gpu_check.flash_attn.flash_attn_with_kvcache is None:
        assert any(r.status == "skip" and "flash-attn" in r.detail for r in rows)


def test_forced_sdpa_is_restored_after_a_comparison(work):
    devices = set(gpu_check.paged_flex.DEVICES)
    gpu_check.check_attention("cpu", work)
    assert gpu_check.flash_attn.ENABLED and gpu_check.paged_flex.DEVICES == devices


def test_a_failing_part_becomes_a_row_and_the_command_exits_1(tmp_path, monkeypatch):
    def check_broken(device):
        raise RuntimeError("broken on purpose")
    rows = []
    gpu_check.run_part(rows, gpu_check.Budget(100), "parity", check_broken, "cpu")
    assert rows[0].status == "FAIL" and "broken on purpose" in rows[0].detail
    monkeypatch.setattr(gpu_check, "check_attention", lambda device, work: [gpu_check.Check("x", "y", "FAIL", "z")])
    only_attention = ["--skip", "parity", "tiny", "memory", "bench"]
    assert gpu_check.main(["--device", "cpu", "--out", str(tmp_path), *only_attention]) == 1


def test_budget_skips_parts_that_would_overrun(tmp_path):
    code = gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--budget-s", "1"])
    text = (tmp_path / "gpu_check_cpu.md").read_text()
    assert code == 0 and text.count("| skip | wall-time budget") == 6


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the CUDA parts run instead")
def test_without_a_gpu_the_command_says_why(tmp_path):
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    assert "no CUDA GPU visible" in (tmp_path / "gpu_check_cuda.md").read_text()
