"""The device rule for Apple laptops: `auto` keeps the shipped tiny model on the CPU where MPS exists (the tested
path, and its steps are too small for the GPU to pay off) and puts real checkpoints on MPS; the header still offers
MPS, marked less tested. This machine has no Apple GPU, so the device query is answered as a Mac's would be."""
import pytest
import torch

import minivlm.device as device
from minivlm.config import DEFAULT_MODEL

MAC = {"cuda": "no CUDA GPU visible to this torch build", "mps": None, "cpu": None}
CUDA_BOX = {"cuda": None, "mps": "Apple Metal (MPS) is only on Apple-silicon Macs", "cpu": None}


@pytest.fixture
def on(monkeypatch):
    def machine(avail):
        monkeypatch.setattr(device, "available_devices", lambda: dict(avail))
    return machine


def test_auto_on_a_mac_keeps_the_tiny_model_on_cpu_and_real_models_on_mps(on):
    on(MAC)
    assert device.pick_device("auto", DEFAULT_MODEL) == torch.device("cpu")
    assert device.pick_device("auto", DEFAULT_MODEL + "/") == torch.device("cpu")
    assert device.pick_device("auto", "Qwen/Qwen2.5-VL-3B-Instruct") == torch.device("mps")
    assert device.pick_device("mps", DEFAULT_MODEL) == torch.device("mps")  # asked for explicitly: honoured


def test_auto_elsewhere_is_unchanged(on):
    on(CUDA_BOX)
    assert device.pick_device("auto", DEFAULT_MODEL) == torch.device("cuda")
    with pytest.raises(ValueError, match="device 'mps' is not available: Apple Metal"):
        device.pick_device("mps")


def test_header_offers_mps_as_less_tested(on, monkeypatch):
    import panels.header as header
    monkeypatch.setattr(header, "available_devices", lambda: dict(MAC))
    choices, info = header.device_choices()
    assert ("mps (less tested)", "mps") in choices and ("cuda (unavailable)", "cuda") in choices
    assert "the shipped tiny model: cuda > cpu" in info


PC = {"cuda": "no CUDA GPU visible to this torch build", "mps": "Apple Metal (MPS) is only on Apple-silicon Macs",
      "cpu": None}


def preset_weights(name: str, dtype: str = "float32") -> int:
    """A published model's weight bytes, from its config by the VRAM calculator (what the engine holds on the CPU)."""
    import json
    import os
    from minivlm.budget.estimate import estimate
    path = os.path.join(os.path.dirname(DEFAULT_MODEL), "presets", "models", f"{name}.json")
    return estimate(json.load(open(path)), dtype=dtype, device_memory_gb=1000).weights_bytes


def test_auto_on_the_cpu_warns_only_from_a_gib_of_weights(on):
    """#52.5: "slow for this model" was said for a 2.5 MiB checkpoint. Now only at SLOW_ON_CPU_BYTES (1 GiB) or more,
    with the size and the threshold; the other side (the tiny model, a 2.5 MiB checkpoint) is
    tests/test_app_start.py's running app, which must not warn."""
    import os
    on(PC)
    tiny = os.path.getsize(os.path.join(DEFAULT_MODEL, "model.safetensors"))
    small, big = preset_weights("SmolVLM2-256M-Video-Instruct"), preset_weights("Qwen2.5-0.5B-Instruct")
    assert tiny < small < device.SLOW_ON_CPU_BYTES == 2**30 < big
    for quiet in (tiny, small, device.SLOW_ON_CPU_BYTES - 1):
        assert device.cpu_fallback_warning("cpu", quiet) is None
    for slow, size in ((device.SLOW_ON_CPU_BYTES, "1.0 GiB"), (big, "1.8 GiB"),
                       (preset_weights("Qwen3-VL-2B-Instruct"), "7.9 GiB")):
        said = device.cpu_fallback_warning("cpu", slow)
        assert said.startswith("minivlm: warning: --device auto found no GPU (no CUDA GPU visible") and \
            f"({size} of weights" in said and "slow from 1 GiB" in said, said
    assert device.cpu_fallback_warning("mps", big) is None  # a GPU after all
    on(CUDA_BOX)
    assert device.cpu_fallback_warning("cpu", big) is None  # a GPU was there: the CPU was asked for some other way
