"""Step-through in a real browser (Debian's chromium, headless, Playwright): pause the engine, launch 4 requests,
press Step 5 times; the decision log shows those 5 steps, the engine advanced exactly 5 steps, and the block map
is the engine's own state after them. Screenshot: $MINIVLM_SCREENSHOTS/kv_stepthrough.png (docs/screenshots to
refresh the README's), else the test's tmp dir."""
import os
import time

import pytest

from minivlm import EngineConfig

from panels.holder import EngineHolder
from panels.plots import block_cell
from tests.app_server import APP_MODEL, free_port
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, open_tab

pytestmark = pytest.mark.browser
NUM_BLOCKS = 48

MAP = """() => {
    const el = document.querySelector('#kv-map .js-plotly-plot');
    return el && el.data ? {z: el.data[0].z, title: el.layout.title.text, cols: el.layout.meta.cols} : null;
}"""


@pytest.fixture(scope="module")
def app():
    import app as app_module
    holder = EngineHolder(EngineConfig(model=APP_MODEL or EngineConfig().model, device="cpu", num_blocks=NUM_BLOCKS))
    holder.load()
    port = free_port()
    demo = app_module.serve(holder, port=port, block=False)
    yield holder, f"http://127.0.0.1:{port}/"
    demo.close()
    holder.engine.close()


@pytest.fixture(scope="module")
def page(app):
    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        pg = browser.new_page(viewport={"width": 1400, "height": 1100})
        pg.set_default_timeout(TIMEOUT_MS)
        pg.goto(app[1])
        pg.wait_for_selector("#chatbot")
        yield pg
        browser.close()


def logged_steps(page) -> list[int]:
    """The steps the decision log lists, newest first."""
    items = page.locator("#kv-decisions li:not(li li)").all_inner_texts()
    return [int(t.split("step ")[1].split(" ")[0]) for t in items if t.startswith("step ")]


def test_pause_launch_step_five_times(app, page):
    holder, _ = app
    engine = holder.get()
    open_tab(page, "KV blocks (live)")
    page.locator("#kv-pause").click()
    page.wait_for_function("document.querySelector('#kv-summary')?.innerText.includes('engine paused')")
    before = page.wait_for_function(MAP).json_value()
    start = engine.snapshot().step
    page.locator("#kv-n input[type=number]").fill("4")
    page.locator("#kv-n input[type=number]").press("Tab")
    page.locator("#kv-launch").click()
    deadline = time.monotonic() + 60
    while not engine.has_unfinished() and time.monotonic() < deadline:
        time.sleep(0.2)  # the launch reached the engine's inbox
    assert engine.snapshot().step == start  # paused: nothing ran
    for i in range(1, 6):
        page.locator("#kv-step1").click()
        page.wait_for_function(f"document.querySelectorAll('#kv-decisions li:not(li li)').length >= {i}")
    assert logged_steps(page) == [start + 5, start + 4, start + 3, start + 2, start + 1]
    assert engine.snapshot().step == start + 5 and engine.loop.is_paused()
    assert "arrived" in page.locator("#kv-decisions").inner_text()
    after = page.wait_for_function(MAP).json_value()
    assert f"step {start + 5}" in after["title"] and after["z"] != before["z"]
    snap = engine.snapshot()
    coloured = {(x, y) for y, row in enumerate(after["z"]) for x, v in enumerate(row) if v is not None and v >= 2}
    assert coloured == {block_cell(b.block_id, after["cols"]) for b in snap.blocks if b.ref_count > 0} != set()
    timeline = page.evaluate("document.querySelector('#kv-timeline .js-plotly-plot').data[0].y")
    assert sorted(timeline) == sorted(snap.running + snap.waiting) and len(timeline) == 4
    out = os.environ.get("MINIVLM_SCREENSHOTS")
    if out:
        os.makedirs(out, exist_ok=True)
        page.screenshot(path=os.path.join(out, "kv_stepthrough.png"), full_page=True)
    page.locator("#kv-resume").click()  # Run: the requests finish; nothing was lost by pausing
    page.wait_for_function("document.querySelector('#kv-summary')?.innerText.includes('4 finished')")
    assert not engine.loop.is_paused() and not engine.has_unfinished()
