"""The VRAM calculator: what a deployment needs per GPU, and which limit a workload hits when it does not fit.

estimate.py puts it together; shapes.py reads a config (Qwen-VL, SmolVLM / Idefics3, InternVL, text-only Qwen2 /
Qwen3, the hybrid Qwen3.5 / Gemma 3 / Gemma 4: shapes_gemma4.py), params.py, params_tiled.py and params_gemma4.py
count parameters (linears.py: one Linear per GPU), tensor_parallel.py says how N GPUs split the model, weights.py and
activations.py turn counts into bytes, kv_groups.py groups a hybrid decoder's layers by what they keep and sizes the
engine's pools (hybrid_kv.py: what estimate shows of them), vision_tokens.py, tiling.py and soft_tokens.py size
images, devices.py holds the device presets, limits.py says why a workload does not fit, planner.py finds the GPUs a
workload needs.
"""
from minivlm.budget.activations import prefill_peak, tiled_vision_peak, vision_peak
from minivlm.budget.devices import device_memory, device_presets, load_device_preset
from minivlm.budget.estimate import DEFAULT_OVERHEAD_BYTES, BudgetItem, Estimate, estimate
from minivlm.budget.kv_groups import GroupShape, GroupSizes, groups_from_specs, layer_groups, size_groups
from minivlm.budget.params import parameter_count, text_params, vision_params
from minivlm.budget.planner import GpuPlan, gpus_needed
from minivlm.budget.shapes import (PRESET_DIR, QWEN_VL, SUPPORTED, TEXT_ONLY, TILED, ModelShape, hf_config,
                                   load_model_preset, model_preset_names, model_shape)
from minivlm.inputs.soft_tokens import DEFAULT_SOFT_TOKENS, SOFT_TOKEN_BUDGETS, SOFT_TOKEN_FAMILIES
from minivlm.budget.tiling import TiledImage, internvl_tiles, smolvlm_tiles
from minivlm.budget.vision_tokens import (FAMILY_PROCESSOR, ImagePlan, image_plan, image_processor_settings,
                                          smart_resize, tiled_processor_settings, vision_tokens)
from minivlm.budget.weights import DTYPE_BYTES, dtype_name, kv_bytes_per_token

__all__ = ["BudgetItem", "DEFAULT_OVERHEAD_BYTES", "DEFAULT_SOFT_TOKENS", "DTYPE_BYTES", "Estimate",
           "FAMILY_PROCESSOR", "GpuPlan", "GroupShape", "GroupSizes", "ImagePlan", "ModelShape", "PRESET_DIR",
           "QWEN_VL", "SOFT_TOKEN_BUDGETS", "SOFT_TOKEN_FAMILIES", "SUPPORTED", "TEXT_ONLY", "TILED", "TiledImage",
           "device_memory", "device_presets", "dtype_name", "estimate", "gpus_needed", "groups_from_specs",
           "hf_config", "image_plan", "image_processor_settings", "internvl_tiles", "kv_bytes_per_token",
           "layer_groups", "load_device_preset", "load_model_preset", "model_preset_names", "model_shape",
           "parameter_count", "prefill_peak", "size_groups", "smart_resize", "smolvlm_tiles", "text_params",
           "tiled_processor_settings", "tiled_vision_peak", "vision_params", "vision_peak", "vision_tokens"]
