"""The VRAM tab in a real browser (Debian's chromium, headless): the KV-demand bar follows images per request, the
why-it-does-not-fit sentences appear, no label sits on a bar, the formulas are not clipped at 1400 px, the GPU
picker follows the device, the 72B example answers which GPUs it needs, the matrix VLMs' table on 16 / 24 / 48 / 80
GB GPUs follows the image size and context (readable at phone width and in dark mode), and the new presets (tiled,
text-only) work from the picker. Its screenshot is docs/screenshots' vram.png when $MINIVLM_SCREENSHOTS points
there."""
import contextlib
import os
import time

import pytest

from minivlm.budget import estimate, gpus_needed, image_plan
from minivlm.budget.planner import plan_matrix
from panels.vram import matrix_cell
from tests.app_server import keep_shot
from tests.test_browser import TIMEOUT_MS, app, open_tab, page, shots  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser
DEMAND = """() => {
  const plot = document.querySelector('#vram-plot .js-plotly-plot');
  const kv = plot && plot.data.find(t => t.name === 'KV demand vs pool');
  return kv ? [kv.x[0], kv.x[1]] : null;
}"""
LABELS_ON_BARS = """() => {
  const box = e => e.getBoundingClientRect();
  const bars = [...document.querySelectorAll('#vram-plot .bars path')].map(box)
    .filter(r => r.width > 1 && r.height > 1);
  const labels = [...document.querySelectorAll('#vram-plot .annotation-text, #vram-plot .xtick text, ' +
                                              '#vram-plot .ytick text, #vram-plot .legendtext')].map(box);
  const hit = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  return labels.filter(l => bars.some(b => hit(l, b))).length;
}"""
CLIPPED = """(id) => [...document.querySelectorAll(id + ' *')].filter(e => {
  const style = getComputedStyle(e);
  return ['auto', 'scroll', 'hidden'].includes(style.overflowX) && e.checkVisibility({checkVisibilityCSS: true}) &&
         e.scrollWidth > e.clientWidth + 1;
}).length"""


def wait_for(page, predicate, what):
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def chinese_page(page, url):
    """A second page of the same browser, opened as a zh-CN browser opens it; closed on exit."""
    context = page.context.browser.new_context(locale="zh-CN", extra_http_headers={"Accept-Language": "zh-CN"},
                                               viewport={"width": 1400, "height": 1000})
    try:
        zh = context.new_page()
        zh.set_default_timeout(TIMEOUT_MS)
        zh.goto(url)
        zh.wait_for_selector("#chatbot")
        yield zh
    finally:
        context.close()


def set_number(page, elem_id, value):
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")


def tokens_needed(images: int, seqs: int) -> int:
    """By hand: 1024×768 on Qwen2.5-VL is 27 × 37 = 999 vision tokens + start/end, 512 text tokens, whole blocks
    of 16."""
    return seqs * -(-(images * 1001 + 512) // 16) * 16


@pytest.mark.slow  # one of the default run's longest (> 20 s on 2 cores); CI runs it with -m slow
def test_vram_tab_explains_and_plans(page, shots):  # noqa: F811 (fixture)
    open_tab(page, "VRAM budget")
    headline = page.locator("#vram-headline")
    page.wait_for_function("document.querySelector('#vram-headline')?.innerText.includes('KV blocks')")
    wait_for(page, lambda: page.evaluate(DEMAND), "the KV demand bar")
    demand, pool = page.evaluate(DEMAND)
    assert demand == tokens_needed(1, 8) and pool > demand  # Qwen2.5-VL-3B on an L4: 1 image, 8 requests

    set_number(page, "vram-images", 8)
    demand8, pool8 = wait_for(page, lambda: (d := page.evaluate(DEMAND)) and d[0] != demand and d, "a new demand")
    assert demand8 == tokens_needed(8, 8) and pool8 == pool  # the demand bar moved, the pool did not
    wait_for(page, lambda: "Does not fit" in headline.inner_text(), "the verdict")
    assert "8 images × 1,001 tokens (999 vision + start/end) + 512 text tokens = 8,520 tokens per request > " \
           "max_model_len 4,096" in headline.inner_text()

    set_number(page, "vram-context", 16384)
    set_number(page, "vram-seqs", 64)
    wait_for(page, lambda: "64 requests × 8,528 tokens" in headline.inner_text(), "the KV pool sentence")
    assert "the KV pool holds" in headline.inner_text()
    assert page.evaluate(DEMAND)[0] == tokens_needed(8, 64)

    assert page.evaluate(LABELS_ON_BARS) == 0
    assert page.evaluate(CLIPPED, "#vram-breakdown") == 0  # the formulas wrap inside 1400 px

    page.locator("#vram-example-72b").click()
    final = ("4,516 tokens per request", "at 32,768 tokens", "(asked for 8) on 4× H100 80GB")  # every input set
    wait_for(page, lambda: all(s in headline.inner_text() for s in final), "the 72B answer")
    assert "Fits:" in headline.inner_text() and "Does not fit" not in headline.inner_text()
    plans = {p.device: p.gpus for p in gpus_needed("Qwen2.5-VL-72B-Instruct", images_per_request=4,
                                                   max_model_len=32768, num_seqs=8)}
    expected = {gpu: f"{plans[gpu]} × {gpu}" for gpu in ("A100 80GB", "H100 80GB", "H200")} | {"L4": "none up to 8"}
    rows = {}
    with contextlib.suppress(AssertionError):  # a clear failure below names what the table shows
        wait_for(page, lambda: (rows := {r[0]: r[1] for r in table_rows(page, "#vram-gpus")}) and
                 all(rows.get(k) == v for k, v in expected.items()), "the GPU table")
    rows = {r[0]: r[1] for r in table_rows(page, "#vram-gpus")}
    assert {k: rows.get(k) for k in expected} == expected
    assert page.evaluate(LABELS_ON_BARS) == 0
    keep_shot(page, shots, "vram.png", full_page=True)

    page.locator("#vram-tp label", has_text="2").click()  # half the GPUs: the device follows, the weights do not fit
    wait_for(page, lambda: "leave no room for the KV cache" in headline.inner_text(), "the memory sentence")
    assert "Does not fit" in headline.inner_text() and "on 2× H100 80GB" in headline.inner_text()


def table_rows(page, elem_id) -> list[list[str]]:
    """The body rows of a Gradio dataframe as the page shows them (cells carry data-testid cell-ROW-COL)."""
    return page.evaluate("""(id) => {
      const rows = {};
      for (const cell of document.querySelectorAll(id + ' [data-testid^=cell-]')) {
        const [, r, c] = cell.dataset.testid.split('-');
        (rows[r] = rows[r] || [])[c] = cell.innerText.trim();
      }
      return Object.values(rows);
    }""", elem_id)


CONTRAST = """(sel) => {
  const rgb = c => c.match(/[\\d.]+/g).map(Number);
  const lum = ([r, g, b]) => [r, g, b].map(v => v / 255).map(v => v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055)
    ** 2.4).reduce((a, v, i) => a + v * [0.2126, 0.7152, 0.0722][i], 0);
  const cell = document.querySelector(sel);
  let el = cell, bg = null;
  while (el && !bg) { const c = getComputedStyle(el).backgroundColor; if (rgb(c).length < 4 || rgb(c)[3] > 0) bg = c;
                      el = el.parentElement; }
  const [a, b] = [lum(rgb(getComputedStyle(cell).color)), lum(rgb(bg || 'rgb(255,255,255)'))];
  return [(Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), b];  // contrast ratio, background luminance
}"""


def choose(page, elem_id, name):
    box = page.locator(f"#{elem_id} input").first
    box.click()
    box.fill(name)
    page.get_by_role("option", name=name).first.click()


@pytest.mark.slow  # every preset of the matrix through the page: about a minute; CI runs it with -m slow
def test_vram_matrix_table_and_new_presets(page):  # noqa: F811 (fixture)
    open_tab(page, "VRAM budget")
    for elem_id, value in (("vram-images", 1), ("vram-context", 8192), ("vram-seqs", 16)):
        set_number(page, elem_id, value)
    page.locator("#vram-tp label", has_text="1").first.click()
    choose(page, "vram-device", "H100 80GB")
    expected = {m: [matrix_cell(e) for e in ests] for m, ests in
                plan_matrix(images_per_request=1, max_model_len=8192, num_seqs=16).items()}
    shown = {}
    with contextlib.suppress(AssertionError):
        wait_for(page, lambda: {r[0]: r[2:] for r in table_rows(page, "#vram-matrix")} == expected, "the matrix")
    shown = {r[0]: r[2:] for r in table_rows(page, "#vram-matrix")}
    assert shown == expected and len(shown) == 4  # 4 VLMs x 16 / 24 / 48 / 80 GB
    assert "✗" in "".join(expected["InternVL3_5-4B-HF"]) and "✓" in "".join(expected["Qwen2.5-VL-3B-Instruct"])

    boxes = page.locator("input[type=number]")
    wide = next(i for i in range(boxes.count()) if boxes.nth(i).input_value() == "1024")
    boxes.nth(wide).fill("448")
    boxes.nth(wide).press("Enter")  # a 448 x 768 image: InternVL cuts 1 x 2 tiles + a thumbnail
    tokens = f"{image_plan('InternVL3_5-4B-HF', 768, 448).vision_tokens:,} ("
    wait_for(page, lambda: any(r[0] == "InternVL3_5-4B-HF" and r[1].startswith(tokens)
                               for r in table_rows(page, "#vram-matrix")), "the matrix at the new image size")

    choose(page, "vram-model", "InternVL3.5 · InternVL3_5-8B-HF")
    headline = page.locator("#vram-headline")
    plan = image_plan("InternVL3_5-8B-HF", 768, 448)
    shown_plan = (f"{plan.vision_tokens:,} vision tokens per image resized to {plan.resized[1]}×{plan.resized[0]} in "
                  f"{plan.tiles} tiles")  # 1 x 2 tiles + the thumbnail
    wait_for(page, lambda: shown_plan in headline.inner_text(), "the InternVL headline")
    choose(page, "vram-model", "Qwen3 (text) · Qwen3-8B")
    est = estimate("Qwen3-8B", device="H100 80GB", max_model_len=8192, num_seqs=16)
    wait_for(page, lambda: "text-only model, no images" in headline.inner_text(), "the text-only headline")
    assert f"{est.needed_tokens_per_request:,} tokens per request" in headline.inner_text()
    assert f"{est.num_blocks:,} KV blocks" in headline.inner_text()

    page.set_viewport_size({"width": 390, "height": 900})  # phone width: the table wraps or scrolls inside itself
    try:
        page.locator("#vram-matrix").scroll_into_view_if_needed()
        box = page.locator("#vram-matrix").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 391
        assert page.evaluate("document.documentElement.scrollWidth") <= 391
        light = page.evaluate(CONTRAST, "#vram-matrix [data-testid^=cell-]")
        page.evaluate("document.body.classList.add('dark')")  # Gradio's dark theme hangs off this class
        dark = page.evaluate(CONTRAST, "#vram-matrix [data-testid^=cell-]")
        assert light[0] >= 4.5 and dark[0] >= 4.5 and dark[1] < light[1], (light, dark)  # dark, and readable
    finally:
        page.evaluate("document.body.classList.remove('dark')")
        page.set_viewport_size({"width": 1400, "height": 1000})


@pytest.mark.slow  # one of the default run's longest (> 20 s on 2 cores); CI runs it with -m slow
def test_an_int8_engine_is_named_so_and_presets_the_calculator(page):  # noqa: F811 (fixture)
    """#52, `python app.py --quantization int8`: the engine column's head names the quantization next to the
    compute dtype (its weights figure is the int8 one: memory_report's), and picking this engine's model presets
    the weights dtype to int8."""
    from tests.app_server import app_in_process
    with app_in_process(64, quantization="int8") as (holder, url):
        pg = page.context.browser.new_page(viewport={"width": 1400, "height": 1000})  # the module's browser
        pg.set_default_timeout(TIMEOUT_MS)
        pg.goto(url)
        pg.wait_for_selector("#chatbot")
        report = holder.get().memory_report()
        open_tab(pg, "VRAM budget")
        wait_for(pg, lambda: any("int8" in h for h in pg.locator("#vram-engine th").all_inner_texts()), "int8")
        head = " ".join(pg.locator("#vram-engine th").all_inner_texts())
        assert f"int8 weights, {report.dtype} compute" in head, head
        lines = [x.strip() for x in pg.locator("#vram-engine").inner_text().split("\n") if x.strip()]
        at = lines.index("weights (MiB)")  # its row: the estimate, then this engine's figure
        assert lines[at + 2] == f"{report.weights_bytes / 2**20:,.2f}", lines  # the int8 weights, as allocated
        choose(pg, "vram-model", "this engine's model")
        wait_for(pg, lambda: pg.locator("#vram-dtype input").first.input_value() == "int8", "the int8 preset")
        pg.close()



@pytest.mark.slow  # a second page in Chinese: about half a minute on a loaded machine; CI runs it with -m slow
def test_gemma4_shared_kv_layers_are_a_free_row_in_both_languages(page, app):  # noqa: F811 (fixture)
    """#54 item 3: Gemma 4 E2B from the picker: the breakdown's shared-KV row is 0 GiB and the verdict counts its 20
    shared layers as free, on this English page and on a page a zh-CN browser opens."""
    def shared_row(pg, name):
        return next((r for r in table_rows(pg, "#vram-breakdown") if r and r[0] == name), None)

    def check(pg, tab, item, groups):
        open_tab(pg, tab)
        choose(pg, "vram-model", "Gemma 4 (hybrid, shared KV) · gemma-4-E2B-it")
        row = wait_for(pg, lambda: shared_row(pg, item), f"the shared-KV row {item}")
        wait_for(pg, lambda: groups in pg.locator("#vram-headline").inner_text(), f"the verdict's {groups}")
        return row
    row = check(page, "VRAM budget", "KV cache: shared-KV layers (free)", "20 shared-KV layers (free")
    assert row[1] == "0.000" and "20 layers (15–34)" in row[2]
    with chinese_page(page, app[1]) as zh:
        row = check(zh, "显存预算", "KV 缓存：共享 KV 层（不占内存）", "20 层共享 KV（不占内存")
        assert row[1] == "0.000"


@pytest.mark.slow  # a second page in Chinese: about half a minute on a loaded machine; CI runs it with -m slow
def test_gemma4_soft_token_budget_knob_in_both_languages(page, app):  # noqa: F811 (fixture)
    """The soft-token budget knob (Gemma 4's max_soft_tokens) shows for a Gemma 4 model only; each budget picked there
    gives the verdict the tokens per 1024×768 image that transformers' Gemma 4 image processor counts under it, on
    this English page and on a page a zh-CN browser opens, where the knob is labelled in Chinese."""
    from PIL import Image
    from transformers.models.gemma4 import Gemma4ImageProcessorPil
    processor = Gemma4ImageProcessorPil(resample=0)

    def hf(budget):
        return processor(images=[Image.new("RGB", (1024, 768))], max_soft_tokens=budget)["num_soft_tokens_per_image"][0]

    def pick(pg, budget, words):
        choose(pg, "vram-soft-tokens", str(budget))
        wait_for(pg, lambda: words.format(n=f"{hf(budget):,}") in pg.locator("#vram-headline").inner_text(),
                 f"the tokens under {budget}")

    knob = page.locator("#vram-soft-tokens")
    open_tab(page, "VRAM budget")
    boxes = page.locator("input[type=number]")  # the matrix test before it (same page) left the image 448 wide
    for i in [i for i in range(boxes.count()) if boxes.nth(i).input_value() == "448"]:
        boxes.nth(i).fill("1024")
        boxes.nth(i).press("Enter")
    choose(page, "vram-model", "Qwen2.5-VL · Qwen2.5-VL-3B-Instruct")
    wait_for(page, lambda: not knob.is_visible(), "no knob for Qwen")
    choose(page, "vram-model", "Gemma 4 (hybrid, shared KV) · gemma-4-E4B-it")
    wait_for(page, knob.is_visible, "the knob for Gemma 4")
    assert "soft tokens per image at most (max_soft_tokens)" in knob.inner_text()
    wait_for(page, lambda: f"{hf(280):,} vision tokens per image" in page.locator("#vram-headline").inner_text(), "280")
    for budget in (70, 1120):
        pick(page, budget, "{n} vision tokens per image")
    choose(page, "vram-model", "Qwen2.5-VL · Qwen2.5-VL-3B-Instruct")
    wait_for(page, lambda: not knob.is_visible(), "the knob hidden again")
    with chinese_page(page, app[1]) as zh:
        open_tab(zh, "显存预算")
        choose(zh, "vram-model", "Gemma 4 (hybrid, shared KV) · gemma-4-E4B-it")
        wait_for(zh, zh.locator("#vram-soft-tokens").is_visible, "the knob on the Chinese page")
        assert "Gemma 4：每张图片最多的软 token 数（max_soft_tokens）" in zh.locator("#vram-soft-tokens").inner_text()
        pick(zh, 560, "每张图片 {n} 个视觉 token")
