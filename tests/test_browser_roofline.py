"""The Roofline tab in a real browser (Debian's chromium, headless): opened, it draws this engine's model predicted on
the machine's measured bound; Measure places the engine's own steps, and every sentence on the page does its
arithmetic with the numbers it shows (and agrees with the table and the plot); a preset is predicted from the VRAM
calculator's counts; on a phone in the dark theme, in Chinese, the plot's words read at contrast >= 4.5:1 and the
button is reached with the keyboard. Its screenshot is docs/screenshots' roofline.png when $MINIVLM_SCREENSHOTS
points there."""
import os
import re

import pytest

from minivlm.budget.roofline import model_costs
from panels.i18n import ZH, t
from panels.roofline_figure import num
from tests.app_server import keep_shot
from tests.test_browser import served_app_and_page, shots  # noqa: F401 (fixtures)
from tests.test_browser_readable import PHONE, measure, settle
from tests.test_browser_ui import new_page, open_tab

pytestmark = pytest.mark.browser
app, page = served_app_and_page(96, height=1200)
NUMBER = r"([\d,.]+)"
MEMORY = re.compile(rf"a (\d+)-request (\w+) step at ([\d,]+) tokens of context reads {NUMBER} MB; at {NUMBER} GB/s "
                    rf"that is at best {NUMBER} ms(?:; it took {NUMBER} ms \({NUMBER} % of the bound\)| \(predicted)")
COMPUTE = re.compile(rf"a (\d+)-request (\w+) step of ([\d,]+) tokens computes {NUMBER} GFLOP; at {NUMBER} GFLOP/s "
                     rf"that is at best {NUMBER} ms(?:; it took {NUMBER} ms \({NUMBER} % of the bound\)| \(predicted)")
PLOT = "document.querySelector('#roof-plot .js-plotly-plot')"


def value(text: str) -> float:
    return float(text.replace(",", ""))


def close(shown: float, exact: float) -> bool:
    """A number as the page rounds it (three significant digits, or whole above 100) against the exact one."""
    return abs(shown - exact) <= max(0.51 if abs(exact) >= 100 else 0, 0.012 * abs(exact))  # two roundings at most


def sentences(pg) -> list[str]:
    return [li.inner_text().strip() for li in pg.locator("#roof-sentences li").all()]


def table_rows(pg) -> int:
    return pg.evaluate("[...document.querySelectorAll('#roof-table [data-testid]')]"
                       ".filter((c) => /^cell-\\d+-0$/.test(c.dataset.testid)).length")


def check_arithmetic(said: list[str]) -> int:
    """Each sentence's bound is its bytes over the bandwidth (or FLOPs over the rate), its share the bound over the
    time taken, from the numbers it prints; returns how many were measured (not predicted)."""
    measured = 0
    for s in said:
        m, per = (MEMORY.match(s), 1) if MEMORY.match(s) else (COMPUTE.match(s), 1e3)
        assert m, s
        amount, rate, best = value(m[4]), value(m[5]), value(m[6])
        assert close(best, per * amount / rate), s  # MB / (GB/s) is ms; GFLOP / (GFLOP/s) is s
        if m[7]:
            measured += 1
            assert close(value(m[8]), 100 * best / value(m[7])) or value(m[8]) > 99, s
    return measured


@pytest.mark.slow  # it measures 12 kinds of step on the CPU: half a minute; CI runs -m slow
def test_the_roofline_predicts_measures_and_explains(app, page, shots):  # noqa: F811 (fixture)
    open_tab(page, "Roofline")
    page.wait_for_function(f"{PLOT}?.data?.length >= 2")
    assert "copy bandwidth" in page.locator("#roof-machine").inner_text()
    assert "not measured yet" in page.locator("#roof-note").inner_text()
    assert check_arithmetic(sentences(page)) == 0  # predicted only

    page.locator("#roof-measure").click()
    page.wait_for_function("document.querySelector('#roof-note')?.innerText.includes('Measured on this engine')",
                           timeout=300_000)
    page.wait_for_function(f"{PLOT}?.data?.some((t) => /measured/.test(t.name))")
    said = sentences(page)
    assert check_arithmetic(said) == len(said) >= 6  # batches 1, 4, 16 at two contexts, and their prefills
    assert table_rows(page) == len(said)
    decodes = [s for s in said if " decode step " in s]
    assert {int(MEMORY.match(s)[1]) for s in decodes if MEMORY.match(s)} >= {1, 4, 16}
    # the plot's measured points sit at the table's FLOPs over the time taken
    plotted = page.evaluate(f"{PLOT}.data.filter((t) => /measured/.test(t.name)).flatMap((t) => t.y)")
    cells = [[page.locator(f"#roof-table [data-testid=cell-{r}-{c}]").inner_text() for c in (8, 11)]
             for r in range(len(said))]
    rates = sorted(value(gflop) / value(ms) * 1e3 for gflop, ms in cells)
    assert len(plotted) == len(rates) and all(close(a, b) for a, b in zip(rates, sorted(plotted))), (rates, plotted)
    keep_shot(page, shots, "roofline.png", full_page=True)
    settle(page, "#roof-plot")
    assert measure(page, "#roof-plot", shots, "light_roofline") == {}  # the light theme: words readable, none cut

    page.locator("#roof-model input").fill("Qwen2.5-VL-3B-Instruct")
    page.locator("#roof-model input").press("ArrowDown")
    page.get_by_role("option", name="Qwen2.5-VL · Qwen2.5-VL-3B-Instruct").click()
    page.wait_for_function("document.querySelector('#roof-note')?.innerText.includes('Predicted only')")
    costs = model_costs("Qwen2.5-VL-3B-Instruct", "bfloat16")
    first = [page.locator(f"#roof-table [data-testid=cell-0-{c}]").inner_text().strip() for c in range(5)]
    assert first[3] == num(costs.decoder / 1e6) and first[4] == num(costs.lm_head / 1e6), first
    assert check_arithmetic(sentences(page)) == 0


def test_a_phone_in_the_dark_reads_it_in_chinese_and_reaches_it_by_keyboard(app, page, shots):  # noqa: F811
    _, url = app
    pg = new_page(page, url, PHONE, "?__theme=dark")
    try:
        pg.locator("#lang-switch").get_by_text("中文").click()
        tab = pg.get_by_role("tab", name=t(ZH, "tab.roofline"), exact=True)
        tab.focus()
        pg.keyboard.press("Enter")  # a tab is a button: the keyboard opens it
        pg.wait_for_function(f"{PLOT}?.data?.length >= 2")
        pg.wait_for_function("document.querySelector('#roof-note')?.innerText.includes('尚未实测')")
        assert "最快" in pg.locator("#roof-sentences").inner_text()
        pg.locator("#roof-dtype input").focus()
        pg.keyboard.press("Escape")
        pg.keyboard.press("Tab")
        assert pg.evaluate("document.activeElement.closest('#roof-measure') !== null")
        settle(pg, "#roof-plot")
        assert measure(pg, "#roof-plot", shots, "phone_dark_zh_roofline") == {}
    finally:
        pg.close()
