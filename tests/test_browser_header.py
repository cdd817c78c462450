"""The header in a real browser (Debian's chromium, headless, Playwright): the engine is rebuilt only on purpose
(#24 item 1: opening a dropdown and leaving it, tabbing through, re-picking the current value rebuild nothing;
picking another value rebuilds exactly once; the page says beforehand what a rebuild ends), a KV launch cut off
by a rebuild ends with a message and views of the new engine (item 2), and the operator token on --shared
(item 6: hidden without $MINIVLM_ADMIN_TOKEN, a wrong token says so, the right one confirms)."""
import os
import threading
import time

import pytest

from minivlm import Request, SamplingParams

from panels.holder import EXAMPLES_DIR
from panels.kv_run import SLIDER_LABEL
from tests.app_server import app_in_process
from tests.test_browser import open_tab, served_app_and_page

pytestmark = pytest.mark.browser
NUM_BLOCKS = 96
TOKEN = "operator-secret-for-browser-tests"

app, page = served_app_and_page(NUM_BLOCKS)


def settle(page, seconds=2.0):
    """Let any event the page may have sent reach the server and finish."""
    page.wait_for_timeout(seconds * 1000)
    page.wait_for_function("!document.querySelector('#engine-status .pending, #engine-status .generating')")


def test_engine_is_rebuilt_only_when_a_value_changes_and_once(app, page):
    holder, _ = app
    engine, builds = holder.engine, holder.builds
    dtype = page.get_by_label("dtype", exact=True)
    dtype.click()  # open the dropdown ...
    page.locator("h1").first.click()  # ... and click away
    settle(page)
    for _ in range(12):  # tab through the whole header
        page.keyboard.press("Tab")
    settle(page)
    dtype.click()  # re-pick the current value
    page.get_by_role("option", name=holder.config.dtype, exact=True).click()
    page.locator("h1").first.click()
    settle(page)
    assert holder.engine is engine and holder.builds == builds, "nothing changed, yet the engine was rebuilt"

    dtype.click()  # another value: select, then blur
    page.get_by_role("option", name="float32", exact=True).click()
    page.locator("h1").first.click()
    page.wait_for_function("document.querySelector('#engine-status')?.innerText.includes('(float32)')")
    settle(page, 3)
    assert holder.config.dtype == "float32" and holder.builds == builds + 1  # once, not twice


def test_the_page_says_beforehand_what_a_rebuild_ends(app, page):
    holder, _ = app
    engine = holder.get()
    assert "no running request" in page.locator("#rebuild-note").inner_text()
    req = Request(prompt="Describe the picture.", images=[os.path.join(EXAMPLES_DIR, "three_shapes.png")])
    engine.core.after_step = lambda core: time.sleep(0.02)  # >= 8 s of running request, however fast the model
    stream = engine.stream(req, SamplingParams(max_tokens=400, ignore_eos=True), snapshots=False)
    next(stream)
    drain = threading.Thread(target=lambda: [None for _ in stream], daemon=True)
    drain.start()
    try:
        page.wait_for_function("document.querySelector('#rebuild-note')?.innerText.includes('ends 1 running "
                               "request') && /\\d+ cached block/.test(document.querySelector('#rebuild-note')"
                               ".innerText)")
    finally:
        engine.abort(req.request_id)
        drain.join(30)
        engine.core.after_step = None


@pytest.mark.slow  # 10 s of a running launch; the rebuild rules stay in the default run (CI runs -m slow)
def test_a_launch_cut_off_by_a_rebuild_ends_with_a_message(app, page):
    holder, _ = app
    open_tab(page, "KV blocks (live)")
    page.locator("#kv-n input[type=number]").fill("32")
    page.locator("#kv-n input[type=number]").press("Tab")
    page.locator("#kv-tokens input[type=number]").fill("256")
    page.locator("#kv-tokens input[type=number]").press("Tab")
    page.locator("#kv-no-eos input").check()
    # each step takes >= 20 ms (the core's debug hook), so the launch (over 1,000 steps) is still running when the
    # rebuild comes, however fast the tiny model decodes and however slowly a loaded machine's browser clicks
    holder.get().core.after_step = lambda core: time.sleep(0.02)
    page.locator("#kv-launch").click()
    page.wait_for_function("/steps recorded/.test(document.querySelector('#kv-step')?.innerText)")
    old = holder.engine
    assert old.has_unfinished()
    page.locator("#strategy-picker").get_by_label("A", exact=True).check()  # a header change: a rebuild
    page.wait_for_function("document.querySelector('#kv-summary')?.innerText.includes('Your launch ended: the "
                           "engine was rebuilt')")
    assert holder.engine is not old and holder.config.cache_strategy == "A"
    page.wait_for_function(f"document.querySelector('#kv-step')?.innerText.includes({SLIDER_LABEL!r})")
    assert "steps recorded" not in page.locator("#kv-step").inner_text()
    assert page.get_by_text("Your launch ended").first.is_visible()
    page.locator("#strategy-picker").get_by_label("C", exact=True).check()
    page.wait_for_function("document.querySelector('#engine-status')?.innerText.includes('prefix cache: C')")


@pytest.mark.parametrize("token", [pytest.param(None, marks=pytest.mark.slow), TOKEN],  # a second app and page
                         ids=["no-token-set", "token-set"])  # for a hidden field: CI runs that one with -m slow
def test_operator_token_on_a_shared_deployment(app, page, token):
    with app_in_process(64, shared=True, operator_token=token) as (holder, url):
        try:
            page.goto(url)  # the module's browser, on a second (shared) app
            page.wait_for_selector("#chatbot")
            check_operator_token(page, token)
        finally:
            page.goto(app[1])
            page.wait_for_selector("#chatbot")


def check_operator_token(pg, token):
    field = pg.locator("#operator-token")
    if token is None:
        assert field.count() == 0 or not field.is_visible()  # nothing to unlock with: no field
        return
    box = field.locator("input")
    for wrong in ("", "guess"):
        box.fill(wrong)
        box.press("Enter")
        pg.wait_for_function("document.querySelector('#operator-note')?.innerText.includes('wrong operator token')")
        assert pg.locator(".toast-body").filter(has_text="Wrong operator token").count() >= 1
        assert not pg.get_by_text("Error", exact=True).is_visible()  # no red pills on the header widgets
        assert pg.locator("#strategy-picker input").first.is_disabled()
    box.fill(TOKEN)
    box.press("Enter")
    pg.wait_for_function("document.querySelector('#operator-note')?.innerText.includes('unlocked')")
    assert pg.locator(".toast-body").filter(has_text="unlocked for this page").count() >= 1
    assert pg.locator("#strategy-picker input").first.is_enabled()
