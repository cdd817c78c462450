"""The KV tab watching a KV-event stream in a real browser: the app's engine publishes on loopback and the same
app watches that address, so the page shows the engine's own prefix-tree panel and the tree drawn from the wire
side by side; after a launch of image requests both have the same blocks of each kind, and the watch section's
counters name the dialect and report no decode errors."""
import time

import pytest

from minivlm import EngineConfig, Request, SamplingParams
from panels import kv_watch
from panels.holder import EngineHolder
from tests.app_server import APP_MODEL, free_port
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, open_tab
from tests.test_kv_events import image
from tests.app_server import browser_page

pytestmark = pytest.mark.browser

KINDS = """(sel) => {
    const el = document.querySelector(sel + ' .js-plotly-plot');
    if (!el || !el.data) return null;
    const out = {};
    for (const t of el.data) if (t.name && t.name.endsWith(' block')) out[t.name] = (t.x || []).length;
    return out;
}"""


@pytest.fixture(scope="module")
def served():
    import app as app_module
    port = free_port()
    config = EngineConfig(model=APP_MODEL or EngineConfig().model, device="cpu", num_blocks=48,
                          kv_events={"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "topic": "kv"})
    holder = EngineHolder(config)
    holder.load()
    watching = kv_watch.Watching()
    watching.start(f"tcp://127.0.0.1:{port}#kv", None)
    web = free_port()
    demo = app_module.serve(holder, port=web, block=False, watching=watching)
    try:
        with browser_page(f"http://127.0.0.1:{web}/", CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, height=1400) as page:
            yield holder, watching, page
    finally:
        demo.close()
        watching.get().close()
        holder.engine.close()


def test_the_watched_tree_is_the_engines_own_tree(served):
    holder, watching, page = served
    engine = holder.get()
    open_tab(page, "KV blocks (live)")
    time.sleep(1.0)  # the watcher's subscription reaches the engine's publisher before anything is stored
    engine.generate([Request(prompt="Describe the picture.", images=[image(n)]) for n in
                     ("three_shapes.png", "two_shapes.png", "three_shapes.png", "red_circle.png")],
                    SamplingParams(max_tokens=20, ignore_eos=True))
    want = {f"{k} block": sum(n.kind == k for n in engine.prefix_tree()) for k in ("text", "image", "mixed")}
    assert want["image block"] + want["mixed block"] > 0
    page.locator("#kv-refresh, button:has-text('Refresh now')").first.click()  # the own panel redraws
    page.get_by_text("Watch a KV-event stream").first.click() if not page.locator("#kv-watch-tree").is_visible() \
        else None
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    own = watched = None
    while time.monotonic() < deadline and not (own == want and watched == want):
        own, watched = page.evaluate(KINDS, "#kv-tree"), page.evaluate(KINDS, "#kv-watch-tree")
        time.sleep(0.3)
    assert own == want and watched == want, (own, watched, want)
    status = page.locator("#kv-watch-status").inner_text()
    assert "vllm-map" in status and "decode errors: none" in status
    assert "connected" in status and "last batch" in status and "waiting" not in status  # its state (#40.6)
