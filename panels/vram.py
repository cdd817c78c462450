"""VRAM budget tab: minivlm.budget.estimate for a model, a device (one GPU or several, tensor parallel) and a workload:
the plan per GPU as a stacked bar, the workload's KV demand against the pool, why it does not fit in words, which
GPUs would fit it, the matrix VLMs on 16 / 24 / 48 / 80 GB GPUs, and what this engine really allocated
(memory_report)."""
import gradio as gr
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minivlm.budget import device_presets, estimate, gpus_needed, load_model_preset, model_preset_names, model_shape
from minivlm.budget.limits import limit_names
from minivlm.budget.planner import MATRIX_GPUS, MATRIX_VLMS, plan_matrix

from panels.holder import EngineHolder, gpu

THIS_ENGINE = "this engine's model"
CUSTOM = "custom size"
SEGMENTS = [("LLM weights", "#1f77b4"), ("vision encoder", "#9467bd"), ("activations", "#ff7f0e"),
            ("KV cache", "#2ca02c"), ("overhead", "#7f7f7f")]
TP_SIZES = [1, 2, 4, 8]
EXAMPLE_72B = ("Qwen2.5-VL-72B-Instruct", 4, 32768, 8)  # model, images per request, context, concurrent requests
GIB = 2 ** 30
# Picker titles per model_type, in the order the families are listed.
FAMILY_TITLES = {"qwen3_vl": "Qwen3-VL", "qwen2_5_vl": "Qwen2.5-VL", "qwen2_vl": "Qwen2-VL", "smolvlm": "SmolVLM2",
                 "idefics3": "Idefics3", "internvl": "InternVL3.5", "qwen3": "Qwen3 (text)",
                 "qwen2": "Qwen2.5 (text)"}


def preset_choices() -> list[tuple[str, str]]:
    """The model picker: (family title · preset, preset), grouped by family, this engine's model first."""
    types = {name: load_model_preset(name)["model_type"] for name in model_preset_names()}
    order = list(FAMILY_TITLES)
    ranked = sorted(types, key=lambda n: (order.index(types[n]) if types[n] in order else len(order), n))
    return [(THIS_ENGINE, THIS_ENGINE)] + [(f"{FAMILY_TITLES.get(types[n], types[n])} · {n}", n) for n in ranked]


def matrix_cell(est) -> str:
    """One model on one GPU, short enough for a phone: fits (requests at once) or the limits it hits."""
    if est.fits:
        return f"✓ fits · {est.workload_concurrency:,} at once"
    return f"✗ {' + '.join(limit_names(est))} · {est.workload_concurrency:,} at once"


def matrix_table(plans) -> pd.DataFrame:
    """The matrix VLMs (rows) on one GPU of each size (columns), with each model's tokens per image."""
    rows = [(model, f"{ests[0].vision_tokens_per_image:,}" + (f" ({ests[0].image_tiles} tiles)"
                                                               if ests[0].image_tiles > 1 else ""),
             *(matrix_cell(e) for e in ests)) for model, ests in plans.items()]
    return pd.DataFrame(rows, columns=["model", "vision tokens / image"] + [f"{size} ({gpu})" for size, gpu in
                                                                             MATRIX_GPUS])


def estimate_parts(est) -> list[int]:
    """Bytes per bar segment of an estimate, in SEGMENTS order."""
    return [est.text_weights_bytes, est.vision_weights_bytes, est.activation_peak_bytes, est.kv_cache_bytes,
            est.overhead_bytes]


def engine_parts(rep) -> list[int]:
    """Bytes per bar segment of a MemoryReport (activations only where the device reports a peak)."""
    held = rep.weights_bytes + rep.kv_cache_bytes
    act = max(0, rep.peak_bytes - held) if rep.peak_bytes is not None else 0
    return [rep.weights_bytes - rep.vision_weights_bytes, rep.vision_weights_bytes, act, rep.kv_cache_bytes, 0]


def budget_figure(est_parts, eng_parts, memory_bytes: int, budget_bytes: int, device: str, engine_device: str,
                  kv_tokens: tuple[int, int, str] | None = None):
    """Two stacked bars (GiB), each on its own scale: the estimate per GPU against the device's memory and budget
    lines, and what this engine holds now; below, when kv_tokens = (pool, demand, demand label) is given, the
    workload's KV demand against the pool in tokens. Every label sits beside a bar or in the legend, never on one."""
    rows = 2 if kv_tokens else 1
    fig = make_subplots(rows=rows, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.12, vertical_spacing=0.2,
                        row_heights=[0.72, 0.28][:rows], specs=[[{}, {}]] + ([[{"colspan": 2}, None]] if kv_tokens
                                                                             else []),
                        subplot_titles=[f"estimate per GPU on {device}", f"this engine now ({engine_device})"]
                        + (["KV cache: this workload's demand against the pool (tokens)"] if kv_tokens else []))
    for col, parts in ((1, est_parts), (2, eng_parts)):
        for (name, color), b in zip(SEGMENTS, parts):
            fig.add_trace(go.Bar(name=name, x=["memory"], y=[b / GIB],
                                 marker_color=color, legendgroup=name, showlegend=col == 1,
                                 hovertemplate=f"{name}: %{{y:.4f}} GiB<extra></extra>"), row=1, col=col)
    fig.add_hline(memory_bytes / GIB, line=dict(color="black", width=2), row=1, col=1, showlegend=True,
                  name=f"device memory {memory_bytes / GIB:.1f} GiB")
    fig.add_hline(budget_bytes / GIB, line=dict(color="red", dash="dash"), row=1, col=1, showlegend=True,
                  name=f"budget {budget_bytes / GIB:.1f} GiB")
    if kv_tokens:
        pool, demand, label = kv_tokens
        fig.add_trace(go.Bar(y=[label, f"KV pool: {pool:,} tokens"], x=[demand, pool], orientation="h",
                             marker_color=["#d62728" if demand > pool else "#17becf", "#2ca02c"], showlegend=False,
                             name="KV demand vs pool", hovertemplate="%{y}<extra></extra>"), row=2, col=1)
        fig.update_xaxes(title_text="tokens", row=2, col=1)
    fig.update_layout(barmode="stack", height=640 if kv_tokens else 420, margin=dict(l=10, r=10, t=40, b=10),
                      legend=dict(orientation="h", yanchor="top", y=-0.12 if kv_tokens else -0.08, x=0))
    fig.update_yaxes(title_text="GiB", row=1)
    return fig


def comparison(est, rep) -> pd.DataFrame:
    """The estimate and the running engine side by side."""
    rows = [("weights (MiB)", est.weights_bytes / 2**20, rep.weights_bytes / 2**20),
            ("vision weights (MiB)", est.vision_weights_bytes / 2**20, rep.vision_weights_bytes / 2**20),
            ("KV bytes / token", est.kv_bytes_per_token, rep.kv_bytes_per_token),
            ("KV blocks", est.num_blocks, rep.num_blocks),
            ("KV cache (MiB)", est.kv_cache_bytes / 2**20, rep.kv_cache_bytes / 2**20),
            ("KV tokens", est.num_blocks * est.block_size, rep.kv_cache_tokens),
            ("max concurrency (x)", est.max_concurrency, rep.max_concurrency),
            ("peak (MiB)", None, None if rep.peak_bytes is None else rep.peak_bytes / 2**20)]
    return pd.DataFrame([(k, _fmt(a), _fmt(b)) for k, a, b in rows],
                        columns=["quantity", "estimate (per GPU)", f"this engine now ({rep.device}, {rep.dtype})"])


def gpu_table(plans) -> pd.DataFrame:
    """The planner's answer per device: the fewest GPUs that fit, per-GPU weights, and the limit where none do."""
    rows = []
    for p in plans:
        e = p.estimate
        rows.append((p.device, f"{p.gpus} × {p.device}" if p.gpus else "none up to 8",
                     _fmt(e.weights_bytes / GIB) if e else "n/a", _fmt(e.workload_concurrency) if e else "n/a",
                     "" if p.gpus else p.reason))
    return pd.DataFrame(rows, columns=["GPU", "fewest that fit", "weights per GPU (GiB)", "requests at once",
                                       "why not (at the most GPUs tried)"])


def headline(est, device: str, n_seqs: int) -> str:
    """The verdict in words: blocks and concurrency, and, when it does not fit, every limit it hits."""
    gpus = (f" · {est.tensor_parallel_size} GPUs, tensor parallel: every figure is per GPU, the KV pool spans them"
            if est.tensor_parallel_size > 1 else "")
    tiles = f" in {est.image_tiles} tiles" if est.image_tiles > 1 else ""
    images = ("text-only model, no images" if est.text_only else f"{est.vision_tokens_per_image:,} vision tokens per "
              f"image resized to {est.resized_image[1]}×{est.resized_image[0]}{tiles}")
    text = (f"### {'Fits' if est.fits else 'Does not fit'}: {est.num_blocks:,} KV blocks = {est.kv_pool_tokens:,} "
            f"tokens · max concurrency **{est.max_concurrency:.2f}x** at {est.max_model_len:,} tokens · this "
            f"workload ({est.needed_tokens_per_request:,} tokens per request, {images}): "
            f"**{est.workload_concurrency:,}** requests at once (asked for {n_seqs}) on {device}{gpus}")
    return text + "".join(f"\n- **{limit}**" for limit in est.limits)


def base_device(name: str) -> str:
    """The single-GPU preset of a multi-GPU one ('4× H100 80GB' -> 'H100 80GB')."""
    return name.split("× ", 1)[1] if "× " in name else name


def device_for(device: str, tp: int) -> str:
    """The preset that matches a GPU count: the multi-GPU preset of that size when one exists, else the single GPU."""
    if device == CUSTOM or "× " not in device and tp == 1:
        return device
    multi = f"{tp}× {base_device(device)}"
    return multi if tp > 1 and multi in device_presets() else base_device(device)


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:,.2f}" if isinstance(v, float) else f"{v:,}"


def build(holder: EngineHolder):
    """Lay out the VRAM tab and wire its events (api names: vram, vram_gpus); returns what the page runs on load."""
    devices = device_presets()
    with gr.Row():
        model = gr.Dropdown(preset_choices(), value="Qwen2.5-VL-3B-Instruct", label="Model", elem_id="vram-model")
        device = gr.Dropdown(list(devices) + [CUSTOM], value="L4", label="Device", elem_id="vram-device")
        memory_gb = gr.Number(24, label="custom device memory (GiB)", minimum=0.1, visible=False)
        tp = gr.Radio(TP_SIZES, value=1, label="GPUs (tensor parallel)", elem_id="vram-tp")
        util = gr.Slider(0.1, 1.0, value=0.9, step=0.01, label="gpu_memory_utilization")
    with gr.Row():
        width = gr.Number(1024, label="image width (px)", precision=0, minimum=1)
        height = gr.Number(768, label="image height (px)", precision=0, minimum=1)
        images = gr.Slider(0, 8, value=1, step=1, label="images per request", elem_id="vram-images")
        context = gr.Number(4096, label="context length (max_model_len)", precision=0, minimum=1,
                            elem_id="vram-context")
        seqs = gr.Slider(1, 256, value=8, step=1, label="concurrent requests", elem_id="vram-seqs")
    with gr.Row():
        dtype = gr.Dropdown(["bfloat16", "float16", "float32", "int8", "int4"], value="bfloat16", label="weights dtype")
        kv_dtype = gr.Dropdown(["auto", "bfloat16", "float16", "float32", "fp8"], value="auto", label="KV cache dtype")
        block_size = gr.Dropdown([8, 16, 32, 64], value=16, label="block size")
        example = gr.Button("Which GPUs for 72B, 4 images per request, 32k context?", elem_id="vram-example-72b")
    summary = gr.Markdown(label="Does it fit (and why not)", elem_id="vram-headline")
    figure = gr.Plot(label="Memory plan", elem_id="vram-plot")
    gpus = gr.Dataframe(label="Which GPUs fit this workload (fewest of each GPU model, tensor parallel up to 8)",
                        wrap=True, column_widths=["12%", "14%", "10%", "9%", "55%"], max_height=520,
                        elem_id="vram-gpus")
    matrix = gr.Dataframe(label="The matrix VLMs on one 16 / 24 / 48 / 80 GB GPU at this image size, context and "
                          "workload (fits, requests at once, or the limit hit)", wrap=True, elem_id="vram-matrix")
    versus = gr.Dataframe(label="Estimate vs this engine now", elem_id="vram-engine")
    breakdown = gr.Dataframe(label="Breakdown (formulas)", wrap=True, column_widths=["22%", "8%", "70%"],
                             elem_id="vram-breakdown")

    def workload(model_name, utilization, image_width, image_height, images_per_request, context_length,
                 concurrent_requests, weights_dtype, kv_cache_dtype, block_size) -> tuple:
        config = holder.get().hf_config if model_name == THIS_ENGINE else model_name
        images = int(images_per_request) if model_name is None or model_shape(config).has_vision else 0  # text-only
        return config, dict(dtype=weights_dtype, kv_dtype=kv_cache_dtype, max_model_len=int(context_length or 0),
                            num_seqs=int(concurrent_requests), images_per_request=images,
                            image_size=(int(image_width or 0), int(image_height or 0)),
                            gpu_memory_utilization=float(utilization), block_size=int(block_size))

    @gpu
    def calculate(model_name, device_name, custom_memory_gib, utilization, image_width, image_height,
                  images_per_request, context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size,
                  gpus=1):
        report = holder.get().memory_report()  # inside the GPU function: on ZeroGPU the device exists only here
        config, work = workload(model_name, utilization, image_width, image_height, images_per_request,
                                context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size)
        where = {"device_memory_gb": float(custom_memory_gib or 0)} if device_name == CUSTOM else {"device": device_name}
        multi = device_name != CUSTOM and devices[device_name].get("gpus", 1) > 1  # the preset fixes the count
        try:
            est = estimate(config, **work, **where, tensor_parallel_size=None if multi else int(gpus or 1))
        except ValueError as e:
            raise gr.Error(str(e))
        shown = device_name if device_name != CUSTOM else f"{custom_memory_gib} GiB"
        demand = (f"{est.num_seqs:,} requests × {est.kv_demand_tokens // est.num_seqs:,}: "
                  f"{est.kv_demand_tokens:,} tokens")
        title = shown if est.tensor_parallel_size == 1 or multi else f"{est.tensor_parallel_size} × {shown}"
        fig = budget_figure(estimate_parts(est), engine_parts(report), est.memory_bytes, est.budget_bytes, title,
                            report.device, kv_tokens=(est.kv_pool_tokens, est.kv_demand_tokens, demand))
        table = pd.DataFrame([(b.name, f"{b.bytes / GIB:,.3f}", b.formula) for b in est.breakdown],
                             columns=["item", "GiB", "formula"])
        return headline(est, shown, int(concurrent_requests)), fig, comparison(est, report), table

    def plan(model_name, utilization, image_width, image_height, images_per_request, context_length,
             concurrent_requests, weights_dtype, kv_cache_dtype, block_size):
        config, work = workload(model_name, utilization, image_width, image_height, images_per_request,
                                context_length, concurrent_requests, weights_dtype, kv_cache_dtype, block_size)
        try:
            return gpu_table(gpus_needed(config, **work))
        except ValueError as e:
            raise gr.Error(str(e))

    def matrix_plan(utilization, image_width, image_height, images_per_request, context_length, concurrent_requests,
                    weights_dtype, kv_cache_dtype, block_size):
        _, work = workload(None, utilization, image_width, image_height, images_per_request, context_length,
                           concurrent_requests, weights_dtype, kv_cache_dtype, block_size)
        try:
            return matrix_table(plan_matrix(**work))
        except ValueError as e:
            raise gr.Error(str(e))

    def load(*values):
        return *calculate(*values), plan(values[0], *values[3:12]), matrix_plan(*values[3:12])

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

    device.change(lambda d: gr.Number(visible=d == CUSTOM), device, memory_gb, api_name=False, queue=False)
    device.change(on_device, [device, tp], tp, api_name=False, queue=False)
    tp.change(on_gpus, [device, tp], device, api_name=False, queue=False)
    example.click(the_72b_question, None, [model, images, context, seqs, device, tp], api_name=False)
    inputs = [model, device, memory_gb, util, width, height, images, context, seqs, dtype, kv_dtype, block_size, tp]
    outputs = [summary, figure, versus, breakdown]
    gr.on([c.change for c in inputs], calculate, inputs, outputs, api_name="vram", concurrency_id="vram",
          concurrency_limit=1, show_progress="hidden")
    plan_inputs = [model, util, width, height, images, context, seqs, dtype, kv_dtype, block_size]
    gr.on([c.change for c in plan_inputs], plan, plan_inputs, gpus, api_name="vram_gpus", concurrency_id="vram",
          show_progress="hidden")
    gr.on([c.change for c in plan_inputs[1:]], matrix_plan, plan_inputs[1:], matrix, api_name="vram_matrix",
          concurrency_id="vram", show_progress="hidden")
    return load, inputs, outputs + [gpus, matrix]
