"""Which GPUs a workload needs: for each single-GPU device preset, the fewest GPUs (tensor parallel) it fits on; and
the matrix plan: a few models on one GPU of each of a few sizes, at one workload."""
from dataclasses import dataclass

from minivlm.budget.devices import device_presets
from minivlm.budget.estimate import Estimate, estimate
from minivlm.budget.shapes import hf_config

TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)


@dataclass
class GpuPlan:
    """One device's answer: the fewest GPUs that fit (None: none up to 8) and the estimate at that count (or at the
    largest count tried, whose limits say why it still does not fit)."""
    device: str
    gpus: int | None
    estimate: Estimate | None
    reason: str = ""


def gpus_needed(model_config, devices=None, sizes=TENSOR_PARALLEL_SIZES, **workload) -> list[GpuPlan]:
    """For each device (default: every single-GPU CUDA preset) the smallest tensor_parallel_size in `sizes` at which
    estimate(model_config, **workload) fits; workload takes estimate's keyword arguments except the device."""
    config = hf_config(model_config)  # parse once, not per estimate; model_config still names the saved processor
    presets = device_presets()
    names = devices or [n for n, d in presets.items() if d["kind"] == "cuda" and d.get("gpus", 1) == 1]
    plans = []
    for name in names:
        plan = GpuPlan(name, None, None, "")
        for tp in sizes:
            try:
                est = estimate(model_config, device=name, tensor_parallel_size=tp, cfg=config, **workload)
            except ValueError as e:  # this split is impossible (heads or MLP width do not divide)
                plan.reason = str(e)
                continue
            plan.estimate, plan.reason = est, "; ".join(est.limits)
            if est.fits:
                plan.gpus = tp
                break
        plans.append(plan)
    return plans


# The four VLMs of the model matrix, and one GPU preset per memory size the planning table shows.
MATRIX_VLMS = ("Qwen3-VL-4B-Instruct", "Qwen2.5-VL-3B-Instruct", "SmolVLM2-2.2B-Instruct", "InternVL3_5-4B-HF")
MATRIX_GPUS = (("16 GB", "T4"), ("24 GB", "L4"), ("48 GB", "L40S"), ("80 GB", "H100 80GB"))


def plan_matrix(models=MATRIX_VLMS, devices=tuple(d for _, d in MATRIX_GPUS), **workload) -> dict[str, list[Estimate]]:
    """For each model, its estimate on one GPU of each device at the same workload (estimate's keyword arguments
    except the device): does it fit, how many requests at once, which limit it hits."""
    return {model: [estimate(config, device=device, tensor_parallel_size=1, **workload) for device in devices]
            for model, config in ((m, hf_config(m)) for m in models)}
