"""Header: model, device, dtype, block size, number of blocks and cache strategy; changing them rebuilds the
engine and the status line says what was built (KV cache size in tokens, max concurrency). On a shared deployment
the header is read-only for visitors and the server refuses their rebuilds; the operator unlocks it with a token."""
import dataclasses
import html
import os

import gradio as gr

from minivlm import EngineConfig
from minivlm.config import DEVICES, DTYPES, STRATEGIES
from minivlm.device import available_devices

from panels.access import refusal
from panels.holder import EngineHolder

HUB_MODELS = ["Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen3-VL-2B-Instruct",
              "Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen3-VL-8B-Instruct"]
TINY = EngineConfig().model
LOCAL_MODELS = {"tiny-qwen-vl": TINY}  # picker value -> directory: the page never sees a server path
DEVICE_NOTES = {"mps": "less tested"}


def model_key(model: str) -> str:
    """What the picker shows for a model: a hub id as is, a local directory by its name (remembered here)."""
    for key, path in LOCAL_MODELS.items():
        if os.path.abspath(path) == os.path.abspath(model):
            return key
    if os.path.isdir(model):
        LOCAL_MODELS[os.path.basename(model.rstrip("/"))] = model
        return os.path.basename(model.rstrip("/"))
    return model


def resolve_model(key: str) -> str:
    """Picker value -> what the engine loads (a known local name, else the value itself: hub id or a path)."""
    key = (key or "tiny-qwen-vl").strip()
    return LOCAL_MODELS.get(key, key)


def model_choices(current: str) -> list[tuple[str, str]]:
    """The shipped tiny model, the configured one if different, then real checkpoints from the hub."""
    choices = [("tiny-qwen-vl (shipped, offline)", "tiny-qwen-vl")]
    key = model_key(current)
    if key not in ("tiny-qwen-vl", *HUB_MODELS):
        choices.append((key, key))
    return choices + [(f"{m} (hub)", m) for m in HUB_MODELS]


def device_choices() -> tuple[list[tuple[str, str]], str]:
    """auto plus every device kind (unavailable ones labelled so, and greyed out by CSS), and the reasons."""
    avail = available_devices()
    choices = [("auto", "auto")]
    for k in DEVICES[1:]:
        note = "unavailable" if avail[k] is not None else DEVICE_NOTES.get(k)
        choices.append((f"{k} ({note})" if note else k, k))
    reasons = "; ".join(f"{k}: {why}" for k, why in avail.items() if why)
    return choices, ("auto = cuda > mps > cpu (the shipped tiny model: cuda > cpu); mps is less tested. "
                     + (reasons or "every device kind is available"))


def serving(holder: EngineHolder) -> list:
    """The header's widget values for the configuration that is actually serving."""
    c = holder.config
    return [model_key(c.model), c.device, c.dtype, c.block_size, c.num_blocks or 0, c.cache_strategy]


def build(holder: EngineHolder, demo: gr.Blocks) -> gr.Markdown:
    """Lay out the header (a page load shows what is serving now); returns the status line."""
    cfg, editable = holder.config, not holder.shared
    devices, reasons = device_choices()
    with gr.Row():
        model = gr.Dropdown(model_choices(cfg.model), value=model_key(cfg.model), label="Model",
                            allow_custom_value=True, interactive=editable, scale=3, elem_id="model-picker",
                            info="the shipped tiny model, a local HF checkpoint dir, or a hub id (downloads on demand)")
        device = gr.Radio(devices, value=cfg.device, label="Device", info=reasons, elem_id="device-picker", scale=3,
                          interactive=editable)
        strategy = gr.Radio(list(STRATEGIES), value=cfg.cache_strategy, label="Prefix cache", interactive=editable,
                            scale=2, elem_id="strategy-picker",
                            info="shared deployment: C + a cache salt per session" if holder.shared else
                            "A: token ids · B: + image hash · C: + processor, grid, model")
    with gr.Row(equal_height=True):
        dtype = gr.Dropdown(list(DTYPES), value=cfg.dtype, label="dtype", interactive=editable)
        block_size = gr.Number(cfg.block_size, label="block size (tokens)", precision=0, minimum=1,
                               interactive=editable)
        num_blocks = gr.Number(cfg.num_blocks or 0, label="KV blocks (0 = from memory)", precision=0, minimum=0,
                               interactive=editable)
        token = gr.Textbox("", type="password", label="operator token", visible=holder.shared, elem_id="operator-token",
                           info="shared deployment: the settings belong to the operator; press Enter to unlock")
        apply = gr.Button("Rebuild engine", variant="secondary", elem_id="rebuild", interactive=editable)
    status = gr.Markdown(holder.status, elem_id="engine-status", label="engine status")
    widgets = [model, device, dtype, block_size, num_blocks, strategy]

    def rebuild(model_name, device_name, dtype_name, block_size_tokens, kv_blocks, prefix_cache, operator_token,
                progress=gr.Progress(track_tqdm=True)):
        why = holder.refusal(operator_token)
        if why is not None:
            raise refusal(why)
        unavailable = available_devices().get(device_name)
        if unavailable is not None:
            gr.Warning(f"{device_name} is not available: {unavailable}")
            return f"⚠️ {device_name} is not available: {unavailable}. Still serving: {holder.status}", \
                *serving(holder)
        progress(0, desc=f"loading {model_name}")
        try:
            config = dataclasses.replace(holder.config, model=resolve_model(model_name), device=device_name,
                                         dtype=dtype_name, block_size=int(block_size_tokens or 0),
                                         num_blocks=int(kv_blocks or 0) or None, cache_strategy=prefix_cache)
            return holder.load(config), *serving(holder)
        except (ValueError, OSError) as e:  # offline hub id, bad checkpoint, no memory: keep serving
            message = html.escape(str(e), quote=False)  # a `<dir>` in the message is text, not a tag
            gr.Warning(message)
            return f"⚠️ {message}<br>Still serving: {holder.status}", *serving(holder)

    def unlock(operator_token):
        why = holder.refusal(operator_token)
        if why is not None:
            raise refusal(why)
        gr.Info("Operator: the header is unlocked for this page.")
        return [gr.update(interactive=True) for _ in range(len(widgets) + 1)]

    gr.on([apply.click, model.input, device.input, dtype.input, strategy.input, block_size.submit, num_blocks.submit],
          rebuild, widgets + [token], [status, *widgets], api_name="rebuild", concurrency_id="rebuild",
          concurrency_limit=1, api_description="Rebuild the engine with these settings (refused for visitors of a "
                                               "shared deployment without the operator token).")
    demo.load(lambda: (holder.status, *serving(holder)), None, [status, *widgets], api_name="engine_status",
              api_description="The engine now serving: its status line and settings.", show_progress="hidden")
    token.submit(unlock, [token], widgets + [apply], api_name="unlock_header", queue=False,
                 api_description="Operator only: make the header's settings editable on a shared deployment.")
    return status
