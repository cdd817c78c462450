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
