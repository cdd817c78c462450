"""The page as people see it, in a real browser (Debian's chromium, headless, Playwright), #24 items 11, 12, 13, 15:
every tab readable in the dark theme (the figures follow it: no white paper, their words light), at phone width
(400 px: the header folds, the block map's cells and ref-count discs stay apart, no modebar over a title), the
lesson's 16-block pool (the whole legend shows, whole-step ticks, preemptions marked), accessible names, and an
HTTP API request's blocks in the KV map (the app serves the API on the page's port).
Screenshots (looked at when changing the page): ui_*.png in $MINIVLM_SCREENSHOTS when it is set."""
import os
import re
import time

import openai
import pytest

from panels.plots import block_cell, request_color
from tests.api_app import MODEL, image_message
from tests.app_server import app_in_process, keep_shot
from tests.test_browser import SHOWN_STEP, TIMEOUT_MS, served_app_and_page

pytestmark = pytest.mark.browser
NUM_BLOCKS = 256  # the tiny model's default pool: what `python app.py` serves
WORDS = ".gtitle, .xtitle, .ytitle, .xtick text, .ytick text, .legendtext, .annotation-text"  # a figure's own words

app, page = served_app_and_page(NUM_BLOCKS)

# WCAG contrast of each visible text against what is behind it (the first opaque background up the tree; in a
# figure, its paper when that is opaque): the texts under 4.5:1, and the figures whose paper is not see-through
CONTRAST = """([scope, words]) => {
    const rgba = (s) => { const m = (s.match(/[\\d.]+/g) || ['0', '0', '0', '0']).map(Number);
                          return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
    const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
                         return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
    const ratio = (a, b) => (Math.max(lum(a), lum(b)) + 0.05) / (Math.min(lum(a), lum(b)) + 0.05);
    const behind = (el) => {
        const plot = el.closest('.js-plotly-plot');
        if (plot && el instanceof SVGElement) {
            const paper = rgba(plot._fullLayout.paper_bgcolor);
            if (paper[3] > 0.5) return paper;
            el = plot;
        }
        for (let e = el; e; e = e.parentElement) {
            const c = rgba(getComputedStyle(e).backgroundColor);
            if (c[3] > 0.5) return c;
        }
        return [255, 255, 255, 1];
    };
    const bad = [], opaque = [];
    for (const root of document.querySelectorAll(scope)) {
        if (!root.offsetParent) continue;
        for (const plot of root.querySelectorAll('.js-plotly-plot'))
            for (const key of ['paper_bgcolor', 'plot_bgcolor'])
                if (rgba(plot._fullLayout[key])[3] > 0) opaque.push(`${plot.parentElement.closest('[id]').id} ${key}`);
        const texts = [...root.querySelectorAll(words)].filter((t) => t.getBoundingClientRect().width > 0);
        for (const t of texts) {
            if (!t.textContent.trim()) continue;
            const own = [...t.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim()) || t instanceof SVGElement;
            if (!own) continue;
            const style = getComputedStyle(t), bg = behind(t);
            let fg = rgba(t instanceof SVGElement ? style.fill : style.color), alpha = fg[3];
            for (let e = t; e; e = e.parentElement) alpha *= +getComputedStyle(e).opacity;
            fg = fg.map((v, i) => i < 3 ? alpha * v + (1 - alpha) * bg[i] : 1);  // what the eye gets
            const r = ratio(fg, bg);
            if (r < 4.5) bad.push(`${t.textContent.trim().slice(0, 40)} (${r.toFixed(2)}:1)`);
        }
    }
    return {bad: bad.slice(0, 12), opaque};
}"""

# what gradio fades while an event runs is drawn at full opacity again: the page shows its result
SETTLED = """(scope) => [...document.querySelectorAll(scope)].every((root) => {
    let alpha = 1;
    for (let e = root; e; e = e.parentElement) alpha *= +getComputedStyle(e).opacity;
    return alpha > 0.99 && !root.querySelector('.pending, .generating');
})"""


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    out = os.environ.get("MINIVLM_SCREENSHOTS") or str(tmp_path_factory.mktemp("screenshots"))
    os.makedirs(out, exist_ok=True)
    return out


def new_page(page, url: str, width: int, query: str = "", height: int = 900, lang: str | None = None):
    """Another page of the module's browser, `width` × `height` px, open on the app (in `lang`'s locale: the
    browser asks for that language)."""
    locale = dict(locale=lang, extra_http_headers={"Accept-Language": lang}) if lang else {}
    pg = page.context.browser.new_context(viewport={"width": width, "height": height}, **locale).new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(url + query)
    pg.wait_for_selector("#chatbot")
    return pg


def open_tab(pg, name: str):
    """Click a tab, through the "More tabs" menu when the page is too narrow to show it."""
    tab = pg.get_by_role("tab", name=name)
    if tab.count() and tab.is_visible():
        tab.click()
    else:
        pg.get_by_label("More tabs").click()
        pg.locator(".overflow-dropdown button", has_text=name).click()


def launch_and_wait(pg, requests: int | None = None, tokens: int | None = None):
    """Launch from the KV tab (its sliders at `requests` × `tokens`) and wait until the finished run is drawn."""
    for field, value in (("#kv-n", requests), ("#kv-tokens", tokens)):
        if value is not None:
            pg.locator(f"{field} input[type=number]").fill(str(value))
            pg.locator(f"{field} input[type=number]").press("Tab")
    pg.locator("#kv-launch").click()
    pg.wait_for_function("/steps recorded/.test(document.querySelector('#kv-step')?.innerText) && "
                         "/finished/.test(document.querySelector('#kv-summary')?.innerText) && "
                         "/· replay/.test(document.querySelector('#kv-summary')?.innerText)")
    pg.wait_for_function("document.querySelector('#kv-tree .js-plotly-plot')?.data")


def show_every_tab(pg, shots: str, name: str):
    """Visit the tabs, filling each with what it draws, and check what is readable; screenshots as ui_{name}_*."""
    problems = {}
    for tab, scope, fill in (("Chat", "#chatbot", None), ("Anatomy", "#anat-grid, #anat-rope, #anat-strip, #anat-keys",
                                                          "#anat-show"),
                             ("KV blocks (live)", "#kv-map, #kv-tree, #kv-timeline", "#kv-launch"),
                             ("Cache inspector", "#insp-blocks", "#preset-0"), ("VRAM budget", "#vram-plot", None)):
        open_tab(pg, tab)
        if fill == "#anat-show":
            pg.locator(fill).click()
            pg.locator("#anatomy-keys-table").wait_for()
            pg.wait_for_function("document.querySelector('#anat-strip .js-plotly-plot')?.data")
        elif fill == "#kv-launch":
            launch_and_wait(pg)
        elif fill == "#preset-0":  # same text, different image: the reused blocks' figure
            pg.locator(fill).click()
            pg.wait_for_function("document.querySelector('#insp-blocks .js-plotly-plot')?.data")
        elif tab == "VRAM budget":
            pg.wait_for_function("document.querySelector('#vram-plot .js-plotly-plot')?.data")
        pg.wait_for_function(SETTLED, arg=scope)
        pg.wait_for_timeout(500)
        found = pg.evaluate(CONTRAST, [scope, WORDS + ", #anatomy-keys-table *"])
        if found["bad"] or found["opaque"]:
            problems[tab] = found
        keep_shot(pg, shots, f"ui_{name}_{tab.split()[0].lower()}.png", full_page=True)
    return problems


@pytest.mark.slow  # every tab in two themes: most of a minute; CI runs it with -m slow
def test_every_tab_is_readable_in_the_dark_theme_and_the_light_one(app, page, shots):
    """#24 item 11: the figures' paper is see-through (the page's colour shows), their words and the anatomy key
    table's text read at >= 4.5:1 on what is behind them, in both themes."""
    for theme, query in (("dark", "?__theme=dark"), ("light", "?__theme=light")):
        pg = new_page(page, app[1], 1400, query)
        try:
            assert pg.evaluate("document.body.classList.contains('dark')") == (theme == "dark")
            assert show_every_tab(pg, shots, theme) == {}, theme
        finally:
            pg.context.close()


def overlaps(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and \
        a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


MAP_GEOMETRY = """() => {
    const el = document.querySelector('#kv-map .js-plotly-plot');
    const scatter = el.data.filter((t) => t.type === 'scatter');
    const k = scatter.findIndex((t) => t.name === 'ref count (shared)');
    const discs = [...el.querySelectorAll('.scatterlayer .trace')[k].querySelectorAll('.point')]
        .map((p) => p.getBoundingClientRect()).map((r) => ({x: r.x, y: r.y, width: r.width, height: r.height}));
    const box = (sel) => { const r = el.querySelector(sel)?.getBoundingClientRect();
                           return r ? {x: r.x, y: r.y, width: r.width, height: r.height} : null; };
    return {cols: el.layout.meta.cols, rows: el.data[0].z.length, width: el._fullLayout.xaxis._length,
            height: el._fullLayout.yaxis._length, discs, title: box('.gtitle'), cells: box('.hm image'),
            svg: box('.main-svg'), legend: [...el.querySelectorAll('.legend .traces')].map((t) => {
                const r = t.getBoundingClientRect(); return {x: r.x, y: r.y, width: r.width, height: r.height,
                                                             name: t.textContent}; })};
}"""


PHONE = (390, 844)  # a phone's viewport (CSS px)
# every tab button: its name and whether it lies whole inside the first screen (the viewport, unscrolled)
TABS_IN_SIGHT = """() => [...document.querySelectorAll('[role=tablist] [role=tab]')].map((t) => {
    const r = t.getBoundingClientRect();
    return {name: t.textContent.trim(), inside: r.width > 0 && r.left >= 0 && r.top >= 0 && r.right <= innerWidth
            && r.bottom <= innerHeight}; })"""


def tabs_in_sight(pg) -> list[dict]:
    pg.evaluate("window.scrollTo(0, 0)")
    return pg.evaluate(TABS_IN_SIGHT)


def test_phone_width_folds_the_header_and_keeps_the_map_readable(app, page, shots):
    """#24 item 12, #52 at a 390 × 844 phone: every tab lies inside the first screen (measured, whatever the fonts;
    the engine settings fold, and open on a tap), the block map takes the width with cells of >= 12 px and
    ref-count discs that never touch, and no modebar covers a title."""
    pg = new_page(page, app[1], PHONE[0], height=PHONE[1])
    try:
        keep_shot(pg, shots, "ui_phone_chat.png", full_page=True)
        pg.wait_for_function("!document.querySelector('#engine-settings > button.label-wrap.open')")  # folded
        tabs = tabs_in_sight(pg)
        assert len(tabs) == 7 and all(tab["inside"] for tab in tabs), tabs  # was ~1,400 px down, then 3 in a menu
        assert not pg.locator("#device-picker").is_visible()
        pg.locator("#engine-settings > button").click()
        pg.locator("#device-picker").wait_for()  # unfolded on request
        pg.locator("#engine-settings > button").click()
        open_tab(pg, "KV blocks (live)")
        launch_and_wait(pg, 8, 48)
        geo = pg.evaluate(MAP_GEOMETRY)
        assert geo["width"] / geo["cols"] >= 12 and geo["height"] / geo["rows"] >= 12, geo
        assert len(geo["discs"]) >= 2  # eight requests over three pictures share blocks
        touching = [(a, b) for i, a in enumerate(geo["discs"]) for b in geo["discs"][i + 1:] if overlaps(a, b)]
        assert touching == []
        for plot in pg.locator(".js-plotly-plot").all():
            if plot.is_visible() and plot.locator(".gtitle").count():
                plot.hover()  # a tap: where plotly shows its modebar
                bar = plot.locator(".modebar").bounding_box() if plot.locator(".modebar").is_visible() else None
                assert bar is None or not overlaps(bar, plot.locator(".gtitle").bounding_box())
        keep_shot(pg.locator("#kv-map"), shots, "ui_phone_kv_map.png")
        keep_shot(pg, shots, "ui_phone_kv.png", full_page=True)
    finally:
        pg.context.close()


# each tab's id, and what shows that its panel opened
TAB_CONTENT = {"chat": "#chatbot", "anatomy": "#anat-show", "kv": "#kv-launch", "inspector": "#preset-0",
               "vram": "#vram-model"}
# every visible form label on the page: its text, and whether it shows whole (no part cut off by its box or the
# block it labels, and not squeezed into a column of letters: at most 4 lines)
LABELS = """() => [...document.querySelectorAll('span[data-testid=block-info], label[data-testid=block-label]')]
    .filter((l) => l.offsetParent !== null && l.getBoundingClientRect().width > 0 && !l.closest('.sr-only, .hide'))
    .map((l) => {
        const r = l.getBoundingClientRect(), block = l.closest('.block')?.getBoundingClientRect() || r;
        return {text: l.textContent.trim(), whole: l.scrollWidth <= l.clientWidth + 1 && r.right <= block.right + 1
                && r.left >= block.left - 1
                && r.height <= 4.5 * (parseFloat(getComputedStyle(l).lineHeight) || 20)}; })"""  # not a column
BOX = "(el) => { const r = el.getBoundingClientRect(); return {x: r.x, y: r.y, width: r.width, height: r.height}; }"
# two or more plain English words in a row (identifiers such as gpu_memory_utilization, top-p or 256px are names)
ENGLISH_RUN = re.compile(r"(?<![\w-])[a-z]{2,}(?![\w-])\s+[a-z]{2,}(?![\w-])", re.I)


def label_box_and_buttons(pg, block: str):
    """An image-like block's label and its buttons (fullscreen, clear, share...) as boxes."""
    label = pg.locator(f"{block} label[data-testid=block-label]").first.evaluate(BOX)
    buttons = [b.evaluate(BOX) for b in pg.locator(f"{block} .icon-button-wrapper").all() if b.is_visible()]
    return label, buttons


@pytest.mark.parametrize("lang,theme", [("en", "light"),  # the Chinese walk (every tab again) runs with -m slow;
                                        pytest.param("zh-CN", "dark", marks=pytest.mark.slow)])  # i18n's stays
def test_phone_width_every_tab_one_tap_away_and_no_label_overlaps(app, page, shots, lang, theme):
    """#52 at 390 × 844, in English and in Chinese: every tab is in sight on the first screen and opens with one tap
    (no "…" menu); no label is cut off or lies over what it labels (the chat's over its first picture, the
    Anatomy image boxes' under their buttons, the VRAM tab's gpu_memory_utilization); the Chinese page shows no
    English label."""
    pg = new_page(page, app[1], PHONE[0], f"?__theme={theme}", height=PHONE[1], lang=lang)
    try:
        pg.wait_for_function("!document.querySelector('#engine-settings > button.label-wrap.open')")
        if lang.startswith("zh"):  # the status line in the page's language (the page's load redraws it)
            pg.wait_for_function("/[\u4e00-\u9fff]/.test(document.querySelector('#engine-status')?.innerText)")
        tabs = tabs_in_sight(pg)
        assert len(tabs) == 7 and all(tab["inside"] for tab in tabs), tabs  # Chat ... VRAM, Timeline, Roofline
        assert not pg.get_by_label("More tabs").is_visible()
        keep_shot(pg, shots, f"ui_phone_{lang}_{theme}.png")
        pg.locator("#chat-examples button.gallery-item").first.click()
        pg.wait_for_function("document.querySelector('#chat-input textarea')?.value.length > 0")  # the example is in
        pg.locator("#chat-input textarea").press("Enter")
        pg.locator("#chatbot img").first.wait_for()
        pg.wait_for_function("document.querySelector('#chat-stats')?.innerText.includes('·')")
        label, picture = pg.locator("#chatbot label[data-testid=block-label]").first.evaluate(BOX), \
            pg.locator("#chatbot img").first.evaluate(BOX)
        assert not overlaps(label, picture), (label, picture)
        english = []
        for k, (tab_id, content) in enumerate(TAB_CONTENT.items()):
            pg.locator("[role=tablist] [role=tab]").nth(k).click()  # one tap
            pg.locator(content).wait_for(state="visible")
            pg.wait_for_timeout(800)
            labels = pg.evaluate(LABELS)
            assert all(label["whole"] for label in labels), (tab_id, [x for x in labels if not x["whole"]])
            if lang.startswith("zh"):
                english += [x["text"] for x in labels if ENGLISH_RUN.search(x["text"])]
            if tab_id == "anatomy":
                for block in ("#anat-img1", "#anat-img2"):
                    label, buttons = label_box_and_buttons(pg, block)
                    assert buttons and not any(overlaps(label, b) for b in buttons), (block, label, buttons)
            keep_shot(pg, shots, f"ui_phone_{lang}_{theme}_{tab_id}.png", full_page=True)
        assert english == [], english
    finally:
        pg.context.close()


def test_after_a_run_the_map_has_no_empty_band_and_every_view_counts_the_same_cached_blocks(app, page):
    """One real run (8 requests over three pictures) on a desktop page, then two checks of what it drew:
    #24 item 13, the 256-block map: its cells fill the plot area (no band under the title or over the legend)
    and the legend sits inside the figure;
    #52: equal prompts computed in the same step leave copies of a block under one key, which no lookup finds; the
    rebuild note above the tabs, the KV tab's summary and the prefix tree count the prefix cache alike: the blocks a
    lookup finds (engine.prefix_tree()), of which the free ones are the summary's and the map's "cached"."""
    holder = app[0]
    pg = new_page(page, app[1], 1400)
    try:
        open_tab(pg, "KV blocks (live)")
        launch_and_wait(pg, 8, 24)
        geo = pg.evaluate(MAP_GEOMETRY)
        assert abs(geo["cells"]["height"] - geo["height"]) <= 2, geo
        assert geo["cells"]["y"] - (geo["title"]["y"] + geo["title"]["height"]) < 50
        assert all(inside(entry, geo["svg"]) for entry in geo["legend"])

        engine = holder.get()
        nodes, snap = engine.prefix_tree(), engine.snapshot()
        found = {n.block_id for n in nodes}
        free = sum(n.ref_count == 0 for n in nodes)
        assert {b.block_id for b in snap.blocks if b.cached} == {n.block_id for n in nodes if n.ref_count == 0}
        assert all(b.block_id in found for b in snap.blocks if b.cached)
        said = f"{len(nodes)} blocks a lookup finds ({len(nodes) - free} in use, {free} cached and free)"
        pg.wait_for_function("(said) => document.querySelector('#kv-tree .js-plotly-plot')?.layout.title.text"
                             ".includes(said)", arg=said)
        pg.locator("#kv-back").click()  # the run opens on its fullest step: back to the state the tree shows
        pg.wait_for_function(f"/step {snap.step} · live/.test(document.querySelector('#kv-summary')?.innerText)")
        summary = pg.locator("#kv-summary").inner_text()
        assert re.search(rf"/ cached {free} / free", summary), summary
        pg.wait_for_function("(n) => document.querySelector('#rebuild-note')?.innerText.includes(`${n} cached block`)",
                             arg=len(nodes))  # what a rebuild would empty: the same blocks
    finally:
        pg.context.close()


def test_an_api_request_appears_in_the_kv_map(app, page):
    """An HTTP API request in the real browser's KV map (the module's app serves the API on its port): while an
    `openai` client streams from the app, the KV tab of a fresh page shows its blocks under its api-… label; when
    the client hangs up, the engine aborts it and frees them."""
    holder, url = app
    client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=120)
    pg = new_page(page, url, 1400)
    try:
        open_tab(pg, "KV blocks (live)")
        pg.locator("#kv-map .js-plotly-plot").wait_for()
        stream = client.chat.completions.create(  # a long answer: it decodes while the page polls the engine
            model=MODEL, max_tokens=3900, stream=True, user="ann", extra_body={"ignore_eos": True},
            messages=image_message("red_circle.png"))
        request_id = next(iter(stream)).id.removeprefix("chatcmpl-")
        assert request_id.startswith("api-ann-")  # its label in the map says: the API, user ann
        holder.get().pause()  # it holds its blocks while the page draws them (a loaded machine could finish it first)
        try:
            plot = pg.wait_for_function("""(rid) => {
                const el = document.querySelector('#kv-map .js-plotly-plot');
                if (!el || !el.data || !el.data.some(t => t.name === rid)) return null;  // its legend entry
                return {z: el.data[0].z, scale: el.data[0].colorscale, cols: el.layout.meta.cols,
                        hover: el.data[0].text.flat().filter(t => t.includes(rid)).length};
            }""", arg=request_id).json_value()
            pg.wait_for_function("(rid) => document.querySelector('#kv-table')?.innerText.includes(rid)",
                                 arg=request_id)
            if os.environ.get("MINIVLM_API_SHOT"):
                pg.screenshot(path=os.environ["MINIVLM_API_SHOT"], full_page=True)
            table = holder.get().snapshot().block_tables.get(request_id, [])
        finally:
            holder.get().resume()
    finally:
        pg.context.close()
    colour = request_color(request_id)
    cells = [(x, y) for y, row in enumerate(plot["z"]) for x, v in enumerate(row)
             if v is not None and v >= 3 and plot["scale"][2 * v][1] == colour]
    assert len(cells) == plot["hover"] > 0  # its cells are drawn in its colour and name it on hover
    assert table and set(cells) <= {block_cell(b, plot["cols"]) for b in table}  # blocks it holds (and keeps)
    stream.response.close()  # the client hangs up mid-answer: the engine aborts the request and frees its blocks
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (request_id in holder.get().snapshot().block_tables):
        time.sleep(0.1)
    snap = holder.get().snapshot()
    assert request_id not in snap.block_tables and all(b.ref_count == 0 for b in snap.blocks)


def inside(a: dict, b: dict) -> bool:
    return b["x"] - 1 <= a["x"] and a["x"] + a["width"] <= b["x"] + b["width"] + 1 and \
        b["y"] - 1 <= a["y"] and a["y"] + a["height"] <= b["y"] + b["height"] + 1


@pytest.mark.slow  # 16 s: a fresh page and a whole lesson run; the step-through stays (test_browser_kvtab)
def test_the_lessons_16_block_pool(page, shots):
    """#24 item 13 on `python app.py --num-blocks 16` with the README lesson's launch: the map shows its whole
    legend ("free" too) at a readable size; a short run's step axis has whole steps only; a preemption is a marker
    at least 8 px wide whatever the run's length; a replay step typed past the run's end is refused with its limit,
    and the page then shows the step the box is put back to (not another one)."""
    with app_in_process(16) as (holder, url):
        pg = new_page(page, url, 1400)
        try:
            open_tab(pg, "KV blocks (live)")
            pg.locator("#kv-pause").click()
            pg.wait_for_function("document.querySelector('#kv-summary')?.innerText.includes('engine paused')")
            pg.locator("#kv-n input[type=number]").fill("6")
            pg.locator("#kv-n input[type=number]").press("Tab")
            pg.locator("#kv-launch").click()
            engine = holder.get()
            while not engine.has_unfinished():
                pg.wait_for_timeout(200)  # the launch reached the paused engine
            for i in (1, 2):
                pg.locator("#kv-step1").click()
                pg.wait_for_function(f"document.querySelectorAll('#kv-decisions li:not(li li)').length >= {i}")
            pg.wait_for_function("document.querySelector('#kv-timeline .js-plotly-plot')?.data?.[0]?.x?.length >= 2")
            ticks = pg.locator("#kv-timeline .xtick text").evaluate_all("els => els.map((e) => e.textContent)")
            assert ticks and all(t.strip().isdigit() for t in ticks), ticks  # not 0.5, 1.5, ...
            geo = pg.evaluate(MAP_GEOMETRY)
            names = [e["name"] for e in geo["legend"]]
            assert "free" in names and "cached (free)" in names
            assert all(inside(entry, geo["svg"]) for entry in geo["legend"]), geo
            assert geo["height"] / geo["rows"] >= 30 and geo["width"] / geo["cols"] >= 30  # cells, not slivers
            pg.locator("#kv-resume").click()
            while engine.has_unfinished() or engine.is_paused():
                pg.wait_for_timeout(200)
            assert any(e.kind == "preempted" for e in engine.events(0)), "the lesson's pool preempts one"
            pg.locator("#kv-back").click()
            pg.wait_for_function("""() => {
                const el = document.querySelector('#kv-timeline .js-plotly-plot');
                return el && el.data.some((t) => t.name === 'preempted' && t.x.length > 0); }""")
            marks = pg.evaluate("""() => {
                const el = document.querySelector('#kv-timeline .js-plotly-plot');
                const k = el.data.filter((t) => t.type === 'scatter').findIndex((t) => t.name === 'preempted');
                return [...el.querySelectorAll('.scatterlayer .trace')[k].querySelectorAll('.point')]
                    .map((p) => p.getBoundingClientRect().width); }""")
            assert marks and min(marks) >= 8, marks
            keep_shot(pg, shots, "ui_lesson_kv.png", full_page=True)
            box = pg.locator("#kv-step input[type=number]")
            first = int(pg.locator("#kv-step input[type=range]").get_attribute("min")) + 1
            box.fill(str(first))
            box.press("Enter")
            pg.wait_for_function(f"{SHOWN_STEP} === {first}")  # replaying an early step
            box.fill("9999")  # then a step past the run's end, typed
            box.press("Enter")
            last = int(pg.locator("#kv-step input[type=range]").get_attribute("max"))
            pg.wait_for_function(f"{SHOWN_STEP} === {last}")  # the page shows the step the box is put back to
            pg.locator(".toast-body").filter(has_text="9999").first.wait_for()  # and says why, with the limit (the
            # refusal's toast comes from the server, after the page has put the box back: waited for, not raced)
            assert int(box.input_value()) == last
        finally:
            pg.context.close()


def test_accessible_names(app, page):
    """#24 item 15: the chat box, the Device and Prefix-cache radio groups have names of their own; the examples
    are told apart and their pictures have alt text; one "Model" picker; greyed-out devices take no keyboard."""
    box = page.locator("#chat-input textarea")
    assert box.get_attribute("aria-label") and box.get_attribute("aria-label") != box.get_attribute("placeholder")
    assert page.get_by_role("textbox", name=box.get_attribute("aria-label"), exact=True).count() == 1
    for name in ("Device", "Prefix cache"):
        assert page.get_by_role("radiogroup", name=name, exact=True).count() == 1, name
    examples = page.locator("button.gallery-item").all()
    names = [e.get_attribute("aria-label") for e in examples if e.is_visible()]
    assert len(names) >= 8 and len(set(names)) == len(names), names
    assert all(img.get_attribute("alt") for e in examples if e.is_visible() for img in e.locator("img").all())
    assert page.get_by_role("combobox", name="Model", exact=True).count() == 1
    open_tab(page, "VRAM budget")  # its picker says what it is for; "Model" is the header's alone
    assert page.get_by_role("combobox", name="Model to budget", exact=True).count() == 1
    assert page.get_by_role("combobox", name="Model", exact=True).count() == 1
    open_tab(page, "Chat")
    greyed = page.locator("#device-picker label[data-testid*='unavailable'] input").all()
    for radio in greyed:  # e.g. mps on Linux
        assert radio.is_disabled()
        radio.evaluate("el => el.focus()")
        assert not radio.evaluate("el => el === document.activeElement")
