"""VRAM budget tab: minivlm.budget.estimate for a model, a device (one GPU or several, tensor parallel) and a workload:
the plan per GPU as a stacked bar, the workload's KV demand against the pool, why it does not fit in words, which
GPUs would fit it, the matrix VLMs on 16 / 24 / 48 / 80 GB GPUs, and what this engine really allocated
(memory_report). A hybrid model (Qwen3.5, Gemma 3, Gemma 4) shows its KV-cache groups row by row (Gemma 4's
shared-KV layers as a free row) and how many more requests it fits than a model of its dimensions whose every layer
were full attention (chunked prefill: a sliding request holds its window plus one step's chunk)."""
import gradio as gr
import pandas as pd

from minivlm.budget import (DEFAULT_SOFT_TOKENS, SOFT_TOKEN_BUDGETS, SOFT_TOKEN_FAMILIES, device_presets, estimate,
                            gpus_needed, load_model_preset, model_preset_names, model_shape)
from minivlm.budget.planner import MATRIX_VLMS, plan_matrix  # noqa: F401

from panels.holder import EngineHolder, gpu
from panels.page import header_widths
from panels.i18n import EN, LANGUAGES, L, lang_of, t
from panels.i18n.budget import limit_sentences
from panels.vram_figure import SEGMENTS, budget_figure, engine_parts, estimate_parts  # noqa: F401
from panels.vram_tables import (breakdown_table, comparison, gpu_table, headline, matrix_cell, matrix_table,  # noqa: F401
                                _fmt)
from panels.i18n.errors import localize_error

THIS_ENGINE = "this engine's model"
CUSTOM = "custom size"
TP_SIZES = [1, 2, 4, 8]
EXAMPLE_72B = ("Qwen2.5-VL-72B-Instruct", 4, 32768, 8)  # model, images per request, context, concurrent requests
# Picker titles per model_type, in the order the families are listed.
FAMILY_TITLES = {"qwen3_vl": "Qwen3-VL", "qwen2_5_vl": "Qwen2.5-VL", "qwen2_vl": "Qwen2-VL", "smolvlm": "SmolVLM2",
                 "idefics3": "Idefics3", "internvl": "InternVL3.5", "qwen3_5": "Qwen3.5 (hybrid)",
                 "gemma3": "Gemma 3 (hybrid)", "gemma4": "Gemma 4 (hybrid, shared KV)",
                 "gemma4_unified": "Gemma 4 (no vision encoder)", "qwen3": "Qwen3 (text)", "qwen2": "Qwen2.5 (text)"}


def preset_choices(lang: str = EN) -> list[tuple[str, str]]:
    """The model picker: (family title · preset, preset), grouped by family, this engine's model first."""
    types = {name: load_model_preset(name)["model_type"] for name in model_preset_names()}
    order = list(FAMILY_TITLES)
    ranked = sorted(types, key=lambda n: (order.index(types[n]) if types[n] in order else len(order), n))
    return [(t(lang, "vram.this_engine"), THIS_ENGINE)] + [(f"{FAMILY_TITLES.get(types[n], types[n])} · {n}", n) for n in ranked]


def takes_soft_tokens(config) -> bool:
    """Whether a model's images are sized by a soft-token budget (Gemma 4's max_soft_tokens): the tab's budget knob
    shows for it only."""
    return model_shape(config).family in SOFT_TOKEN_FAMILIES


def base_device(name: str) -> str:
    """The single-GPU preset of a multi-GPU one ('4× H100 80GB' -> 'H100 80GB')."""
    return name.split("× ", 1)[1] if "× " in name else name


def device_for(device: str, tp: int) -> str:
    """The preset that matches a GPU count: the multi-GPU preset of that size when one exists, else the single GPU."""
    if device == CUSTOM or "× " not in device and tp == 1:
        return device
    multi = f"{tp}× {base_device(device)}"
    return multi if tp > 1 and multi in device_presets() else base_device(device)


def device_choices(devices, lang: str = EN) -> list[tuple[str, str]]:
    return [(d, d) for d in devices] + [(t(lang, "vram.custom"), CUSTOM)]


def build(holder: EngineHolder, switch: gr.Radio | None = None):
    """Lay out the VRAM tab and wire its events (api names: vram, vram_gpus); returns what the page runs on load.
    `switch`: the header's language switch (the tab recomputes in the chosen language)."""
    devices = device_presets()
    with gr.Row():
        model = gr.Dropdown(preset_choices(), value="Qwen2.5-VL-3B-Instruct", label=L("vram.model"),
                            elem_id="vram-model")
        device = gr.Dropdown(device_choices(devices), value="L4", label=L("vram.device"), elem_id="vram-device")
        memory_gb = gr.Number(24, label=L("vram.memory"), minimum=0.1, visible=False)
        tp = gr.Radio(TP_SIZES, value=1, label=L("vram.tp"), elem_id="vram-tp")
        util = gr.Slider(0.1, 1.0, value=0.9, step=0.01, label=L("vram.util"))
    with gr.Row():
        width = gr.Number(1024, label=L("vram.width"), precision=0, minimum=1)
        height = gr.Number(768, label=L("vram.height"), precision=0, minimum=1)
        soft = gr.Dropdown(list(SOFT_TOKEN_BUDGETS), value=DEFAULT_SOFT_TOKENS, label=L("vram.soft_tokens"),
                           elem_id="vram-soft-tokens", visible=False)  # Gemma 4's max_soft_tokens, shown for it only
        images = gr.Slider(0, 8, value=1, step=1, label=L("vram.images"), elem_id="vram-images")
        context = gr.Number(4096, label=L("vram.context"), precision=0, minimum=1, elem_id="vram-context")
        seqs = gr.Slider(1, 256, value=8, step=1, label=L("vram.seqs"), elem_id="vram-seqs")
    with gr.Row():
        dtype = gr.Dropdown(["bfloat16", "float16", "float32", "int8", "int4"], value="bfloat16", label=L("vram.dtype"),
                            elem_id="vram-dtype")
        kv_dtype = gr.Dropdown(["auto", "bfloat16", "float16", "float32", "fp8"], value="auto", label=L("vram.kv_dtype"))
        block_size = gr.Dropdown([8, 16, 32, 64], value=16, label=L("vram.block_size"))
        chunk = gr.Number(0, label=L("vram.chunk"), precision=0, minimum=0, elem_id="vram-chunk")
        example = gr.Button(L("vram.example"), elem_id="vram-example-72b")
    with gr.Row():  # a video workload: its frames are the image size above
        n_videos = gr.Slider(0, 4, value=0, step=1, label=L("vram.videos"), elem_id="vram-videos")
        video_s = gr.Number(10, label=L("vram.video_s"), minimum=0.1, elem_id="vram-video-s")
        video_fps = gr.Number(2, label=L("vram.video_fps"), minimum=0.1, elem_id="vram-video-fps")
    video_summary = gr.Markdown(label=L("vram.video_summary"), elem_id="vram-video-summary")
    summary = gr.Markdown(label=L("vram.headline"), elem_id="vram-headline")
    figure = gr.Plot(label=L("vram.plot"), elem_id="vram-plot")
    # no header breaks inside a word (gradio sizes an "auto" column by its cells; one letter a line on a phone)
    gpus = gr.Dataframe(label=L("vram.gpus"), wrap=True, max_height=520, elem_id="vram-gpus",
                        column_widths=header_widths(gpu_table([]).columns, {0: "auto", 1: "auto", 5: "50%"}))
    matrix = gr.Dataframe(label=L("vram.matrix"), wrap=True, elem_id="vram-matrix")
    versus = gr.Dataframe(label=L("vram.versus"), elem_id="vram-engine")
    # fixed item and GiB columns (a phone scrolls the table sideways), the formulas wrap in the rest
    breakdown = gr.Dataframe(label=L("vram.breakdown"), wrap=True, column_widths=["170px", "88px", "70%"],
                             elem_id="vram-breakdown")

    def workload(model_name, utilization, image_width, image_height, images_per_request, context_length,
                 concurrent_requests, weights_dtype, kv_cache_dtype, block_size, chunk=0, soft_tokens=None) -> tuple:
        config = holder.get().hf_config if model_name == THIS_ENGINE else model_name
        images = int(images_per_request) if model_name is None or model_shape(config).has_vision else 0  # text-only
        step = int(chunk or 0)  # chunked prefill's tokens per step; 0: off (a prefill is one step)
        budget = int(soft_tokens) if soft_tokens and model_name is not None and takes_soft_tokens(config) else None
        return config, dict(dtype=weights_dtype, kv_dtype=kv_cache_dtype, max_model_len=int(context_length or 0),
                            num_seqs=int(concurrent_requests), images_per_request=images,
                            image_size=(int(image_width or 0), int(image_height or 0)),
                            gpu_memory_utilization=float(utilization), block_size=int(block_size),
                            **(dict(enable_chunked_prefill=True, max_num_batched_tokens=step) if step > 0 else {}),
                            **(dict(max_soft_tokens=budget) if budget else {}))

    @gpu
    def calculate(model_name, device_name, custom_memory_gib, utilization, image_width, image_height,
                  images_per_request, context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size,
                  gpus=1, chunk=0, soft_tokens=None, request: gr.Request = None):
        lang = lang_of(request)
        report = holder.get().memory_report()  # inside the GPU function: on ZeroGPU the device exists only here
        config, work = workload(model_name, utilization, image_width, image_height, images_per_request,
                                context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size, chunk,
                                soft_tokens)
        where = {"device_memory_gb": float(custom_memory_gib or 0)} if device_name == CUSTOM else {"device": device_name}
        multi = device_name != CUSTOM and devices[device_name].get("gpus", 1) > 1  # the preset fixes the count
        try:
            est = estimate(config, **work, **where, tensor_parallel_size=None if multi else int(gpus or 1))
        except ValueError as e:
            raise gr.Error(localize_error(e, lang))
        shown = device_name if device_name != CUSTOM else f"{custom_memory_gib} GiB"
        demand = t(lang, "fig.demand", n=f"{est.num_seqs:,}", each=f"{est.kv_demand_tokens // est.num_seqs:,}",
                   total=f"{est.kv_demand_tokens:,}")
        title = shown if est.tensor_parallel_size == 1 or multi else f"{est.tensor_parallel_size} × {shown}"
        fig = budget_figure(estimate_parts(est), engine_parts(report), est.memory_bytes, est.budget_bytes, title,
                            report.device, kv_tokens=(est.kv_pool_tokens, est.kv_demand_tokens, demand), lang=lang)
        table = breakdown_table(est, lang)
        quantized = holder.get().config.quantization
        return headline(est, shown, int(concurrent_requests), lang), fig, comparison(est, report, lang, quantized), \
            table

    def plan(model_name, utilization, image_width, image_height, images_per_request, context_length,
             concurrent_requests, weights_dtype, kv_cache_dtype, block_size, chunk=0, soft_tokens=None,
             request: gr.Request = None):
        config, work = workload(model_name, utilization, image_width, image_height, images_per_request,
                                context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size, chunk,
                                soft_tokens)
        try:
            return gpu_table(gpus_needed(config, **work), lang_of(request))
        except ValueError as e:
            raise gr.Error(localize_error(e, lang_of(request)))

    def matrix_plan(utilization, image_width, image_height, images_per_request, context_length, concurrent_requests,
                    weights_dtype, kv_cache_dtype, block_size, chunk=0, request: gr.Request = None):
        _, work = workload(None, utilization, image_width, image_height, images_per_request, context_length,
                           concurrent_requests, weights_dtype, kv_cache_dtype, block_size, chunk)
        try:
            return matrix_table(plan_matrix(**work), lang_of(request))
        except ValueError as e:
            raise gr.Error(localize_error(e, lang_of(request)))

    def video_row(model_name, device_name, custom_memory_gib, utilization, image_width, image_height,
                  images_per_request, context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size,
                  gpus, chunk, soft_tokens, videos, seconds, sampled_fps, request: gr.Request = None):
        """The workload above plus `videos` videos of `seconds` at `fps` per request, counted as the engine would."""
        if not videos:
            return ""
        config, work = workload(model_name, utilization, image_width, image_height, images_per_request,
                                context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size, chunk,
                                soft_tokens)
        where = {"device_memory_gb": float(custom_memory_gib or 0)} if device_name == CUSTOM else \
            {"device": device_name}
        multi = device_name != CUSTOM and devices[device_name].get("gpus", 1) > 1
        try:
            est = estimate(config, **work, **where, tensor_parallel_size=None if multi else int(gpus or 1),
                           videos_per_request=int(videos), video_seconds=float(seconds or 0),
                           video_fps=float(sampled_fps or 0))
        except ValueError as e:
            return t(lang_of(request), "vram.video_error", error=localize_error(e, lang_of(request)))
        v, lang = est.video, lang_of(request)
        return (t(lang, "vram.video_line", secs=f"{float(seconds):g}", fps=f"{float(sampled_fps):g}", w=int(image_width),
                  h=int(image_height), frames=v.frames, pairs=v.pairs, per_pair=v.tokens_per_pair,
                  tokens=f"{v.vision_tokens:,}", markers=v.marker_tokens, n=int(videos),
                  per_request=f"{est.needed_tokens_per_request:,}", at_once=f"{est.workload_concurrency:,}")
                + "".join(f"<br>{x}" for x in limit_sentences(est, lang)))

    def load(model_name, device_name, custom_memory_gib, utilization, image_width, image_height, images_per_request,
             context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size, gpus, chunk=0,
             soft_tokens=None, request: gr.Request = None):
        values = (model_name, device_name, custom_memory_gib, utilization, image_width, image_height,
                  images_per_request, context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size,
                  gpus, chunk, soft_tokens)
        return (*calculate(*values, request=request), plan(values[0], *values[3:12], chunk, soft_tokens,
                                                           request=request),
                matrix_plan(*values[3:12], chunk, request=request))

    def on_device(device_name, n_gpus):
        count = devices.get(device_name, {}).get("gpus", 1)
        return gr.skip() if count == 1 or count == n_gpus else count

    def on_gpus(device_name, n_gpus):
        target = device_for(device_name, int(n_gpus))
        return gr.skip() if target == device_name else target

    def the_72b_question():
        name, n_images, ctx, n_seqs = EXAMPLE_72B
        h100 = gpus_needed(name, devices=["H100 80GB"], images_per_request=n_images, max_model_len=ctx,
                           num_seqs=n_seqs)[0]
        n = h100.gpus or 8
        return name, n_images, ctx, n_seqs, device_for("H100 80GB", n), n

    def engine_weights(model_name):  # "this engine's model": its weights as the engine holds them (int8 too)
        engine = holder.get()
        return engine.config.quantization or engine.memory_report().dtype if model_name == THIS_ENGINE else gr.skip()
    model.input(engine_weights, model, dtype, api_name=False, queue=False)
    model.change(lambda m: gr.update(visible=takes_soft_tokens(holder.get().hf_config if m == THIS_ENGINE else m)),
                 model, soft, api_name=False, queue=False)
    device.change(lambda d: gr.Number(visible=d == CUSTOM), device, memory_gb, api_name=False, queue=False)
    device.change(on_device, [device, tp], tp, api_name=False, queue=False)
    tp.change(on_gpus, [device, tp], device, api_name=False, queue=False)
    example.click(the_72b_question, None, [model, images, context, seqs, device, tp], api_name=False)
    inputs = [model, device, memory_gb, util, width, height, images, context, seqs, dtype, kv_dtype, block_size, tp,
              chunk, soft]
    outputs = [summary, figure, versus, breakdown]
    gr.on([c.change for c in inputs], calculate, inputs, outputs, api_name="vram", concurrency_id="vram",
          concurrency_limit=1, show_progress="hidden")
    video_inputs = inputs + [n_videos, video_s, video_fps]
    gr.on([c.change for c in video_inputs], video_row, video_inputs, video_summary, api_name="vram_video",
          concurrency_id="vram", show_progress="hidden")
    plan_inputs = [model, util, width, height, images, context, seqs, dtype, kv_dtype, block_size, chunk, soft]
    gr.on([c.change for c in plan_inputs], plan, plan_inputs, gpus, api_name="vram_gpus", concurrency_id="vram",
          show_progress="hidden")
    gr.on([c.change for c in plan_inputs[1:-1]], matrix_plan, plan_inputs[1:-1], matrix, api_name="vram_matrix",
          concurrency_id="vram", show_progress="hidden")
    if switch is not None:  # the whole tab again, in the chosen language
        def relang(chosen, model_name, device_name, custom_memory_gib, utilization, image_width, image_height,
                   images_per_request, context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size,
                   gpus, chunk, soft_tokens, videos, seconds, sampled_fps, request: gr.Request):
            LANGUAGES.set(request, chosen)
            values = (model_name, device_name, custom_memory_gib, utilization, image_width, image_height,
                      images_per_request, context_length, concurrent_requests, weights_dtype, kv_cache_dtype,
                      block_size, gpus, chunk, soft_tokens)
            return (gr.update(choices=preset_choices(chosen)), gr.update(choices=device_choices(devices, chosen)),
                    *load(*values, request=request), video_row(*values, videos, seconds, sampled_fps, request=request))
        switch.change(relang, [switch, *video_inputs], [model, device, *outputs, gpus, matrix, video_summary],
                      api_name=False, concurrency_id="vram", show_progress="hidden")
    return load, inputs, outputs + [gpus, matrix]
