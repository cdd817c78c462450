"""Header: model, device, dtype, block size, number of blocks and cache strategy; changing them rebuilds the
engine and the status line says what was built (KV cache size in tokens, max concurrency). On a shared deployment
the header is read-only for visitors and the server refuses their rebuilds; the operator unlocks it with a token."""
import dataclasses
import html
import os
import time

import gradio as gr

from minivlm import EngineConfig
from minivlm.config import DEVICES, DTYPES, STRATEGIES
from minivlm import available_devices

from panels.access import refusal
from panels.holder import EngineHolder
from panels.i18n import EN, LANGUAGES, L, lang_of, t
from panels.i18n.errors import localize_error

HUB_MODELS = ["Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen3-VL-2B-Instruct",
              "Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen3-VL-8B-Instruct"]
TINY = EngineConfig().model
# the models shipped in assets/ (the second, a Qwen3.5 with recurrent state and an MTP head, once it is exported)
SHIPPED = {name: os.path.join(os.path.dirname(TINY), name) for name in ("tiny-qwen-vl", "tiny-qwen3_5-vl")
           if os.path.exists(os.path.join(os.path.dirname(TINY), name, "model.safetensors"))}
LOCAL_MODELS = dict(SHIPPED)  # picker value -> directory: the page never sees a server path
DEVICE_NOTES = {"mps": "header.less_tested"}  # a device kind's note (a message id)
RETRY_AFTER_S = 5.0  # a widget's repeat of settings that just failed to load is not tried again within this
COST_POLL_S = 3.0  # how often an editable header refreshes what a rebuild would end


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


def model_choices(current: str, lang: str = EN) -> list[tuple[str, str]]:
    """The shipped tiny models, the configured one if different, then real checkpoints from the hub."""
    choices = [(t(lang, "header.shipped", name=name), name) for name in SHIPPED]
    key = model_key(current)
    if key not in (*SHIPPED, *HUB_MODELS):
        choices.append((key, key))
    return choices + [(t(lang, "header.hub", name=m), m) for m in HUB_MODELS]


def device_choices(lang: str = EN) -> tuple[list[tuple[str, str]], str]:
    """auto plus every device kind (unavailable ones labelled so, and greyed out by CSS), and the reasons."""
    avail = available_devices()
    choices = [("auto", "auto")]
    for k in DEVICES[1:]:
        note = "header.unavailable_choice" if avail[k] is not None else DEVICE_NOTES.get(k)
        choices.append((t(lang, note, name=k) if note else k, k))
    reasons = "; ".join(f"{k}: {localize_error(why, lang)}" for k, why in avail.items() if why)
    return choices, t(lang, "header.device_info", reasons=reasons or t(lang, "header.all_devices"))


def serving(holder: EngineHolder) -> list:
    """The header's widget values for the configuration that is actually serving."""
    c = holder.config
    return [model_key(c.model), c.device, c.dtype, c.block_size, c.num_blocks or 0, c.cache_strategy]


def build(holder: EngineHolder, demo: gr.Blocks, switch: gr.Radio | None = None) -> gr.Markdown:
    """Lay out the header (a page load shows what is serving now); returns the status line. `switch`: the
    language switch (the status line and notes follow it)."""
    cfg, editable = holder.config, not holder.shared
    devices, reasons = device_choices()
    # folded on a phone (panels/page.py), so the tabs are in sight; the status line below says what serves
    with gr.Accordion(L("header.settings"), open=True, elem_id="engine-settings"):
        with gr.Row():
            model = gr.Dropdown(model_choices(cfg.model), value=model_key(cfg.model), label=L("header.model"),
                                allow_custom_value=True, interactive=editable, scale=3, elem_id="model-picker",
                                info=L("header.model_info"))
            device = gr.Radio(devices, value=cfg.device, label=L("header.device"), info=reasons, elem_id="device-picker",
                              scale=3, interactive=editable)
            strategy = gr.Radio(list(STRATEGIES), value=cfg.cache_strategy, label=L("header.strategy"),
                                interactive=editable, scale=2, elem_id="strategy-picker",
                                info=L("header.strategy_info_shared" if holder.shared else "header.strategy_info"))
        with gr.Row(equal_height=True):
            dtype = gr.Dropdown(list(DTYPES), value=cfg.dtype, label=L("header.dtype"), interactive=editable)
            block_size = gr.Number(cfg.block_size, label=L("header.block_size"), precision=0, minimum=1,
                                   interactive=editable)
            num_blocks = gr.Number(cfg.num_blocks or 0, label=L("header.num_blocks"), precision=0, minimum=0,
                                   interactive=editable)
            token = gr.Textbox("", type="password", label=L("header.token"), elem_id="operator-token",
                               visible=holder.shared and holder.operator_token is not None, info=L("header.token_info"))
            apply = gr.Button(L("header.rebuild"), variant="secondary", elem_id="rebuild", interactive=editable)
    status = gr.Markdown(holder.status, elem_id="engine-status", label=L("header.status"))
    # what a rebuild would end, said before anyone changes a setting (refreshed while the header is editable)
    cost = gr.Markdown(holder.rebuild_cost() if editable else "", elem_id="rebuild-note", label=L("header.cost"),
                       visible=editable)
    note = gr.Markdown("", elem_id="operator-note", label=L("header.operator"), visible=False)
    cost_timer = gr.Timer(COST_POLL_S, active=editable)
    widgets = [model, device, dtype, block_size, num_blocks, strategy]
    tried = {"config": None, "at": 0.0}  # the last settings a widget asked for, and when that attempt ended

    def cost_now(request: gr.Request):
        return holder.rebuild_cost(lang_of(request))

    def wanted(model_name, device_name, dtype_name, block_size_tokens, kv_blocks, prefix_cache) -> EngineConfig:
        return dataclasses.replace(holder.config, model=resolve_model(model_name), device=device_name,
                                   dtype=dtype_name, block_size=int(block_size_tokens or 0),
                                   num_blocks=int(kv_blocks or 0) or None, cache_strategy=prefix_cache)

    def rebuild(model_name, device_name, dtype_name, block_size_tokens, kv_blocks, prefix_cache, operator_token,
                request: gr.Request = None, progress=gr.Progress(track_tqdm=True)):
        lang = lang_of(request)
        why = holder.refusal(operator_token, lang)
        if why is not None:
            raise refusal(why)
        unavailable = available_devices().get(device_name)
        if unavailable is not None:
            said = t(lang, "header.unavailable", device=device_name, why=unavailable)
            gr.Warning(said)
            return f"⚠️ {said}. {t(lang, 'header.still_serving', status=holder.status_in(lang))}", *serving(holder)
        progress(0, desc=t(lang, "header.loading", model=model_name))
        try:
            config = wanted(model_name, device_name, dtype_name, block_size_tokens, kv_blocks, prefix_cache)
            holder.load(config)
            return holder.status_in(lang), *serving(holder)
        except (ValueError, OSError) as e:  # offline hub id, bad checkpoint, no memory: keep serving
            message = html.escape(localize_error(e, lang), quote=False)  # a `<dir>` in it is text, not a tag
            gr.Warning(first_line(message))
            return f"⚠️ {message}<br>{t(lang, 'header.still_serving', status=holder.status_in(lang))}", \
                *serving(holder)

    def rebuild_if_changed(model_name, device_name, dtype_name, block_size_tokens, kv_blocks, prefix_cache,
                           operator_token, request: gr.Request = None, progress=gr.Progress(track_tqdm=True)):
        """A setting's widget was used: rebuild only when its value really differs from what serves (opening a
        dropdown and leaving it, tabbing through, re-picking the current value, or a select's later blur: no)."""
        try:
            config = wanted(model_name, device_name, dtype_name, block_size_tokens, kv_blocks, prefix_cache)
        except (ValueError, TypeError):
            config = None  # let rebuild() say what is wrong
        failed_just_now = config == tried["config"] and time.monotonic() - tried["at"] < RETRY_AFTER_S
        if config == holder.config or failed_just_now:  # e.g. the blur after a select that failed
            return (gr.skip(),) * (len(widgets) + 1)
        tried.update(config=config, at=time.monotonic())
        out = rebuild(model_name, device_name, dtype_name, block_size_tokens, kv_blocks, prefix_cache,
                      operator_token, request, progress)
        tried.update(at=time.monotonic())  # the window counts from the end of the attempt
        return out

    def unlock_or_refuse(operator_token, request: gr.Request = None):
        """The API's unlock: refused (an error) without the right token."""
        why = holder.refusal(operator_token, lang_of(request))
        if why is not None:
            raise refusal(why)
        return [gr.update(interactive=True) for _ in range(len(widgets) + 1)]

    def unlock(operator_token, request: gr.Request = None):
        """The page's unlock (Enter in the token field): says whether it worked, never an error on the widgets."""
        lang = lang_of(request)
        if holder.refusal(operator_token) is not None:
            gr.Warning(t(lang, "header.wrong_token"))
            return (*[gr.skip()] * (len(widgets) + 1), gr.update(value=t(lang, "header.wrong_token_note"),
                                                                 visible=True), gr.skip(), gr.skip())
        gr.Info(t(lang, "header.unlocked"))
        return (*[gr.update(interactive=True) for _ in range(len(widgets) + 1)],
                gr.update(value=t(lang, "header.unlocked_note"), visible=True),
                gr.update(value=holder.rebuild_cost(lang), visible=True), gr.Timer(active=True))

    outputs = [status, *widgets]
    gr.on([model.input, device.input, dtype.input, strategy.input, block_size.submit, num_blocks.submit],
          rebuild_if_changed, widgets + [token], outputs, api_name=False, concurrency_id="rebuild",
          concurrency_limit=1).then(cost_now, None, cost, api_name=False, show_progress="hidden")
    apply.click(rebuild, widgets + [token], outputs, api_name="rebuild", concurrency_id="rebuild",
                concurrency_limit=1, api_description="Rebuild the engine with these settings (refused for visitors "
                                                     "of a shared deployment without the operator token).").then(
        cost_now, None, cost, api_name=False, show_progress="hidden")

    def engine_status(request: gr.Request):
        return holder.status_in(lang_of(request)), *serving(holder)
    demo.load(engine_status, None, [status, *widgets], api_name="engine_status", show_progress="hidden",
              api_description="The engine now serving: its status line and settings.")
    cost_timer.tick(cost_now, None, cost, api_name=False, show_progress="hidden", queue=False)
    if switch is not None:  # the status line, the device notes and the rebuild note in the chosen language
        def relang(chosen, request: gr.Request):
            LANGUAGES.set(request, chosen)
            choices, reasons = device_choices(chosen)
            return holder.status_in(chosen), gr.update(choices=choices, info=reasons), \
                gr.update(choices=model_choices(holder.config.model, chosen)), \
                holder.rebuild_cost(chosen) if editable else gr.skip()
        switch.change(relang, switch, [status, device, model, cost], api_name=False, queue=False)
    token.submit(unlock, [token], [*widgets, apply, note, cost, cost_timer], api_name=False,
                 trigger_mode="always_last")  # Enter again while a try is pending: runs after it, never dropped
    unlock_api = gr.Button("unlock", visible=False)  # the API's endpoint; the page's Enter uses unlock()
    unlock_api.click(unlock_or_refuse, [token], widgets + [apply], api_name="unlock_header", queue=False,
                     api_description="Operator only: make the header's settings editable on a shared deployment.")
    return status


def first_line(message: str) -> str:
    """A toast says the gist (its start and its advice at the end); the status line keeps the whole message."""
    return message if len(message) <= 320 else f"{message[:140].rstrip()} … {message[-170:].lstrip()}"
