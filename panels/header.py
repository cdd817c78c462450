"""Header: model, device, dtype, block size, number of blocks and cache strategy; changing them rebuilds the
engine and the status line says what was built (KV cache size in tokens, max concurrency)."""
import dataclasses

import gradio as gr

from minivlm import EngineConfig
from minivlm.device import available_devices

from panels.holder import EngineHolder

HUB_MODELS = ["Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen3-VL-2B-Instruct",
              "Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen3-VL-8B-Instruct"]
TINY = EngineConfig().model


def model_choices(current: str) -> list[tuple[str, str]]:
    """The shipped tiny model, the configured one if different, then real checkpoints from the hub."""
    choices = [("tiny-qwen-vl (shipped, offline)", TINY)]
    if current not in (TINY, *HUB_MODELS):
        choices.append((current, current))
    return choices + [(f"{m} (hub)", m) for m in HUB_MODELS]


def device_choices() -> tuple[list[tuple[str, str]], str]:
    """auto plus every device kind (unavailable ones labelled so, and greyed out by CSS), and the reasons."""
    avail = available_devices()
    choices = [("auto", "auto")] + [(k if why is None else f"{k} (unavailable)", k) for k, why in avail.items()]
    reasons = "; ".join(f"{k}: {why}" for k, why in avail.items() if why)
    return choices, reasons or "every device kind is available"


def build(holder: EngineHolder) -> gr.Markdown:
    """Lay out the header; returns the status line (other tabs may refresh it)."""
    cfg = holder.config
    devices, reasons = device_choices()
    with gr.Row():
        model = gr.Dropdown(model_choices(cfg.model), value=cfg.model, label="Model", allow_custom_value=True,
                            info="the shipped tiny model, a local HF checkpoint dir, or a hub id (downloads on demand)",
                            scale=3, elem_id="model-picker")
        device = gr.Radio(devices, value=cfg.device, label="Device", info=reasons, elem_id="device-picker", scale=3)
        strategy = gr.Radio(["none", "A", "B", "C"], value=holder.config.cache_strategy, label="Prefix cache",
                            interactive=not holder.shared, scale=2, elem_id="strategy-picker",
                            info="shared deployment: C + a cache salt per session" if holder.shared else
                            "A: token ids · B: + image hash · C: + processor, grid, model")
    with gr.Row(equal_height=True):
        dtype = gr.Dropdown(["auto", "float32", "bfloat16", "float16"], value=cfg.dtype, label="dtype")
        block_size = gr.Number(cfg.block_size, label="block size (tokens)", precision=0, minimum=1)
        num_blocks = gr.Number(cfg.num_blocks or 0, label="KV blocks (0 = from memory)", precision=0, minimum=0)
        apply = gr.Button("Rebuild engine", variant="secondary", elem_id="rebuild")
    status = gr.Markdown(holder.status, elem_id="engine-status")

    def rebuild(model_id, device_name, dtype_name, bs, nb, strat, progress=gr.Progress(track_tqdm=True)):
        why = available_devices().get(device_name)
        if why is not None:
            gr.Warning(f"{device_name} is not available: {why}")
            return f"⚠️ {device_name} is not available: {why}. Still serving: {holder.status}", holder.config.device
        progress(0, desc=f"loading {model_id}")
        try:
            config = dataclasses.replace(holder.config, model=(model_id or TINY).strip(), device=device_name,
                                         dtype=dtype_name, block_size=int(bs or 0), num_blocks=int(nb) or None,
                                         cache_strategy=strat)
            return holder.load(config), device_name
        except (ValueError, OSError) as e:  # offline hub id, bad checkpoint, no memory: keep the old engine
            gr.Warning(str(e))
            return f"⚠️ {e}<br>Still serving: {holder.status}", holder.config.device

    inputs = [model, device, dtype, block_size, num_blocks, strategy]
    gr.on([apply.click, model.input, device.input, dtype.input, strategy.input, block_size.submit, num_blocks.submit],
          rebuild, inputs, [status, device], api_name="rebuild", concurrency_id="rebuild", concurrency_limit=1)
    return status
