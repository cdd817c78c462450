"""The Timeline tab in a real browser (Debian's chromium, headless, Playwright): run the load generator twice
(chunked prefill off, then on) from the keyboard alone; both Gantt charts hold one row per request with every span
the run's log has and hovers that name the steps and say the decision log's sentence; the percentile table has both
runs side by side; the served engine saw none of this load; N past its limit is refused naming the limit; at 390 px
in the dark theme and in Chinese every word of the figures reads at contrast >= 4.5:1, none overlaps or is cut.
Screenshot: $MINIVLM_SCREENSHOTS/timeline.png (docs/screenshots to refresh the README's)."""
import os

import pytest

from panels.i18n import ZH, t
from tests.app_server import keep_shot
from tests.test_browser import served_app_and_page, shots  # noqa: F401 (a fixture)
from tests.test_browser_readable import PHONE, measure, open_tab, settle
from tests.test_browser_ui import new_page

pytestmark = pytest.mark.browser
app, page = served_app_and_page(96, height=1100)
SCOPE = "#tl-gantt-a, #tl-gantt-b, #tl-hist"
GANTT = """(sel) => { const el = document.querySelector(sel + ' .js-plotly-plot');
    return el && el.data ? {meta: el.layout.meta, title: el.layout.title.text,
                            hovers: el.data.flatMap((d) => d.hovertext || []), names: el.data.map((d) => d.name)}
                         : null; }"""


def fill(pg, field: str, value):
    box = pg.locator(f"#tl-{field} input[type=number]")
    box.fill(str(value))
    box.press("Tab")


def run_from_keyboard(pg, n: int):
    """N, R, T typed; then Tab from the last field until the Run button has the focus, and Enter."""
    fill(pg, "n", n)
    fill(pg, "rate", 8)
    fill(pg, "seconds", 20)
    for _ in range(12):
        if pg.evaluate("!!document.activeElement?.closest('#tl-run')"):
            break
        pg.keyboard.press("Tab")
    assert pg.evaluate("!!document.activeElement?.closest('#tl-run')"), "Run is not reachable with Tab"
    pg.keyboard.press("Enter")
    pg.wait_for_function(f"(() => {{ const m = document.querySelector('#tl-gantt-b .js-plotly-plot')?.layout?.meta;"
                         f" return m && m.requests.length === {n}; }})()")


def test_two_runs_side_by_side_from_the_keyboard(app, page, shots):  # noqa: F811
    holder, _ = app
    served_before = holder.get().snapshot().last_event_seq
    open_tab(page, "Timeline")
    run_from_keyboard(page, 6)
    a, b = (page.evaluate(GANTT, sel) for sel in ("#tl-gantt-a", "#tl-gantt-b"))
    assert a["meta"]["requests"] == b["meta"]["requests"] == [f"r{i}" for i in range(6)]
    assert "chunked prefill off" in a["title"] and "chunked prefill on" in b["title"]
    assert {"queue", "prefill", "decode step", "finished"} <= set(a["names"])
    chunk_hovers = [h for h in b["hovers"] if "· prefill chunk ·" in h]
    assert chunk_hovers and all(" chunk tokens " in h for h in chunk_hovers), chunk_hovers[:2]  # plan sentence
    assert any("decode step · step " in h and "decode 1 token at slot" in h for h in a["hovers"])
    table = page.locator("#tl-table").inner_text()
    assert "A: chunked prefill off" in table and "B: chunked prefill on" in table and "6 / 6" in table
    assert holder.get().snapshot().last_event_seq == served_before  # the served engine never saw the load
    keep_shot(page, shots, "timeline.png", full_page=True)
    fill(page, "n", 500)  # past the limit: refused, naming it
    page.locator("#tl-run").click()
    page.get_by_text("N (requests) must be between 1 and 32").first.wait_for()


def test_a_phone_in_the_dark_reads_the_timeline_in_chinese(app, page):
    pg = new_page(page, app[1], PHONE, "?__theme=dark")
    try:
        pg.locator("#lang-switch").get_by_text("中文").click()
        tab = pg.get_by_role("tab", name=t(ZH, "tab.timeline"), exact=True)
        tab.wait_for()  # the switch relabels the tabs
        tab.click()
        run_from_keyboard(pg, 4)
        settle(pg, SCOPE)
        assert t(ZH, "tl.kind.decode") in pg.evaluate(GANTT, "#tl-gantt-a")["names"]
        assert "首 token 延迟" in pg.locator("#tl-table").inner_text()
        assert measure(pg, SCOPE, str(os.environ.get("MINIVLM_READABLE_SHOTS", "/tmp")), "phone_dark_timeline") == {}
    finally:
        pg.close()
