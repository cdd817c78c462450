"""The VRAM calculator: what a Qwen-VL deployment needs per GPU, and which limit a workload hits when it does not fit.

estimate.py puts it together; shapes.py reads a config, params.py counts parameters, tensor_parallel.py says how N
GPUs split the model, weights.py and activations.py turn counts into bytes, vision_tokens.py sizes images,
devices.py holds the device presets, limits.py says why a workload does not fit, planner.py finds the GPUs a
workload needs.
"""
from minivlm.budget.activations import prefill_peak, vision_peak
from minivlm.budget.devices import device_memory, device_presets, load_device_preset
from minivlm.budget.estimate import DEFAULT_OVERHEAD_BYTES, BudgetItem, Estimate, estimate
from minivlm.budget.params import parameter_count, text_params, vision_params
from minivlm.budget.planner import GpuPlan, gpus_needed
from minivlm.budget.shapes import (PRESET_DIR, ModelShape, hf_config, load_model_preset, model_preset_names,
                                   model_shape)
from minivlm.budget.vision_tokens import FAMILY_PROCESSOR, image_processor_settings, smart_resize, vision_tokens
from minivlm.budget.weights import DTYPE_BYTES, dtype_name, kv_bytes_per_token

__all__ = ["BudgetItem", "DEFAULT_OVERHEAD_BYTES", "DTYPE_BYTES", "Estimate", "FAMILY_PROCESSOR", "GpuPlan",
           "ModelShape", "PRESET_DIR", "device_memory", "device_presets", "dtype_name", "estimate", "gpus_needed",
           "hf_config", "image_processor_settings", "kv_bytes_per_token", "load_device_preset", "load_model_preset",
           "model_preset_names", "model_shape", "parameter_count", "prefill_peak", "smart_resize", "text_params",
           "vision_params", "vision_peak", "vision_tokens"]
