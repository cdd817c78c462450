"""Anatomy tab: how one request becomes tokens, M-RoPE positions, KV blocks and prefix-cache keys, drawn from
engine.anatomy (the engine's own processor, position and key code; no model run). A second image (or the same
one at another max_pixels) is compared key by key."""
import os
import time

import gradio as gr

from minivlm import Request
from minivlm.multimodal import load_image, split_images

from panels.anatomy_figures import grid_figure, rope_figure, token_strip_figure
from panels.anatomy_keys import keys_html
from panels.anatomy_tiles import cell_tiles, positions_figure, tiled_grid_figure
from panels.chat import to_hf_messages
from panels.holder import EXAMPLES_DIR, EngineHolder

RED, BLUE = os.path.join(EXAMPLES_DIR, "red_circle.png"), os.path.join(EXAMPLES_DIR, "blue_circle.png")
EXAMPLES = [[RED, BLUE, "What color is the shape?"], [os.path.join(EXAMPLES_DIR, "three_shapes.png"), None,
                                                       "What color is the triangle?"]]
LARGEST = 1024 * 768  # the slider reaches a 1024×768 image at full resolution


def pixel_range(engine) -> tuple[int, int, int, int]:
    """(slider min, max, step, default) for the family's size knob: Qwen's max_pixels, SmolVLM's longest edge
    before tiling, InternVL's max crops (a text model has none: a placeholder range)."""
    ip, family = getattr(engine.processor, "image_processor", None), engine.family
    if family.images == "patches":
        unit = (ip.patch_size * ip.merge_size) ** 2  # one merged token's pixels
        default = int(ip.size.longest_edge)
        return 4 * unit, max(LARGEST, 4 * default), unit, default
    if family.tiling == "crops":
        return 1, max(12, ip.max_patches), 1, ip.max_patches
    if family.images == "tiles":
        tile, default = ip.max_image_size["longest_edge"], ip.size.longest_edge
        return tile, max(4 * tile, default), tile, default
    return 0, 1, 1, 1


def knob_label(engine) -> str:
    family = engine.family
    if family.images == "patches":
        return "max_pixels"
    return "max_patches (crops)" if family.tiling == "crops" else "size: longest edge before tiling (px)"


def pixels_kwargs(engine, value) -> dict | None:
    """mm_processor_kwargs for a slider value, clamped into this family's range (the slider may have been drawn for
    another model before a rebuild)."""
    lo, hi, _, default = pixel_range(engine)
    value = int(value) if lo <= int(value or 0) <= hi else default
    family = engine.family
    if family.images == "patches":
        low = int(engine.processor.image_processor.size.shortest_edge)
        return {"max_pixels": value, "min_pixels": min(low, value)}
    if family.tiling == "crops":
        return {"max_patches": value, "min_patches": min(engine.processor.image_processor.min_patches, value)}
    if family.images == "tiles":
        return {"size": {"longest_edge": value}}
    return None


def describe(a, seconds: float) -> str:
    n, bs = len(a.tokens), a.block_size
    n_image = sum(im.num_tokens for im in a.images)
    unused = bs * len(a.blocks) - n
    images = "; ".join(f"image {k + 1}: {im.original_size[0]}×{im.original_size[1]} px → {im.num_tokens} tokens"
                       for k, im in enumerate(a.images)) or "no image"
    return (f"**{n} prompt tokens** = {n - n_image} text + {n_image} image ({images}) · **{len(a.blocks)} KV "
            f"blocks** of {bs} ({sum(b.full for b in a.blocks)} full and keyed; {unused} unused slots in the last) · "
            f"drawn in {seconds:.2f} s" + "".join(f"<br>note: {x}" for x in a.notes))


def render(engine, request: Request, images: list, other: Request | None = None):
    """The tab's five outputs for `request` (compared with `other`); raises ValueError on a refused request."""
    start = time.perf_counter()
    a = engine.anatomy(request)
    b = engine.anatomy(other) if other is not None else None
    tiled = a.images_as == "tiles"
    grid = (tiled_grid_figure if tiled else grid_figure)(images, a.images) if a.images else None
    figures = (grid, token_strip_figure(a, images, cell_tiles), rope_figure(a) if a.mrope else positions_figure(a),
               keys_html(a, b))
    return describe(a, time.perf_counter() - start), *figures


def build(holder: EngineHolder, tab=None, chatbot=None):
    """Lay out the tab (drawn when `tab` is selected; `chatbot` lets it take the chat's last request)."""
    lo, hi, step, default = pixel_range(holder.get())
    label = knob_label(holder.get())
    gr.Markdown("How a request becomes what the engine stores: the image cut into patches and merged into tokens, "
                "the prompt as tokens in KV blocks, each image token's M-RoPE position, and what goes into each "
                "block's prefix-cache key under A, B and C. Nothing runs the model.")
    with gr.Row():
        with gr.Column():
            image = gr.Image(RED, type="filepath", label="Image", height=180, sources=["upload"], elem_id="anat-img1")
            pixels = gr.Slider(lo, hi, value=default, step=step, label=f"{label} (image)", elem_id="anat-pixels")
        with gr.Column():
            other = gr.Image(BLUE, type="filepath", label="Second image, to compare keys (empty = the same image)",
                             height=180, sources=["upload"], elem_id="anat-img2")
            other_pixels = gr.Slider(lo, hi, value=default, step=step, label=f"{label} (second image)",
                                     elem_id="anat-pixels2")
    prompt = gr.Textbox("What color is the shape?", label="Prompt (the same for both)", elem_id="anat-prompt")
    with gr.Row():
        show = gr.Button("Show anatomy", variant="primary", elem_id="anat-show")
        from_chat = gr.Button("Use the chat's last request", elem_id="anat-from-chat", visible=chatbot is not None)
    gr.Examples(EXAMPLES, [image, other, prompt], label="Examples")
    summary = gr.Markdown(label="Anatomy summary", elem_id="anat-summary")
    with gr.Row(equal_height=True):
        grid = gr.Plot(label="1 · the image as the vision tower sees it", elem_id="anat-grid")
        rope = gr.Plot(label="2 · positions of the image tokens (M-RoPE t, h, w; or 1-D)", elem_id="anat-rope")
    strip = gr.Plot(label="3 · the prompt as tokens, in KV blocks", elem_id="anat-strip")
    keys = gr.HTML(label="4 · prefix-cache keys per block under A, B and C", elem_id="anat-keys")
    outputs = [summary, grid, strip, rope, keys]

    def from_form(path, other_path, text, max_px, other_px, request: gr.Request):
        engine = holder.get()
        salt = holder.salt(request.session_hash if request else None)
        try:
            if engine.family.images == "none":  # a text model: the prompt alone
                return render(engine, Request(prompt=text, cache_salt=salt), [])
            img = [load_image(path)[0]] if path else []
            first = Request(prompt=text, images=img, mm_processor_kwargs=pixels_kwargs(engine, max_px), cache_salt=salt)
            second = [load_image(other_path)[0]] if other_path else img
            compare = Request(prompt=text, images=second, mm_processor_kwargs=pixels_kwargs(engine, other_px),
                              cache_salt=salt) if second else None
            return render(engine, first, img, compare)
        except ValueError as e:
            raise gr.Error(str(e))

    def from_history(history, request: gr.Request):
        messages = to_hf_messages(history or [])
        if not messages:
            raise gr.Error("The chat is empty: send a message in the Chat tab first.")
        salt = holder.salt(request.session_hash if request else None)
        try:
            images = [load_image(x)[0] for x in split_images(messages)[1]]
            return render(holder.get(), Request(messages=messages, cache_salt=salt), images)
        except ValueError as e:
            raise gr.Error(str(e))

    inputs = [image, other, prompt, pixels, other_pixels]
    triggers = [show.click, prompt.submit, pixels.release, other_pixels.release, image.change, other.change]
    if tab is not None:
        triggers.append(tab.select)

        def configure():  # the sliders follow the engine's family (the header may have rebuilt it)
            engine = holder.get()
            lo, hi, step, default = pixel_range(engine)
            name, visible = knob_label(engine), engine.family.images != "none"
            return [gr.update(minimum=lo, maximum=hi, step=step, label=f"{name}{which}", visible=visible)
                    for which in (" (image)", " (second image)")] + [gr.update(visible=visible)] * 2
        tab.select(configure, None, [pixels, other_pixels, image, other], api_name=False, queue=False)
    gr.on(triggers, from_form, inputs, outputs, api_name="anatomy", concurrency_id="anatomy", concurrency_limit=2,
          trigger_mode="always_last")
    if chatbot is not None:
        from_chat.click(from_history, [chatbot], outputs, api_name="anatomy_from_chat", concurrency_id="anatomy")
    return from_form, inputs, outputs
