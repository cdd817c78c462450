"""Cache inspector tab: one pair of requests run under strategies A, B and C, each on an isolated KV pool that shares
the loaded weights (never the public cache): hits, true/false hits, which blocks, answers, and the logprob drift
against a cold run."""
import math
import os

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from minivlm import Request, SamplingParams
from minivlm.views.cache_study import compare_strategies, max_logprob_diff

from panels.access import refusal
from panels.holder import EXAMPLES_DIR, EngineHolder, gpu
from panels.uploads import checked, image_input
from panels.i18n import EN, L, lang_of, t
from panels.i18n.errors import localize_error
from panels.sessions import collect_before_an_engine
from panels.anatomy_figures import needs_width
from panels.page import header_widths
from panels import inspector_hybrid

STRATEGIES = ("A", "B", "C")
RESIZES = {"processor default": None, "max 160×160 px": 160 * 160, "max 112×112 px": 112 * 112,
           "max 448×448 px": 448 * 448, "another tiling": "other", "one view (no splitting)": "single"}
TOP_LOGPROBS = 20
ROUNDING = 1e-4  # below this a logprob difference is float rounding (a false hit moves them by whole units)
HIT_COLORS = {0: "#e5e7eb", 1: "#15803d", 2: "#dc2626"}  # miss, true hit, false hit (white ids on them: >= 4.8:1)
COLUMN_IDS = ["strategy", "hits", "true", "false", "cached", "answer1", "answer2", "cold", "drift", "meaning"]
RESULT_COLUMNS = [t(EN, f"insp.col.{c}") for c in COLUMN_IDS]  # the API's table (English)


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


# the video preset: one clip sampled at two rates (Qwen2.5-VL: the same tokens, only M-RoPE's time axis moves)
VIDEO_PRESET = ("Same video, different fps", "moving_square.gif", 2, 4, "What happens in the video?")


def video_request(clip: str, fps: float, prompt: str) -> Request:
    return Request(messages=[{"role": "user", "content": [{"type": "video", "video": clip, "fps": fps},
                                                          {"type": "text", "text": prompt}]}])


def run_video_pair(engine, clip: str, fps_1: float, fps_2: float, prompt: str, max_tokens: int):
    """The same clip at two sampling rates, cold and under A, B and C (as run_pair does for two images)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=TOP_LOGPROBS)
    cfg = engine.config
    blocks = min(engine.num_blocks, 2 * math.ceil(cfg.max_model_len / cfg.block_size) + 2)
    collect_before_an_engine()  # each isolated pool freezes what is alive when it starts: no session garbage
    results = compare_strategies(engine, video_request(clip, fps_1, prompt), video_request(clip, fps_2, prompt),
                                 params, STRATEGIES, blocks)
    return {r.strategy: (r.second, r.first) for r in results}, results[0].cold


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


def hits_figure(results: dict, block_size: int, lang: str = EN) -> go.Figure:
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
            hovertext=[t(lang, "insp.hover", name=name, i=i, state=t(lang, f"insp.hover_state.{s}"))
                       + (t(lang, "insp.reused", label=label[i]) if s else "") for i, s in enumerate(state)],
            hoverinfo="text"))
    for s, name in ((1, "insp.true_hit"), (2, "insp.false_hit"), (0, "insp.miss")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=t(lang, name),
                                 marker=dict(symbol="square", size=12, color=HIT_COLORS[s])))
    n = max(len(t.x) for t in fig.data)
    fig.update_layout(title=t(lang, "insp.title"), height=260, margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(title=t(lang, "insp.axis"), tickvals=list(range(n)),
                                 ticktext=[f"L{i}" for i in range(n)]),
                      yaxis=dict(categoryorder="array", categoryarray=list(reversed(STRATEGIES))))
    return needs_width(fig, 0)  # its title whole on a phone (the figure scrolls sideways)


def run_pair(engine, pair, max_tokens: int):
    """Run the pair cold (no cache) and under A, B and C, each on an isolated pool of the loaded model.
    Returns ({strategy: (output 2, output 1)}, cold output 2)."""
    (img1, prompt1, kw1), (img2, prompt2, kw2) = pair
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=TOP_LOGPROBS)
    cfg = engine.config
    blocks = min(engine.num_blocks, 2 * math.ceil(cfg.max_model_len / cfg.block_size) + 2)
    collect_before_an_engine()  # each isolated pool freezes what is alive when it starts: no session garbage
    results = compare_strategies(engine, Request(prompt=prompt1, images=[img1], mm_processor_kwargs=kw1),
                                 Request(prompt=prompt2, images=[img2], mm_processor_kwargs=kw2), params,
                                 STRATEGIES, blocks)
    return {r.strategy: (r.second, r.first) for r in results}, results[0].cold


def drift_meaning(diff: float, lang: str = EN) -> str:
    """What the largest logprob difference from the cold run says about the reused KV."""
    if diff == 0:
        return t(lang, "insp.bit_identical")
    return t(lang, "insp.rounding" if diff < ROUNDING else "insp.not_this")


def results_table(results: dict, cold, lang: str = EN) -> pd.DataFrame:
    """One row per strategy: hit counts, the answers, and the drift from a cold run."""
    rows = []
    for name, (second, first) in results.items():
        false = sum(h.false_hit for h in second.cache_hits)
        hits = len(second.cache_hits)
        rows.append([name, hits, hits - false, false, second.num_cached_tokens, first.text.strip(),
                     second.text.strip(), cold.text.strip(), f"{max_logprob_diff(second, cold):.4g}",
                     drift_meaning(max_logprob_diff(second, cold), lang)])
    return pd.DataFrame(rows, columns=RESULT_COLUMNS if lang == EN else [t(lang, f"insp.col.{c}") for c in COLUMN_IDS])


def build(holder: EngineHolder):
    """Lay out the inspector tab and wire its events (api name: inspect)."""
    gr.Markdown(L("insp.intro"))
    with gr.Row():
        with gr.Column():
            img1 = image_input(label=L("insp.img1"), height=200, elem_id="insp-img1")
            resize1 = gr.Dropdown(list(RESIZES), value="processor default", label=L("insp.resize1"))
        with gr.Column():
            img2 = image_input(label=L("insp.img2"), height=200, elem_id="insp-img2")
            resize2 = gr.Dropdown(list(RESIZES), value="processor default", label=L("insp.resize2"))
    with gr.Row():
        prompt = gr.Textbox("What color is the shape?", label=L("insp.prompt"), scale=3)
        prompt2 = gr.Textbox("", label=L("insp.prompt2"), scale=3)
        max_tokens = gr.Slider(1, 64, value=8, step=1, label=L("insp.max_tokens"), scale=1)
    with gr.Row():
        preset_buttons = [gr.Button(L(f"preset.{name}"), size="sm", elem_id=f"preset-{i}") for i, name in enumerate(PRESETS)]
        video_button = gr.Button(L(f"preset.{VIDEO_PRESET[0]}"), size="sm", elem_id="preset-video")
        hybrid_button = gr.Button(L(f"preset.{inspector_hybrid.PRESET[0]}"), size="sm", elem_id="preset-hybrid")
        run = gr.Button(L("insp.run"), variant="primary", elem_id="insp-run")
    results = gr.Dataframe(label=L("insp.results"), elem_id="insp-results", wrap=True,
                           column_widths=header_widths(RESULT_COLUMNS, {len(RESULT_COLUMNS) - 1: "auto"}))
    blocks = gr.Plot(label=L("insp.blocks"), elem_id="insp-blocks")
    hybrid_note = gr.Markdown(elem_id="insp-hybrid-note", visible=False, label=L("insp.hybrid_note"))

    @gpu
    def inspect(image_1, image_2, prompt, prompt_2, resize_1, resize_2, max_tokens, request: gr.Request = None):
        lang = lang_of(request)
        if image_1 is None or image_2 is None:
            raise refusal(t(lang, "insp.two_images"))
        image_1, image_2 = checked(image_1, t(lang, "insp.img1"), lang), \
            checked(image_2, t(lang, "insp.img2"), lang)
        if not (prompt or "").strip():
            raise refusal(t(lang, "insp.give_prompt"))
        if resize_1 not in RESIZES or resize_2 not in RESIZES:
            raise refusal(f"resize must be one of {list(RESIZES)}")
        engine = holder.get()
        if engine.family.images == "none":
            raise refusal(t(lang, "insp.text_only", model=engine.family.title))
        try:
            kw = [processor_kwargs(engine, r) for r in (resize_1, resize_2)]
            second = (image_2, (prompt_2 or "").strip() or prompt, kw[1])
            out, cold = run_pair(engine, ((image_1, prompt, kw[0]), second), int(max_tokens))
        except ValueError as e:
            raise refusal(localize_error(e, lang))
        return results_table(out, cold, lang), hits_figure(out, engine.config.block_size, lang)

    @gpu
    def inspect_hybrid(max_tokens, request: gr.Request = None):
        """The hybrid preset: key A fooled on a hybrid model (the served one, or a random Qwen3.5)."""
        lang = lang_of(request)
        _, first, second, question = inspector_hybrid.PRESET
        try:
            engine, made = inspector_hybrid.hybrid_engine(holder.get())
            out, cold = run_pair(engine, ((_example(first), question, None), (_example(second), question, None)),
                                 int(max_tokens))
        except ValueError as e:
            raise refusal(localize_error(e, lang))
        return results_table(out, cold, lang), hits_figure(out, engine.config.block_size, lang), \
            gr.update(value=inspector_hybrid.note(engine, made, out, lang), visible=True)

    @gpu
    def inspect_video(max_tokens, request: gr.Request = None):
        """The video preset: request 1 samples the clip at 2 fps, request 2 the same file at 4 fps. Key C holds the
        fps and the sampled frames, so no block with video tokens is shared; A and B see the same file (and, on
        Qwen2.5-VL, the same token ids) and reuse them: a false hit, as when vLLM's hash lacked fps / num_frames."""
        engine = holder.get()
        name, clip, fps_1, fps_2, question = VIDEO_PRESET
        try:
            out, cold = run_video_pair(engine, _example(clip), fps_1, fps_2, question, int(max_tokens))
        except ValueError as e:
            raise refusal(f"{name}: {localize_error(e, lang_of(request))}")
        return results_table(out, cold, lang_of(request)), hits_figure(out, engine.config.block_size, lang_of(request))

    video_button.click(inspect_video, [max_tokens], [results, blocks], api_name="inspect_video",
                       concurrency_id="inspect")
    hybrid_button.click(inspect_hybrid, [max_tokens], [results, blocks, hybrid_note], api_name="inspect_hybrid",
                        concurrency_id="inspect")
    for button in (run, video_button, *preset_buttons):  # the hybrid note speaks of the hybrid preset's run only
        button.click(lambda: gr.update(visible=False), None, hybrid_note, api_name=False, queue=False)
    inputs = [img1, img2, prompt, prompt2, resize1, resize2, max_tokens]
    _, first, second, question = inspector_hybrid.PRESET  # the page shows the pair the hybrid preset runs
    hybrid_button.click(lambda: (_example(first), _example(second), question, "", "processor default",
                                 "processor default"), None, inputs[:-1], api_name=False, queue=False)
    run.click(inspect, inputs, [results, blocks], api_name="inspect", concurrency_id="inspect", concurrency_limit=1)
    for button, (a, b, p1, p2, r1, r2) in zip(preset_buttons, PRESETS.values()):
        def fill(a=a, b=b, p1=p1, p2=p2, r1=r1, r2=r2):
            return _example(a), _example(b), p1, p2, r1, r2
        button.click(fill, None, inputs[:-1], api_name=False, queue=False).then(
            inspect, inputs, [results, blocks], api_name=False, concurrency_id="inspect")
