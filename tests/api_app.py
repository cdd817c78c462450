"""Helpers of the HTTP API tests: the app served from the test's own process (so a test can watch the engine the
API serves with), and OpenAI chat messages carrying an example image as a data: URL."""
import base64
import contextlib
import os

from minivlm import EngineConfig
from minivlm.api import ApiSettings
from panels.holder import EXAMPLES_DIR, EngineHolder
from tests.app_server import APP_MODEL, free_port

MODEL = "tiny-qwen-vl"
QUESTION = "What color is the shape?"


@contextlib.contextmanager
def inprocess_app(api: ApiSettings | None = None, **config):
    """app.serve() on a free port around a fresh holder; yields (holder, url)."""
    import app as app_module
    holder = EngineHolder(EngineConfig(model=APP_MODEL or EngineConfig().model, device="cpu", **config))
    holder.load()
    port = free_port()
    demo = app_module.serve(holder, port=port, block=False, api=api or ApiSettings())
    try:
        yield holder, f"http://127.0.0.1:{port}/"
    finally:
        demo.close()
        holder.engine.close()


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def image_message(name: str, question: str = QUESTION, url: str | None = None) -> list[dict]:
    """One user turn: an example image (or any `url`) and a question."""
    url = url or data_url(open(os.path.join(EXAMPLES_DIR, name), "rb").read())
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": question}]}]


def text_request(**fields) -> dict:
    """A text-only request body (fields override)."""
    return {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], **fields}
