"""The app in a real browser on the hybrid models (#41): Qwen3.5 (recurrent state slots) and Gemma 3 (sliding
window), each served from a random-weight checkpoint saved by transformers. The status line says what each KV-cache
group holds; a chat with a picture is answered; the KV tab's launcher fills the block map and, under it, the group
views of the same step (Gemma 3: the sliding tables with blocks that left the window; Qwen3.5: who holds which state
slot and the checkpoints), what they draw equal to the engine's own groups replayed at that step, the decision log
saying the group events; Anatomy draws with no error (Gemma 3 also with pan-and-scan crops); the inspector's hybrid
preset fools key A only; on a phone in the dark theme the group views and Anatomy read at WCAG contrast and the page
stays as wide as the screen. Screenshots: hybrid_*.png."""
import io
import os
import re

import pytest
from PIL import Image, ImageDraw

from minivlm.views.events import replay
from panels.group_replay import group_frame
from panels.holder import EXAMPLES_DIR
from tests.app_server import app_in_process, browser_page, keep_shot
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, shots  # noqa: F401
from tests.test_browser_header_models import errors_on_page
from tests.test_browser_matrix import send
from tests.test_browser_readable import MIN_CONTRAST, SCOPES, contrast, drawn_behind, measure, settle, show_anatomy
from tests.test_browser_ui import launch_and_wait, new_page, open_tab

pytestmark = pytest.mark.browser
PLOT = "document.querySelector('#{} .js-plotly-plot')"
GROUP = {"qwen3_5": ("recurrent", "recurrent state (layers"), "gemma3": ("sliding_window", "sliding window (layers")}

# what the group views draw: per sliding row its cells, the recurrent slots, the heading's step
DRAWN = """() => {
    const box = document.querySelector('#kv-groups-body');
    if (!box) return null;
    const rows = {};
    for (const row of box.querySelectorAll('.kvg-row'))
        rows[row.dataset.request] = [...row.querySelectorAll('.kvg-cell')].map(
            (c) => c.dataset.state === 'left' ? null : +c.dataset.block);
    const slots = {};
    for (const c of box.querySelectorAll('.kvg-slots .kvg-cell'))
        slots[c.dataset.slot] = [c.dataset.state, c.dataset.holder || c.dataset.key || ''];
    const step = /step (\\d+)/.exec(box.innerText);
    return {rows, slots, step: step ? +step[1] : null};
}"""

# every word of the group views with its colour (opacities applied) and box, and the page's width
WORDS = """() => {
    const rgba = (s) => { const m = (s.match(/[\\d.]+/g) || ['0', '0', '0', '0']).map(Number);
                          return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
    const alpha = (el) => { let a = 1; for (let e = el; e; e = e.parentElement) a *= +getComputedStyle(e).opacity;
                            return a; };
    const words = [];
    for (const el of document.querySelectorAll('#kv-groups *')) {
        const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
        if (!own || !el.checkVisibility({checkVisibilityCSS: true})) continue;
        const fill = rgba(getComputedStyle(el).color);
        fill[3] *= alpha(el);
        const r = el.getBoundingClientRect();
        words.push({text: el.textContent.trim().slice(0, 40), fill,
                    box: {x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height}});
    }
    return {words, width: document.scrollingElement.scrollWidth, screen: innerWidth};
}"""


# Gemma 3's walk (sliding-window groups, pan-and-scan) runs with -m slow: the default run keeps Qwen3.5's walk through
# the same tabs and views, and tests/test_group_views.py checks Gemma 3's drawn tables, anatomy and preset
@pytest.fixture(scope="module", params=["qwen3_5", pytest.param("gemma3", marks=pytest.mark.slow)])
def served(request, tmp_path_factory):
    from tools.make_checkpoint_gemma3 import make_gemma3_checkpoint
    from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
    make = {"qwen3_5": make_qwen3_5_checkpoint, "gemma3": make_gemma3_checkpoint}[request.param]
    path = make(str(tmp_path_factory.mktemp(request.param)), seed=7)
    with app_in_process(64, model=path) as (holder, url):
        with browser_page(url, CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS) as page:
            yield request.param, holder, url, page


def test_status_line_and_a_chat_with_a_picture(served, shots):
    name, holder, _, page = served
    status = page.locator("#engine-status").inner_text()
    assert f"({name}) on" in status and "KV-cache groups: full attention (layer" in status and \
        GROUP[name][1] in status
    send(page, "What color is the shape?", os.path.join(EXAMPLES_DIR, "red_circle.png"))
    page.locator("#chatbot .user-row img, #chatbot [data-testid=user] img").first.wait_for()
    keep_shot(page, shots, f"hybrid_chat_{name}.png", full_page=True)


def test_the_kv_tab_draws_each_group_at_the_maps_step(served, shots):
    name, holder, _, page = served
    open_tab(page, "KV blocks (live)")
    launch_and_wait(page, requests=4, tokens=24)
    kind = GROUP[name][0]
    page.wait_for_function(f"document.querySelector(\"#kv-groups [data-group='{kind}']\")")
    drawn = page.wait_for_function(f"""() => {{
        const d = ({DRAWN})();
        const m = {PLOT.format('kv-map')};
        const at = m && m.layout && /step (\\d+):/.exec(m.layout.title.text);
        return d && at && d.step === +at[1] ? d : null; }}""").json_value()  # the map's step, redrawn with it
    engine = holder.get()
    events = engine.events()
    full = replay(events, engine.num_blocks, engine.config.block_size, until_step=drawn["step"])
    frame = group_frame(events, engine.snapshot().groups, full, engine.config.block_size)
    group = next(g for g in frame.groups if g.kind == kind)
    if kind == "sliding_window":
        assert drawn["rows"] == group.block_tables and any(None in t for t in group.block_tables.values())
        assert "window moved on" in page.locator("#kv-decisions").inner_text()
    else:
        running = {str(t[0]): ["running", rid] for rid, t in group.block_tables.items()}
        assert running and {s: v for s, v in drawn["slots"].items() if v[0] == "running"} == running
        assert {s for s, v in drawn["slots"].items() if v[0] == "checkpoint"} == \
            {str(s) for s in group.checkpoints.values()} != set()
        page.locator("#kv-step input[type=range]").evaluate("(el) => { el.value = el.min; }")  # the log's start
        assert re.search(r"recurrent state after \d+ tokens saved in slot \d+",
                         page.locator("#kv-decisions").inner_text() + page.locator("#kv-groups").inner_text())
    assert "KV-cache groups this run" in page.locator("#kv-summary").inner_text()
    keep_shot(page, shots, f"hybrid_kv_{name}.png", full_page=True)


def wide_scene(path: str) -> str:
    img = Image.new("RGB", (640, 256), (235, 235, 230))
    draw = ImageDraw.Draw(img)
    draw.ellipse((30, 40, 210, 220), fill=(220, 30, 30))
    draw.rectangle((420, 50, 610, 210), fill=(40, 70, 220))
    img.save(path)
    return path


def test_anatomy_draws_with_no_error(served, shots, tmp_path):
    name, _, _, page = served
    open_tab(page, "Anatomy")
    page.locator("#anat-show").click()
    page.wait_for_function("/\\d+ prompt tokens/.test(document.querySelector('#anat-summary')?.innerText || '')")
    for panel in ("anat-grid", "anat-strip", "anat-rope"):
        page.wait_for_function(f"{PLOT.format(panel)}?.data")
    page.locator("#anatomy-keys-table").wait_for()
    page.wait_for_timeout(500)
    assert not errors_on_page(page), errors_on_page(page)
    grid = page.evaluate(f"{PLOT.format('anat-grid')}.layout.title.text")
    if name == "gemma3":  # one view of 16 soft tokens; then pan-and-scan on a long image: the whole + 2 crops
        assert "1 view of 64×64 px" in grid and "= 16 soft tokens" in grid and "&lt;start_of_image&gt;" in grid
        page.locator("#anat-pixels input[type=number]").fill("1")
        page.locator("#anat-pixels input[type=number]").press("Enter")
        page.locator("#anat-img1 input[type=file]").set_input_files(wide_scene(str(tmp_path / "wide.png")))
        page.wait_for_function(f"/3 views of 64×64 px/.test({PLOT.format('anat-grid')}?.layout?.title?.text)")
        assert "2 pan-and-scan crops" in page.evaluate(f"{PLOT.format('anat-grid')}.layout.title.text")
        assert "img 1 crop 2" in str(page.evaluate(f"{PLOT.format('anat-rope')}.layout.yaxis.ticktext"))
    else:  # Qwen3-VL's patches and M-RoPE
        assert re.search(r"\d+×\d+ patches of 16 px · 2×2 merge", grid), grid
        assert len(page.evaluate(f"{PLOT.format('anat-rope')}.data")) == 3
    assert not errors_on_page(page), errors_on_page(page)
    keep_shot(page, shots, f"hybrid_anatomy_{name}.png", full_page=True)


@pytest.mark.slow  # ~25 s for both families; the default run's readable test covers the phone and the dark theme
def test_a_phone_in_the_dark_reads_the_group_views(served, shots):
    name, _, url, page = served
    pg = new_page(page, url, 390, "?__theme=dark")
    try:
        open_tab(pg, "KV blocks (live)")
        launch_and_wait(pg, requests=3, tokens=16)
        pg.wait_for_function(f"document.querySelector(\"#kv-groups [data-group='{GROUP[name][0]}'] .kvg-cell\")")
        settle(pg, "#kv-groups")
        height = pg.evaluate("document.scrollingElement.scrollHeight")
        pg.set_viewport_size({"width": 390, "height": height})  # one frame: boxes and pixels agree
        settle(pg, "#kv-groups")
        found = pg.evaluate(WORDS)
        path = os.path.join(shots, f"hybrid_phone_dark_kv_{name}.png")
        shot = Image.open(io.BytesIO(pg.screenshot(path=path))).convert("RGB")
        faint = []
        for word in found["words"]:
            behind = drawn_behind(shot, word["box"])
            if behind is None:
                continue
            r, g, b, a = word["fill"]
            if a < 0.05:  # not drawn (gradio's hidden progress timer)
                continue
            ratio = contrast([a * c + (1 - a) * bg for c, bg in zip((r, g, b), behind)], behind)
            if ratio < MIN_CONTRAST:
                faint.append(f"{word['text']} ({ratio:.2f}:1)")
        assert len(found["words"]) > 10 and not faint, faint
        assert found["width"] <= found["screen"] + 2, found["width"]
        pg.set_viewport_size({"width": 390, "height": 900})
        show_anatomy(pg)  # its figures' words, measured as tests/test_browser_readable.py measures every tab's
        settle(pg, SCOPES["anatomy"])
        assert measure(pg, SCOPES["anatomy"], shots, f"hybrid_phone_dark_anatomy_{name}") == {}
    finally:
        pg.close()


def test_the_inspectors_hybrid_preset_fools_key_a(served, shots):
    """The served model is hybrid: the preset runs on it (its pair shown in the inputs); row A has false hits
    (column 3), B and C none, and the note says what this model's hit restored besides K/V."""
    name, _, _, page = served
    open_tab(page, "Cache inspector")
    page.locator("#preset-hybrid").click()
    page.wait_for_function("+document.querySelector('#insp-results [data-testid=cell-0-3]')?.innerText > 0")
    false = [page.locator(f"#insp-results [data-testid=cell-{r}-3]").inner_text().strip() for r in range(3)]
    assert int(false[0]) > 0 and false[1:] == ["0", "0"]
    note = page.locator("#insp-hybrid-note")
    note.wait_for()
    assert "ran on the served" in note.inner_text() and "Under A request 2 hit" in note.inner_text()
    word = "the recurrent state at token" if name == "qwen3_5" else "the sliding-window blocks before token"
    assert word in note.inner_text()
    assert page.locator("#insp-img1 img").count() and page.locator("#insp-img2 img").count()  # the pair it ran
    page.wait_for_function("document.querySelector('#insp-blocks .js-plotly-plot')?.data?.length > 0")
    keep_shot(page, shots, f"hybrid_inspector_{name}.png", full_page=True)
