"""The app in a real browser (Debian's chromium, headless, driven by Playwright): chat with an uploaded image, the
KV block map against the engine's own snapshots, the inspector's false hit, the VRAM presets. Screenshots of each
tab go to $MINIVLM_SCREENSHOTS (docs/screenshots to refresh the README's) when it is set (tests/app_server.py's
keep_shot: none is taken without it)."""
import os
import re
import shutil
import threading
import time

import pytest

from minivlm import EngineConfig, Request, SamplingParams

from panels.holder import EXAMPLES_DIR
from panels.plots import block_cell, request_color
from tests.app_server import APP_MODEL, app_in_process, browser_page, keep_shot

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
NUM_BLOCKS = 96
TIMEOUT_MS = 120_000


def served_app_and_page(num_blocks: int, height: int = 1000):
    """A module's two fixtures: `app`, the app served from this process on a `num_blocks` pool (so a test reads
    the same engine the page shows), and `page`, a browser page open on it."""
    @pytest.fixture(scope="module")
    def app():
        with app_in_process(num_blocks) as served:
            yield served

    @pytest.fixture(scope="module")
    def page(app):
        with browser_page(app[1], CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, height=height) as pg:
            yield pg
    return app, page


app, page = served_app_and_page(NUM_BLOCKS)


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    out = os.environ.get("MINIVLM_SCREENSHOTS") or str(tmp_path_factory.mktemp("screenshots"))
    os.makedirs(out, exist_ok=True)
    return out


SHOWN_STEP = ("(() => { const el = document.querySelector('#kv-map .js-plotly-plot');"
              " const m = el && el.layout && /step (\\d+):/.exec(el.layout.title.text); return m ? +m[1] : null; })()")
SHOWN_STEP_IS_SLIDER_VALUE = f"{SHOWN_STEP} === +document.querySelector('#kv-step input[type=range]').value"


def open_tab(page, name):
    page.get_by_role("tab", name=name).click()


def test_chat_streams_the_right_answer(page, shots):
    page.locator("#chat-input input[type=file]").set_input_files(os.path.join(EXAMPLES_DIR, "blue_circle.png"))
    page.locator("#chat-input textarea").fill("What color is the shape?")
    page.locator("#chat-input textarea").press("Enter")
    page.wait_for_function("document.querySelector('#chat-stats')?.innerText.includes('finish: stop')")
    bot = page.locator("#chatbot .message-row.bot-row, #chatbot [data-testid=bot]").last
    assert bot.inner_text().strip() == "blue"
    page.locator("#chatbot .user-row img, #chatbot [data-testid=user] img").first.wait_for()  # the uploaded image
    keep_shot(page, shots, "chat.png", full_page=True)


def shared_frame(page) -> dict:
    """The block map's data once the page draws a frame with blocks in use, some of them shared."""
    page.locator("#kv-map .js-plotly-plot").wait_for()
    return page.wait_for_function("""() => {
        const el = document.querySelector('#kv-map .js-plotly-plot');
        const z = el && el.data && el.data[0].z;
        const labels = el && el.data &&
            el.data.filter(t => t.name === 'ref count (shared)').map(t => [t.x, t.y, t.text])[0];
        // wait for a frame with blocks in use, some of them shared already
        if (!z || !z.flat().some(v => v >= 3) || !labels || !labels[0] || !labels[0].length) return null;
        return {z: z, scale: el.data[0].colorscale, title: el.layout.title.text, cols: el.layout.meta.cols,
                labels: labels};
    }""").json_value()


def test_block_map_matches_engine_snapshot(app, page, shots):
    holder, _ = app
    engine = holder.get()
    recorded, streams = {}, []
    started = threading.Event()

    def decode(name, question, max_tokens):
        req = Request(prompt=question, images=[os.path.join(EXAMPLES_DIR, name)])
        stream = engine.stream(req, SamplingParams(max_tokens=max_tokens, ignore_eos=True), snapshots=True)
        streams.append((req.request_id, stream))
        for ev in stream:
            if ev.snapshot is not None:  # the final (abort) event carries none
                recorded[ev.snapshot.step] = ev.snapshot
                started.set()
    # the two long ones share their prompt blocks
    threads = [threading.Thread(target=decode, args=a, daemon=True) for a in
               [("red_circle.png", "What color is the shape?", 1200)] * 2 +
               [("two_shapes.png", "How many shapes are there?", 64)]]
    open_tab(page, "KV blocks (live)")
    threads[0].start()
    started.wait(60)  # its prompt blocks are in the cache now: the same prompt next shares them (ref count 2)
    for t in threads[1:]:
        t.start()
    # the tiny model runs all three in ~2 s, about two of the page's polls: hold the engine while blocks are
    # shared, so the page's next frame is a shared one however slow the machine
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        engine.pause()  # between two steps
        if any(b.ref_count > 1 for b in engine.snapshot().blocks):
            break
        engine.resume()
        time.sleep(0.005)
    assert engine.is_paused(), "no step shared a block within 60 s"
    try:
        plot = shared_frame(page)
    finally:
        for rid, _ in streams:
            engine.abort(rid)
        engine.resume()
    step = int(plot["title"].split("step ")[1].split(":")[0])
    snap = recorded[step]
    cols = plot["cols"]
    used = [b for b in snap.blocks if b.ref_count > 0]
    coloured = {(x, y) for y, row in enumerate(plot["z"]) for x, v in enumerate(row) if v is not None and v >= 2}
    assert coloured == {block_cell(b.block_id, cols) for b in used} and len(used) > 0
    for b in used:
        x, y = block_cell(b.block_id, cols)
        assert plot["scale"][2 * plot["z"][y][x]][1] == request_color(b.owners[0])
    xs, ys, texts = plot["labels"]
    assert {(x, y): int(t) for x, y, t in zip(xs, ys, texts)} == \
        {block_cell(b.block_id, cols): b.ref_count for b in used if b.ref_count > 1} != {}
    for t in threads:
        t.join(60)
    page.locator("#kv-launch").click()
    page.wait_for_function("document.querySelector('#kv-step')?.innerText.includes('steps recorded')")
    page.wait_for_function(SHOWN_STEP_IS_SLIDER_VALUE)
    time.sleep(2.5)  # the live timer (1 s) fires meanwhile: an idle engine must not draw over the replayed step
    assert page.evaluate(SHOWN_STEP_IS_SLIDER_VALUE)
    keep_shot(page, shots, "kv_blocks.png", full_page=True)


def results_row(page, strategy):
    """The inspector's table row for one strategy, as the page shows it."""
    for r in range(3):
        cells = [page.locator(f"#insp-results [data-testid=cell-{r}-{c}]").inner_text().strip() for c in range(9)]
        if cells[0] == strategy:
            return cells
    raise AssertionError(f"no row for strategy {strategy}")


def test_inspector_preset_shows_false_hit_under_a_only(page, shots):
    open_tab(page, "Cache inspector")
    page.locator("#preset-0").click()  # same text, different image
    page.locator("#insp-results [data-testid=cell-2-0]").wait_for()
    a, c = results_row(page, "A"), results_row(page, "C")
    assert int(a[3]) > 0 and int(c[3]) == 0  # false hits
    assert c[6] == "blue" and a[6] == "red"  # answer for image 2: right under C, the red circle's under A
    keep_shot(page, shots, "cache_inspector.png", full_page=True)


def kv_blocks_in(headline: str) -> int | None:
    """The estimate's KV block count from the VRAM headline ('Fits: 22,652 KV blocks = ...')."""
    head = headline.split(" KV blocks")[0]
    return int(head.rsplit(" ", 1)[-1].replace(",", "")) if " KV blocks" in headline else None


def test_vram_preset_changes_the_numbers(page, shots):
    open_tab(page, "VRAM budget")
    headline = page.locator("#vram-headline")
    page.wait_for_function("document.querySelector('#vram-headline')?.innerText.includes('KV blocks')")
    before = kv_blocks_in(headline.inner_text())
    page.locator("#vram-device input").fill("H100 80GB")
    page.locator("#vram-device input").press("Enter")
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while kv_blocks_in(headline.inner_text()) in (before, None) and time.monotonic() < deadline:
        time.sleep(0.2)
    after = kv_blocks_in(headline.inner_text())
    assert after > 3 * before > 0  # 80 GB against the 24 GB L4 the tab starts with
    keep_shot(page, shots, "vram.png", full_page=True)


def toast_text(page) -> str:
    """The text of the newest toast the page shows (gr.Warning / gr.Error / gr.Info)."""
    toast = page.locator("[data-testid=toast-body]").last
    toast.wait_for()
    return toast.inner_text()


def close_toasts(page):
    for close in page.locator("[data-testid=toast-close]").all():
        close.click()


@pytest.mark.slow  # test_browser_header_models keeps a refused load leaving the old engine serving in the default run
def test_failed_hub_load_leaves_the_header_on_what_serves(app, page):
    """Bug: after a failed hub load the picker kept the hub id, so the next change retried it."""
    holder, _ = app
    page.locator("#model-picker input").click()
    page.get_by_role("option", name="Qwen/Qwen3-VL-2B-Instruct (hub)").click()
    page.wait_for_function("document.querySelector('#engine-status')?.innerText.includes('Still serving')")
    assert "--local-dir <dir>" in toast_text(page)  # the placeholder is text, not a swallowed tag
    page.wait_for_timeout(2000)  # the select's blur comes after it: no second attempt, no second toast
    toasts = page.locator("[data-testid=toast-body]").filter(has_text="could not fetch")
    assert toasts.count() == 1 and len(toasts.first.inner_text()) < 400  # once, and not a wall of text
    close_toasts(page)
    page.wait_for_function("document.querySelector('#model-picker input').value.startsWith('tiny-qwen-vl')")
    page.locator("#strategy-picker").get_by_text("B", exact=True).click()
    page.wait_for_function("document.querySelector('#engine-status')?.innerText.includes('prefix cache: B')")
    assert holder.config.cache_strategy == "B" and holder.config.model == (APP_MODEL or EngineConfig().model)
    page.locator("#strategy-picker").get_by_text("C", exact=True).click()
    page.wait_for_function("document.querySelector('#engine-status')?.innerText.includes('prefix cache: C')")
    assert page.locator("#strategy-picker input[value=C]").is_checked()


def test_seed_field_is_empty(page):
    """Bug: the seed field showed 0 while the request sent None (the engine's seed)."""
    open_tab(page, "Chat")
    page.get_by_text("Sampling", exact=True).click()
    seed = page.get_by_label("seed (empty = engine's)")
    seed.wait_for()
    assert seed.input_value() == ""


def test_inspector_names_the_unreadable_image(page, tmp_path):
    """Bug: a non-image upload showed a bare red "Error"."""
    open_tab(page, "Cache inspector")
    notes = tmp_path / "notes.png"
    notes.write_text("these are lecture notes, not a picture")
    page.locator("#insp-img1 input[type=file]").set_input_files(str(notes))
    page.locator("#insp-img2 input[type=file]").set_input_files(os.path.join(EXAMPLES_DIR, "red_circle.png"))
    page.locator("#insp-img2 img").wait_for()
    page.locator("#insp-run").click()
    text = toast_text(page)
    assert "Image 1" in text and "notes.png" in text and "not a readable image" in text, text
    close_toasts(page)


@pytest.mark.slow  # test_refusals / test_image_memory refuse pixel bombs in the default run; this walk is the UI's
def test_a_pixel_bomb_is_refused_from_its_header_in_the_inspector_and_anatomy(app, page, tmp_path):
    """#24 item 4: a 144 MP PNG of a few KB was decoded whole by the inspector (gr.Image type="pil") before the
    64 MP check, and the anatomy tab showed a bare "Error"; both now refuse it in the engine's words."""
    from PIL import Image
    huge = str(tmp_path / "huge.png")
    Image.new("1", (12_000, 12_000)).save(huge)
    words = "(huge.png) is 12000x12000 = 144 MP, over the 64 MP limit per image"
    open_tab(page, "Cache inspector")
    page.locator("#insp-img1 input[type=file]").set_input_files(os.path.join(EXAMPLES_DIR, "red_circle.png"))
    page.locator("#insp-img2 input[type=file]").set_input_files(huge)
    page.locator("#insp-img1 img").wait_for()
    page.locator("#insp-run").click()
    assert f"Image 2 {words}" in toast_text(page)
    close_toasts(page)
    open_tab(page, "Anatomy")
    page.locator("#anat-img1 img").first.wait_for()
    page.get_by_role("button", name="Remove Image").first.click()
    page.locator("#anat-img1 input[type=file]").set_input_files(huge)
    page.wait_for_function("[...document.querySelectorAll('[data-testid=toast-body]')].some(t => "
                           "t.innerText.includes('144 MP'))")
    assert f"Image {words}" in toast_text(page)
    close_toasts(page)
    assert holder_serves(app[0])


def holder_serves(holder) -> bool:
    out = holder.get().generate(Request(prompt="What color is the shape?",
                                        images=[os.path.join(EXAMPLES_DIR, "red_circle.png")]),
                                SamplingParams(max_tokens=4))
    return out.text.strip() == "red"



def test_replay_slider_redraws_on_enter_and_arrow_keys(page):
    """Bug: a typed step applied only on blur, arrow keys moved the slider without redrawing the map."""
    open_tab(page, "KV blocks (live)")
    page.locator("#kv-live input").uncheck()  # only the replay may redraw the map now
    for slider, value in (("#kv-n", 3), ("#kv-tokens", 20)):  # a run unlike the earlier test's, to tell them apart
        page.locator(f"{slider} input[type=number]").fill(str(value))
        page.locator(f"{slider} input[type=number]").press("Tab")
    page.locator("#kv-launch").click()
    # the launch returns once its run ended: the summary counts this run's 3 requests finished
    page.wait_for_function("() => /3 requests arrived, 3 finished/.test("
                           "document.querySelector('#kv-summary')?.innerText || '')")
    page.wait_for_function(SHOWN_STEP_IS_SLIDER_VALUE)  # the run's fullest step is drawn
    fullest = page.evaluate(SHOWN_STEP)
    label = page.locator("#kv-step").inner_text()
    lo, hi = map(int, re.search(r"in this run: (\d+)–(\d+)", label).groups())
    target = next(s for s in range(lo + 1, hi + 1) if s != fullest)  # inside the run, not the frame on screen
    number = page.locator("#kv-step input[type=number]")
    number.fill(str(target))
    number.press("Enter")
    page.wait_for_function(f"{SHOWN_STEP} === {target}")
    slider = page.locator("#kv-step input[type=range]")
    slider.focus()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"{SHOWN_STEP} === {target - 1}")
    page.locator("#kv-live input").check()
