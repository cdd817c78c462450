"""Cache inspector tab: one pair of requests run under strategies A, B and C, each on an isolated KV pool that shares
the loaded weights (never the public cache): hits, true/false hits, which blocks, answers, and the logprob drift
against a cold run."""
import math
import os

import gradio as gr
import pandas as pd
import plotly.graph_objects as go
from PIL import Image, UnidentifiedImageError

from minivlm import Request, SamplingParams
from minivlm.cache_study import compare_strategies, max_logprob_diff

from panels.access import refusal
from panels.holder import EXAMPLES_DIR, EngineHolder, gpu

STRATEGIES = ("A", "B", "C")
RESIZES = {"processor default": None, "max 160×160 px": 160 * 160, "max 112×112 px": 112 * 112,
           "max 448×448 px": 448 * 448, "another tiling": "other", "one view (no splitting)": "single"}
TOP_LOGPROBS = 20
HIT_COLORS = {0: "#e5e7eb", 1: "#16a34a", 2: "#dc2626"}  # miss, true hit, false hit
RESULT_COLUMNS = ["strategy", "hits", "true hits", "false hits", "cached tokens", "answer · image 1",
                  "answer · image 2", "cold answer · image 2", "max |Δlogprob| vs cold"]


def _example(name: str) -> str:
    return os.path.join(EXAMPLES_DIR, name)


PRESETS = {  # the seeds' cases: (image 1, image 2, prompt, second prompt or "", resize 1, resize 2)
    "Same text, different image": ("red_circle.png", "blue_circle.png", "What color is the shape?", "",
                                   "processor default", "processor default"),
    "Identical": ("red_circle.png", "red_circle.png", "What color is the shape?", "",
                  "processor default", "processor default"),
    "Same image, different text": ("green_triangle.png", "green_triangle.png", "What shape is it?",
                                   "What color is the shape?", "processor default", "processor default"),
    "Same image, different resize": ("red_circle.png", "red_circle.png", "What color is the shape?", "",
                                     "processor default", "max 160×160 px"),
    "Same image, different tiling": ("three_shapes.png", "three_shapes.png", "Describe the picture.", "",
                                     "processor default", "another tiling"),
}


def processor_kwargs(engine, choice: str) -> dict | None:
    """mm_processor_kwargs of a resize / tiling choice for this engine's family; a choice the family has no such
    knob for is refused, naming what it takes. "another tiling" is each family's own: Qwen a smaller max_pixels,
    SmolVLM a longer edge before tiling (more crops), InternVL a single crop instead of up to max_patches."""
    family, value = engine.family, RESIZES[choice]
    if value is None:
        return None
    ip = engine.processor.image_processor
    if family.images == "patches":
        if value == "single":
            raise ValueError(f"{family.title} does not tile images; pick a max_pixels resize instead")
        return {"max_pixels": 160 * 160 if value == "other" else value}
    if isinstance(value, int):
        raise ValueError(f"{family.title} tiles images instead of a max_pixels resize; pick 'another tiling' or "
                         f"'one view (no splitting)'")
    if family.tiling == "crops":
        return {"crop_to_patches": False} if value == "single" else {"max_patches": 1 if ip.max_patches > 1 else 6}
    if value == "single":
        return {"do_image_splitting": False}
    tile = ip.max_image_size["longest_edge"]
    return {"size": {"longest_edge": ip.size.longest_edge + tile}}  # one more crop along the longest side


def refuse_unreadable(image: gr.Image) -> gr.Image:
    """Make `image` refuse an unreadable upload with a message naming the image and its file (gradio's own decoding
    would fail first, with a bare "Error"). Wrapped on the instance: a gr.Image subclass makes gradio write a stub."""
    decode = image.preprocess

    def preprocess(payload):
        try:
            return decode(payload)
        except (UnidentifiedImageError, OSError, SyntaxError, EOFError, Image.DecompressionBombError) as e:
            name = payload.orig_name or os.path.basename(payload.path or "") or "the upload"
            raise refusal(f"{image.label} ({name}) is not a readable image: {type(e).__name__}. "
                          "Upload a PNG, JPEG, WebP or GIF picture.") from None
    image.preprocess = preprocess
    return image


def hits_figure(results: dict, block_size: int) -> go.Figure:
    """Rows A/B/C, one cell per full prompt block of request 2 (x: logical block L0, L1, ...): miss, true hit or
    false hit, labelled with the physical block it reused (#id): the two numberings are different things."""
    fig = go.Figure()
    for row, (name, (second, _)) in enumerate(results.items()):
        n = max(1, second.num_prompt_tokens // block_size)
        state, label = [0] * n, [""] * n
        for h in second.cache_hits:
            if h.logical_index < n:
                state[h.logical_index] = 2 if h.false_hit else 1
                label[h.logical_index] = f"#{h.block_id}"
        fig.add_trace(go.Scatter(
            x=list(range(n)), y=[name] * n, mode="markers+text", text=label, showlegend=False,
            marker=dict(symbol="square", size=26, color=[HIT_COLORS[s] for s in state]),
            textfont=dict(color="white", size=10),
            hovertext=[f"{name}: logical block L{i} · {['miss', 'true hit', 'FALSE hit'][s]}"
                       + (f" · reused physical block {label[i]}" if s else "") for i, s in enumerate(state)],
            hoverinfo="text"))
    for s, name in ((1, "true hit"), (2, "false hit"), (0, "miss")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=12, color=HIT_COLORS[s])))
    n = max(len(t.x) for t in fig.data)
    fig.update_layout(title="Request 2's prompt blocks by logical index L; #id = the physical block it reused",
                      height=260, margin=dict(l=10, r=10, t=40, b=10), plot_bgcolor="white",
                      xaxis=dict(title="logical block of request 2", tickvals=list(range(n)),
                                 ticktext=[f"L{i}" for i in range(n)]),
                      yaxis=dict(categoryorder="array", categoryarray=list(reversed(STRATEGIES))))
    return fig


def run_pair(engine, pair, max_tokens: int):
    """Run the pair cold (no cache) and under A, B and C, each on an isolated pool of the loaded model.
    Returns ({strategy: (output 2, output 1)}, cold output 2)."""
    (img1, prompt1, kw1), (img2, prompt2, kw2) = pair
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=TOP_LOGPROBS)
    cfg = engine.config
    blocks = min(engine.num_blocks, 2 * math.ceil(cfg.max_model_len / cfg.block_size) + 2)
    results = compare_strategies(engine, Request(prompt=prompt1, images=[img1], mm_processor_kwargs=kw1),
                                 Request(prompt=prompt2, images=[img2], mm_processor_kwargs=kw2), params,
                                 STRATEGIES, blocks)
    return {r.strategy: (r.second, r.first) for r in results}, results[0].cold


def results_table(results: dict, cold) -> pd.DataFrame:
    """One row per strategy: hit counts, the answers, and the drift from a cold run."""
    rows = []
    for name, (second, first) in results.items():
        false = sum(h.false_hit for h in second.cache_hits)
        hits = len(second.cache_hits)
        rows.append([name, hits, hits - false, false, second.num_cached_tokens, first.text.strip(),
                     second.text.strip(), cold.text.strip(), f"{max_logprob_diff(second, cold):.4g}"])
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def build(holder: EngineHolder):
    """Lay out the inspector tab and wire its events (api name: inspect)."""
    gr.Markdown("Runs request 1 then request 2 on a fresh **isolated** KV pool per strategy (the loaded weights are "
                "shared, the app's own cache is never touched), and request 2 once more with no cache at all. "
                "A **false hit** reuses a block whose KV was computed from different content. A true hit's logprobs "
                "differ from the cold run's only by float rounding (about 1e-6: the cached run computes just the "
                "uncached tail, a differently shaped matrix product); a false hit's differ by whole units.")
    with gr.Row():
        with gr.Column():
            img1 = refuse_unreadable(gr.Image(type="pil", label="Image 1", height=200, elem_id="insp-img1"))
            resize1 = gr.Dropdown(list(RESIZES), value="processor default", label="resize / tiling of image 1")
        with gr.Column():
            img2 = refuse_unreadable(gr.Image(type="pil", label="Image 2", height=200, elem_id="insp-img2"))
            resize2 = gr.Dropdown(list(RESIZES), value="processor default", label="resize / tiling of image 2")
    with gr.Row():
        prompt = gr.Textbox("What color is the shape?", label="Prompt", scale=3)
        prompt2 = gr.Textbox("", label="Prompt for request 2 (empty = the same)", scale=3)
        max_tokens = gr.Slider(1, 64, value=8, step=1, label="max tokens", scale=1)
    with gr.Row():
        preset_buttons = [gr.Button(name, size="sm", elem_id=f"preset-{i}") for i, name in enumerate(PRESETS)]
        run = gr.Button("Run A / B / C", variant="primary", elem_id="insp-run")
    results = gr.Dataframe(label="Per strategy", elem_id="insp-results", wrap=True)
    blocks = gr.Plot(label="Which blocks were reused", elem_id="insp-blocks")

    @gpu
    def inspect(image_1, image_2, prompt, prompt_2, resize_1, resize_2, max_tokens):
        if image_1 is None or image_2 is None:
            raise refusal("Give two images (upload them or pick a preset).")
        if not (prompt or "").strip():
            raise refusal("Give a prompt.")
        if resize_1 not in RESIZES or resize_2 not in RESIZES:
            raise refusal(f"resize must be one of {list(RESIZES)}")
        engine = holder.get()
        if engine.family.images == "none":
            raise refusal(f"{engine.family.title} is a text-only model: the inspector compares requests with images.")
        try:
            kw = [processor_kwargs(engine, r) for r in (resize_1, resize_2)]
            second = (image_2, (prompt_2 or "").strip() or prompt, kw[1])
            out, cold = run_pair(engine, ((image_1, prompt, kw[0]), second), int(max_tokens))
        except ValueError as e:
            raise refusal(str(e))
        return results_table(out, cold), hits_figure(out, engine.config.block_size)

    inputs = [img1, img2, prompt, prompt2, resize1, resize2, max_tokens]
    run.click(inspect, inputs, [results, blocks], api_name="inspect", concurrency_id="inspect", concurrency_limit=1)
    for button, (a, b, p1, p2, r1, r2) in zip(preset_buttons, PRESETS.values()):
        def fill(a=a, b=b, p1=p1, p2=p2, r1=r1, r2=r2):
            return Image.open(_example(a)), Image.open(_example(b)), p1, p2, r1, r2
        button.click(fill, None, inputs[:-1], api_name=False, queue=False).then(
            inspect, inputs, [results, blocks], api_name=False, concurrency_id="inspect")
