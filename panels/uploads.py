"""Image inputs that hand the server a file path and decode nothing: gradio's own gr.Image opens (and for a mode
other than its image_mode, converts: decodes) every upload before the app sees it, so a pixel bomb would cost its
full size first. Here the engine's one header check (minivlm.inputs.image_limits) is the first thing that reads it."""
import os

import gradio as gr

from minivlm.inputs import image_limits

from panels.access import refusal
from panels.i18n import EN
from panels.i18n.errors import localize_error


def image_input(**kwargs) -> gr.Image:
    """A gr.Image whose value reaches the handler as the uploaded file's path, undecoded."""
    image = gr.Image(type="filepath", image_mode=None, **kwargs)
    decode = image.preprocess

    def preprocess(payload):
        if payload is None or payload.path is None:  # nothing, or a data: URL from an API client
            return decode(payload)
        return str(payload.path)
    image.preprocess = preprocess  # on the instance: a gr.Image subclass makes gradio write a stub
    return image


def checked(path: str | None, label: str, lang: str = EN) -> str | None:
    """`path` after the engine's header check, refused in the engine's words naming the input and its file."""
    if path is None:
        return None
    try:
        image_limits.check_file(path, f"{label} ({os.path.basename(path)})")
    except ValueError as e:
        raise refusal(localize_error(e, lang)) from None
    return path
