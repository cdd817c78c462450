"""Which GPUs a workload needs: for each single-GPU device preset, the fewest GPUs (tensor parallel) it fits on."""
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
    config = hf_config(model_config)  # parse once, not per estimate
    presets = device_presets()
    names = devices or [n for n, d in presets.items() if d["kind"] == "cuda" and d.get("gpus", 1) == 1]
    plans = []
    for name in names:
        plan = GpuPlan(name, None, None, "")
        for tp in sizes:
            try:
                est = estimate(config, device=name, tensor_parallel_size=tp, **workload)
            except ValueError as e:  # this split is impossible (heads or MLP width do not divide)
                plan.reason = str(e)
                continue
            plan.estimate, plan.reason = est, "; ".join(est.limits)
            if est.fits:
                plan.gpus = tp
                break
        plans.append(plan)
    return plans
