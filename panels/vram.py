"""VRAM budget tab: minivlm.budget.estimate for a model and device preset and a workload, as a stacked bar against
the device line, next to what this engine really allocated (memory_report)."""
import json
import os

import gradio as gr
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minivlm.budget import estimate

from panels.holder import EngineHolder, gpu

PRESETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "presets")
THIS_ENGINE = "this engine's model"
CUSTOM = "custom size"
SEGMENTS = [("LLM weights", "#1f77b4"), ("vision encoder", "#9467bd"), ("activations", "#ff7f0e"),
            ("KV cache", "#2ca02c"), ("overhead", "#7f7f7f")]
GIB = 2 ** 30


def model_presets() -> list[str]:
    """Names of the shipped model configs (assets/presets/models/*.json)."""
    return sorted(f[:-5] for f in os.listdir(os.path.join(PRESETS, "models")) if f.endswith(".json"))


def device_presets() -> list[str]:
    """Names of the shipped devices (assets/presets/devices.json), in file order."""
    with open(os.path.join(PRESETS, "devices.json")) as f:
        return list(json.load(f)["devices"])


def estimate_parts(est) -> list[int]:
    """Bytes per bar segment of an estimate, in SEGMENTS order."""
    return [est.text_weights_bytes, est.vision_weights_bytes, est.activation_peak_bytes, est.kv_cache_bytes,
            est.overhead_bytes]


def engine_parts(rep) -> list[int]:
    """Bytes per bar segment of a MemoryReport (activations only where the device reports a peak)."""
    held = rep.weights_bytes + rep.kv_cache_bytes
    act = max(0, rep.peak_bytes - held) if rep.peak_bytes is not None else 0
    return [rep.weights_bytes - rep.vision_weights_bytes, rep.vision_weights_bytes, act, rep.kv_cache_bytes, 0]


def budget_figure(est_parts, eng_parts, memory_bytes: int, budget_bytes: int, device: str, engine_device: str):
    """Two stacked bars (GiB), each on its own scale: the estimate against the device's memory and budget lines,
    and what this engine holds now."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.12,
                        subplot_titles=[f"estimate on {device}", f"this engine now ({engine_device})"])
    for col, parts in ((1, est_parts), (2, eng_parts)):
        for (name, color), b in zip(SEGMENTS, parts):
            fig.add_trace(go.Bar(name=name, x=["memory"], y=[b / GIB],
                                 marker_color=color, legendgroup=name, showlegend=col == 1,
                                 hovertemplate=f"{name}: %{{y:.4f}} GiB<extra></extra>"), row=1, col=col)
    fig.add_hline(memory_bytes / GIB, line=dict(color="black", width=2), row=1, col=1,
                  annotation_text=f"{device}: {memory_bytes / GIB:.1f} GiB", annotation_position="top left")
    fig.add_hline(budget_bytes / GIB, line=dict(color="red", dash="dash"), row=1, col=1,
                  annotation_text=f"budget {budget_bytes / GIB:.1f} GiB", annotation_position="bottom left")
    fig.update_layout(barmode="stack", height=420, margin=dict(l=10, r=10, t=40, b=10))
    fig.update_yaxes(title_text="GiB")
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
                        columns=["quantity", "estimate", f"this engine now ({rep.device}, {rep.dtype})"])


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:,.2f}" if isinstance(v, float) else f"{v:,}"


def build(holder: EngineHolder):
    """Lay out the VRAM tab and wire its events (api name: vram)."""
    with gr.Row():
        model = gr.Dropdown([THIS_ENGINE] + model_presets(), value="Qwen2.5-VL-3B-Instruct", label="Model",
                            elem_id="vram-model")
        device = gr.Dropdown(device_presets() + [CUSTOM], value="L4", label="Device", elem_id="vram-device")
        memory_gb = gr.Number(24, label="custom device memory (GiB)", minimum=0.1, visible=False)
        util = gr.Slider(0.1, 1.0, value=0.9, step=0.01, label="gpu_memory_utilization")
    with gr.Row():
        width = gr.Number(1024, label="image width (px)", precision=0, minimum=1)
        height = gr.Number(768, label="image height (px)", precision=0, minimum=1)
        images = gr.Slider(0, 8, value=1, step=1, label="images per request")
        context = gr.Number(4096, label="context length (max_model_len)", precision=0, minimum=1)
        seqs = gr.Slider(1, 256, value=8, step=1, label="concurrent requests")
    with gr.Row():
        dtype = gr.Dropdown(["bfloat16", "float16", "float32", "int8", "int4"], value="bfloat16", label="weights dtype")
        kv_dtype = gr.Dropdown(["auto", "bfloat16", "float16", "float32", "fp8"], value="auto", label="KV cache dtype")
        block_size = gr.Dropdown([8, 16, 32, 64], value=16, label="block size")
    headline = gr.Markdown(elem_id="vram-headline")
    figure = gr.Plot(label="Memory plan", elem_id="vram-plot")
    with gr.Row():
        versus = gr.Dataframe(label="Estimate vs this engine now", elem_id="vram-engine")
        breakdown = gr.Dataframe(label="Breakdown (formulas)", wrap=True)

    @gpu
    def calculate(model_name, device_name, gb, utilization, w, h, n_images, ctx, n_seqs, wdtype, kvdtype, bs):
        engine = holder.get()
        report = engine.memory_report()  # inside the GPU function: on ZeroGPU the device exists only here
        config = engine.hf_config if model_name == THIS_ENGINE else model_name
        where = {"device_memory_gb": float(gb or 0)} if device_name == CUSTOM else {"device": device_name}
        try:
            est = estimate(config, dtype=wdtype, kv_dtype=kvdtype, max_model_len=int(ctx or 0), num_seqs=int(n_seqs),
                           images_per_request=int(n_images), image_size=(int(w or 0), int(h or 0)),
                           gpu_memory_utilization=float(utilization), block_size=int(bs), **where)
        except ValueError as e:
            raise gr.Error(str(e))
        verdict = "Fits" if est.fits else "Does not fit"
        text = (f"### {verdict}: {est.num_blocks:,} KV blocks = {est.num_blocks * est.block_size:,} tokens · max "
                f"concurrency **{est.max_concurrency:.2f}x** at {int(ctx):,} tokens · this workload "
                f"({est.tokens_per_request:,} tokens per request, {est.vision_tokens_per_image:,} vision tokens per "
                f"image resized to {est.resized_image[1]}×{est.resized_image[0]}): **{est.workload_concurrency:,}** "
                f"requests at once (asked for {int(n_seqs)})")
        fig = budget_figure(estimate_parts(est), engine_parts(report), est.memory_bytes,
                            int(est.memory_bytes * float(utilization)), device_name if device_name != CUSTOM
                            else f"{gb} GiB", report.device)
        table = pd.DataFrame([(b.name, f"{b.bytes / GIB:,.3f}", b.formula) for b in est.breakdown],
                             columns=["item", "GiB", "formula"])
        return text, fig, comparison(est, report), table

    device.change(lambda d: gr.Number(visible=d == CUSTOM), device, memory_gb, api_name=False, queue=False)
    inputs = [model, device, memory_gb, util, width, height, images, context, seqs, dtype, kv_dtype, block_size]
    outputs = [headline, figure, versus, breakdown]
    gr.on([c.change for c in inputs], calculate, inputs, outputs, api_name="vram", concurrency_id="vram",
          concurrency_limit=4, show_progress="hidden")
    return calculate, inputs, outputs
