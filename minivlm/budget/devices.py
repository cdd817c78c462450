"""The device presets (assets/presets/devices.json) and the memory one GPU may plan with."""
import json
import os

from minivlm.budget.shapes import PRESET_DIR


def device_presets() -> dict[str, dict]:
    """Every shipped device by name, in file order ('L4', 'H100 80GB', '4× H100 80GB', 'Apple M-series 16 GB', ...)."""
    with open(os.path.join(PRESET_DIR, "devices.json")) as f:
        return json.load(f)["devices"]


def load_device_preset(name: str) -> dict:
    """One device preset by name; memory_bytes is per GPU, gpus how many GPUs it has."""
    devices = device_presets()
    if name not in devices:
        raise ValueError(f"unknown device preset {name!r}; known: {sorted(devices)}")
    return devices[name]


def device_memory(device=None, device_memory_gb=None, device_memory_bytes=None) -> int:
    """Bytes one GPU may plan with: exactly one of a preset name (times its working-set fraction), a size in
    GiB (2^30 bytes; presets carry exact figures), or exact bytes (the engine passes the device's free memory)."""
    given = [x is not None for x in (device, device_memory_gb, device_memory_bytes)]
    if sum(given) != 1:
        raise ValueError("give exactly one of device (a preset), device_memory_gb or device_memory_bytes")
    if device is not None:
        preset = load_device_preset(device)
        return int(preset["memory_bytes"] * preset["working_set_fraction"])
    memory = device_memory_bytes if device_memory_bytes is not None else int(device_memory_gb * 2 ** 30)
    if memory <= 0:
        raise ValueError(f"device memory must be positive, got {memory} bytes")
    return int(memory)


def tensor_parallel_for(device, tensor_parallel_size) -> int:
    """The GPU count to plan for: as given, else the preset's GPU count (1 without a preset). A multi-GPU preset
    fixes the count: asking another is an error (pick the single-GPU preset and set the count instead)."""
    gpus = load_device_preset(device).get("gpus", 1) if device is not None else 1
    if tensor_parallel_size is None:
        return gpus
    if gpus > 1 and tensor_parallel_size != gpus:
        raise ValueError(f"device {device!r} has {gpus} GPUs but tensor_parallel_size is {tensor_parallel_size}; "
                         f"use tensor_parallel_size={gpus} or a single-GPU preset")
    return tensor_parallel_size
