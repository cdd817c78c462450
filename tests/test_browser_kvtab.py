"""Step-through in a real browser (Debian's chromium, headless, Playwright), following the README's step-through
lesson with its settings (16 blocks, 6 requests of up to 48 tokens, EOS not ignored): pause, launch, press Step 5
times (the decision log shows those 5 steps, the engine advanced exactly 5, the map is the engine's own state),
Step ×10 until a request is preempted (the log names it and why, the timeline marks it; a request with the same
picture as the first reused the first's image blocks), click a step on the timeline (its replay stays on screen
while the engine runs on), Back to live: all 6 requests finished. Screenshot:
$MINIVLM_SCREENSHOTS/kv_stepthrough.png (docs/screenshots to refresh the README's)."""
import os
import time

import pytest

from panels.plots import block_cell
from tests.app_server import app_in_process
from tests.test_browser import TIMEOUT_MS, open_tab, served_app_and_page

pytestmark = pytest.mark.browser
NUM_BLOCKS = 16  # the lesson's pool: six requests' descriptions outgrow it and one is preempted
REQUESTS = 6

MAP = """() => {
    const el = document.querySelector('#kv-map .js-plotly-plot');
    return el && el.data ? {z: el.data[0].z, title: el.layout.title.text, cols: el.layout.meta.cols} : null;
}"""


app, page = served_app_and_page(NUM_BLOCKS, height=1100)


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
    page.locator("#kv-n input[type=number]").fill(str(REQUESTS))
    page.locator("#kv-n input[type=number]").press("Tab")
    page.locator("#kv-launch").click()
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not engine.has_unfinished() and time.monotonic() < deadline:
        time.sleep(0.2)  # the launch reached the engine's inbox
    assert engine.has_unfinished(), "the launch never reached the engine"
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
    assert sorted(timeline) == sorted(snap.running + snap.waiting) and len(timeline) == REQUESTS
    first, fourth = sorted(timeline, key=lambda r: int(r.rsplit("-", 1)[1]))[:4:3]  # same picture, other question

    for _ in range(6):  # Step ×10 until the pool runs out
        shown = logged_steps(page)[0]
        page.locator("#kv-step10").click()
        page.wait_for_function(f"!document.querySelector('#kv-decisions').innerText.includes('step {shown} ·') || "
                               f"document.querySelector('#kv-decisions li')?.innerText.startsWith('step {shown + 10}')")
        if any(e.kind == "preempted" for e in engine.events(0)):
            break
    victim = next(e for e in engine.events(0) if e.kind == "preempted")
    log = page.locator("#kv-decisions").inner_text()
    hit = next(e for e in engine.events(0) if e.kind == "cache_lookup" and e.request_id == fourth)
    owned = next(e for e in engine.events(0) if e.kind == "allocated" and e.request_id == first).block_ids
    assert [h.block_id for h in hit.hits] == owned[:len(hit.hits)] != []  # the lesson's prefix hit: the image blocks
    assert f"{fourth} reused {len(hit.hits)} cached block(s) ({16 * len(hit.hits)} tokens)" in log
    assert f"{victim.request_id} preempted: {victim.reason}" in log and "none is free" in victim.reason
    timeline = page.evaluate("(() => { const d = document.querySelector('#kv-timeline .js-plotly-plot').data[0];"
                             " return {y: d.y, x: d.x, z: d.z}; })()")
    row = timeline["z"][timeline["y"].index(victim.request_id)]
    assert row[timeline["x"].index(victim.step)] == 4  # STATES.index("preempted")
    out = os.environ.get("MINIVLM_SCREENSHOTS")
    if out:
        os.makedirs(out, exist_ok=True)
        page.screenshot(path=os.path.join(out, "kv_stepthrough.png"), full_page=True)

    page.wait_for_function("document.querySelector('#kv-timeline .js-plotly-plot')?.dataset.stepHook")
    page.evaluate(f"document.querySelector('#kv-timeline .js-plotly-plot').emit('plotly_click', "
                  f"{{points: [{{x: {start + 1}}}]}})")
    page.wait_for_function(f"document.querySelector('#kv-summary')?.innerText.includes('step {start + 1} ·')")
    assert "· replay (live is at step" in page.locator("#kv-summary").inner_text()
    assert logged_steps(page) == [start + 1]
    engine.resume()  # the engine runs on (as another page's Run would) while the replay is on screen
    while engine.has_unfinished():
        time.sleep(0.2)
    time.sleep(2.5)  # two polls
    assert f"step {start + 1} ·" in page.locator("#kv-summary").inner_text()
    assert f"KV pool at step {start + 1}:" in page.evaluate(MAP.replace("() =>", "(() =>") + ")()")["title"]
    page.locator("#kv-back").click()  # Back to live: all four finished, none was lost by pausing
    page.wait_for_function(f"document.querySelector('#kv-summary')?.innerText.includes('{REQUESTS} finished')")
    assert " · live · " in page.locator("#kv-summary").inner_text()


@pytest.mark.slow  # one of the default run's longest (> 20 s on 2 cores); CI runs it with -m slow
def test_shared_deployment_tree_shows_the_sessions_own_engine(app, page):
    """On --shared a visitor's launch runs on an isolated engine of their own; the prefix tree under the block
    map must draw that engine, not the shared one (whose cache stays empty here)."""
    with app_in_process(64, shared=True) as (holder, url):
        try:
            page.goto(url)  # the module's browser, on a second (shared) app
            page.wait_for_selector("#chatbot")
            holder.get().reset_prefix_cache()
            open_tab(page, "KV blocks (live)")
            page.locator("#kv-n input[type=number]").fill("3")
            page.locator("#kv-n input[type=number]").press("Tab")
            page.locator("#kv-launch").click()
            page.wait_for_function("""() => {
                const el = document.querySelector('#kv-tree .js-plotly-plot');
                return el && el.data.filter(t => (t.name || '').endsWith(' block'))
                                     .reduce((n, t) => n + t.x.length, 0) > 0; }""")
            assert holder.get().prefix_tree() == []  # the shared engine served none of it
        finally:
            page.goto(app[1])
            page.wait_for_selector("#chatbot")
