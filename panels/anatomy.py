"""Anatomy tab: how one request becomes tokens, M-RoPE positions, KV blocks and prefix-cache keys, drawn from
engine.anatomy (the engine's own processor, position and key code; no model run). A second image (or the same
one at another max_pixels) is compared key by key."""
import functools
import os
import time

import gradio as gr

from minivlm import Request
from minivlm.inputs.image_limits import processor_pixels
from minivlm import load_image, split_images

from panels.anatomy_figures import grid_figure, rope_figure, token_strip_figure
from panels.anatomy_fixed import fixed_cells, fixed_grid_figure
from panels.anatomy_keys import keys_html
from panels.anatomy_tiles import cell_tiles, positions_figure, tiled_grid_figure
from panels.anatomy_video import frame_strip_figure, video_rope_figure, with_video_frames
from panels.chat import to_hf_messages
from panels.holder import EXAMPLES_DIR, EngineHolder
from panels.uploads import checked, image_input
from panels.i18n import EN, L, lang_of, t
from panels.i18n.errors import localize_error

RED, BLUE = os.path.join(EXAMPLES_DIR, "red_circle.png"), os.path.join(EXAMPLES_DIR, "blue_circle.png")
EXAMPLES = [[RED, BLUE, "What color is the shape?"], [os.path.join(EXAMPLES_DIR, "three_shapes.png"), None,
                                                       "What color is the triangle?"]]
TRACK = 4  # the size slider ends at 4x the processor's default, so the default sits a quarter of the way along
BUDGETS = (70, 140, 280, 560, 1120)  # Gemma 4's soft-token budgets per image (its image processor takes no other)


def pixel_range(engine) -> tuple[int, int, int, int]:
    """(slider min, max, step, default) for the family's size knob: Qwen's max_pixels, SmolVLM's longest edge
    before tiling, InternVL's max crops, Gemma 3's pan-and-scan off / on (a text model has none: a placeholder
    range)."""
    ip, family = getattr(engine.processor, "image_processor", None), engine.family
    if family.images == "fixed":
        return 0, 1, 1, 0
    if family.images == "budget":  # Gemma 4: which of its soft-token budgets (an index into BUDGETS)
        return 0, len(BUDGETS) - 1, 1, BUDGETS.index(ip.max_soft_tokens)
    if family.images == "patches":
        unit = (ip.patch_size * ip.merge_size) ** 2  # one merged token's pixels
        default = int(ip.size.longest_edge)  # steps of one token; a linear track where the default is visible
        return 4 * unit, TRACK * default, unit, default
    if family.tiling == "crops":
        return 1, max(12, ip.max_patches), 1, ip.max_patches
    if family.images == "tiles":
        tile, default = ip.max_image_size["longest_edge"], ip.size.longest_edge
        return tile, max(4 * tile, default), tile, default
    return 0, 1, 1, 1


def knob(engine) -> tuple:
    """What the tab's two size sliders are drawn for: (min, max, step, default, label, shown at all)."""
    return (*pixel_range(engine), knob_label(engine), engine.family.images != "none")


def knob_label(engine, lang: str = EN) -> str:
    family = engine.family
    if family.images == "patches":
        ip = engine.processor.image_processor
        return t(lang, "anat.knob_patches", px=(ip.patch_size * ip.merge_size) ** 2)
    if family.images == "fixed":
        return t(lang, "anat.fixed_knob")
    if family.images == "budget":
        return t(lang, "anat.budget_knob", budgets=", ".join(map(str, BUDGETS)))
    return t(lang, "anat.knob_crops" if family.tiling == "crops" else "anat.knob_tiles")


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
    if family.images == "fixed":
        return {"do_pan_and_scan": bool(value)}
    if family.images == "budget":
        return {"max_soft_tokens": BUDGETS[value]}
    if family.images == "tiles":
        return {"size": {"longest_edge": value}}
    return None


def decoded(engine, value) -> int | None:
    """The pixels the engine decodes an image to for this slider value (the same as a chat request's)."""
    return processor_pixels(engine.processor, None if value is None else pixels_kwargs(engine, value))


def describe(a, seconds: float, lang: str = EN) -> str:
    n, bs = len(a.tokens), a.block_size
    n_image = sum(im.num_tokens for im in a.images)
    unused = bs * len(a.blocks) - n
    images = "; ".join(t(lang, "anat.image_line", kind=t(lang, f"anat.kind.{im.kind}") if lang != EN else im.kind,
                         n=k + 1, w=im.original_size[0], h=im.original_size[1], tokens=im.num_tokens)
                       for k, im in enumerate(a.images)) or t(lang, "anat.no_image")
    return (t(lang, "anat.describe", n=n, text=n - n_image, image=n_image, images=images, blocks=len(a.blocks), bs=bs,
              full=sum(b.full for b in a.blocks), unused=unused, secs=f"{seconds:.2f}")
            + "".join(t(lang, "anat.note", note=x) for x in a.notes))


def render(engine, request: Request, images: list, other: Request | None = None, lang: str = EN):
    """The tab's five outputs for `request` (compared with `other`); raises ValueError on a refused request."""
    start = time.perf_counter()
    a = engine.anatomy(request)
    b = engine.anatomy(other) if other is not None else None
    frames = {}
    if any(im.kind == "video" for im in a.images):  # a video: its first sampled frame stands for it in the strip
        images, frames = with_video_frames(request.to_messages(), a, images)
    cells = cell_tiles
    if a.images_as == "fixed":  # Gemma 3: each view a fixed grid of soft tokens (the crops cut by its processor)
        ip = engine.processor.image_processor
        cells = functools.partial(fixed_cells, ip)
        grid = fixed_grid_figure(ip, images, a.images, lang) if a.images else None
    elif a.images_as == "tiles":
        grid = tiled_grid_figure(images, a.images) if a.images else None
    else:
        grid = grid_figure(images, a.images, lang) if a.images else None
    rope = rope_figure(a, lang) if a.mrope else positions_figure(a)
    if frames:  # panels 1 and 2 show the video: its frame pairs, and positions where t moves
        grid, rope = frame_strip_figure(a, frames), video_rope_figure(a)
    figures = (grid, token_strip_figure(a, images, cells, lang), rope, keys_html(a, b, lang=lang))
    return describe(a, time.perf_counter() - start, lang), *figures


def last_request(history: list[dict] | None, system_text: str = "") -> list[dict]:
    """The messages of the chat's last answered request as the chat sent them (panels/chat.py): the history up to
    its last question (refused turns and hints dropped, the answers after it too), after the system prompt."""
    messages = to_hf_messages(history or [], system_text)
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    return messages if any(m["role"] == "user" for m in messages) else []


def build(holder: EngineHolder, tab=None, chatbot=None, demo=None, engine_changed=None, system=None):
    """Lay out the tab (drawn when `tab` is selected; `chatbot` lets it take the chat's last request, sent with the
    chat's `system` prompt box). The size
    sliders' range is the serving engine's: redrawn on `demo`'s page load, when `engine_changed` (the header's
    status line) changes, and before every drawing, whenever the engine has another knob than the page shows."""
    drawn = knob(holder.get())
    lo, hi, step, default, label, _ = drawn
    gr.Markdown(L("anat.intro"))
    with gr.Row():
        with gr.Column():
            image = image_input(value=RED, label=L("anat.image"), height=180, sources=["upload"], elem_id="anat-img1")
            pixels = gr.Slider(lo, hi, value=default, step=step, label=t(EN, "anat.which_image", knob=label),
                               elem_id="anat-pixels")
        with gr.Column():
            other = image_input(value=BLUE, label=L("anat.other"),
                                height=180, sources=["upload"], elem_id="anat-img2")
            other_pixels = gr.Slider(lo, hi, value=default, step=step, label=t(EN, "anat.which_second", knob=label),
                                     elem_id="anat-pixels2")
    prompt = gr.Textbox("What color is the shape?", label=L("anat.prompt"), elem_id="anat-prompt")
    with gr.Row():
        show = gr.Button(L("anat.show"), variant="primary", elem_id="anat-show")
        from_chat = gr.Button(L("anat.from_chat"), elem_id="anat-from-chat", visible=chatbot is not None)
    examples = gr.Examples(EXAMPLES, [image, other, prompt], label=L("anat.examples"))
    summary = gr.Markdown(label=L("anat.summary"), elem_id="anat-summary")
    with gr.Row(equal_height=True):
        grid = gr.Plot(label=L("anat.grid"), elem_id="anat-grid")
        rope = gr.Plot(label=L("anat.rope"), elem_id="anat-rope")
    strip = gr.Plot(label=L("anat.strip"), elem_id="anat-strip")
    keys = gr.HTML(label=L("anat.keys"), elem_id="anat-keys")
    outputs = [summary, grid, strip, rope, keys]
    shown = gr.State((drawn, EN))  # the knob and language this page's sliders are drawn in (each page its own)

    def configure(page_shows, request: gr.Request = None):
        """The sliders follow the engine's family (the header may have rebuilt it, for this page or another): a new
        knob redraws range, step, label and value (the old value may lie outside the new range, which Gradio refuses
        before any handler runs); a new language only the labels; the same knob nothing."""
        engine, lang = holder.get(), lang_of(request)
        now = knob(engine)
        old, old_lang = page_shows or (None, None)
        if (now, lang) == (old, old_lang):
            return (gr.skip(),) * 5
        lo, hi, step, default, _, visible = now
        name = knob_label(engine, lang)
        redraw = dict(minimum=lo, maximum=hi, step=step, value=default, visible=visible) if now != old else {}
        return (*[gr.update(label=t(lang, which, knob=name), **redraw) for which in ("anat.which_image",
                                                                                    "anat.which_second")],
                *([gr.update(visible=visible)] * 2 if now != old else [gr.skip()] * 2), (now, lang))
    knobs = [pixels, other_pixels, image, other, shown]
    if demo is not None:
        demo.load(configure, shown, knobs, api_name=False, queue=False, show_progress="hidden")
    if engine_changed is not None:
        engine_changed.change(configure, shown, knobs, api_name=False, queue=False, show_progress="hidden")

    def from_form(path, other_path, text, max_px, other_px, request: gr.Request):
        engine, lang = holder.get(), lang_of(request)
        salt = holder.salt(request.session_hash if request else None)
        try:
            if engine.family.images == "none":  # a text model: the prompt alone
                return render(engine, Request(prompt=text, cache_salt=salt), [], lang=lang)
            img = [load_image(checked(path, "Image"), decoded(engine, max_px))[0]] if path else []
            first = Request(prompt=text, images=img, mm_processor_kwargs=pixels_kwargs(engine, max_px), cache_salt=salt)
            second = [load_image(checked(other_path, "Second image"), decoded(engine, other_px))[0]] \
                if other_path else img
            compare = Request(prompt=text, images=second, mm_processor_kwargs=pixels_kwargs(engine, other_px),
                              cache_salt=salt) if second else None
            return render(engine, first, img, compare, lang)
        except ValueError as e:
            raise gr.Error(localize_error(e, lang))

    def from_history(history, system_text="", request: gr.Request = None):
        """The request the engine received for the chat's last answer (its num_prompt_tokens tokens), drawn; the
        form's boxes then show its pictures and its question."""
        lang = lang_of(request)
        messages = last_request(history, system_text)
        if not messages:
            raise gr.Error(t(lang, "anat.chat_empty"))
        salt = holder.salt(request.session_hash if request else None)
        try:
            engine = holder.get()
            paths = split_images(messages)[1]
            images = [load_image(x, decoded(engine, None))[0] for x in paths]
            drawn = render(engine, Request(messages=messages, cache_salt=salt), images, lang=lang)
        except ValueError as e:
            raise gr.Error(localize_error(e, lang))
        pictures = [x for x in paths if isinstance(x, str)]
        question = " ".join(p["text"] for p in messages[-1]["content"] if p["type"] == "text")
        return (*drawn, pictures[0] if pictures else None, pictures[1] if len(pictures) > 1 else None, question)

    inputs = [image, other, prompt, pixels, other_pixels]
    # a person's changes only (input, not change): the tab's own slider/visibility update must not render again
    triggers = [show.click, prompt.submit, pixels.release, other_pixels.release, image.input, other.input]
    if tab is not None:
        triggers.append(tab.select)
    # the sliders are made to fit the engine first (their values are then read inside its range); one drawing at a
    # time, in arrival order: the tab's own render on opening must not land after (and overwrite) a click on "Use
    # the chat's last request" made while it ran
    gr.on(triggers, configure, shown, knobs, api_name=False, queue=False, show_progress="hidden",
          trigger_mode="always_last").then(from_form, inputs, outputs, api_name="anatomy", concurrency_id="anatomy",
                                           concurrency_limit=1)
    examples.load_input_event.then(configure, shown, knobs, api_name=False, queue=False, show_progress="hidden") \
        .then(from_form, inputs, outputs, api_name=False, concurrency_id="anatomy")
    if chatbot is not None:
        from_chat.click(from_history, [chatbot] + ([system] if system is not None else []),
                        outputs + [image, other, prompt], api_name="anatomy_from_chat", concurrency_id="anatomy")
    return from_form, inputs, outputs
