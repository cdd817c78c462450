"""The app in 简体中文 in a real browser (#30 items 1 and 4): a browser that asks for zh-CN (Accept-Language and
navigator.language) gets the whole page in Chinese: the chat (a question answered, its statistics line), the KV tab
(pause, launch, step: the decision log in Chinese) and the VRAM tab; no English text of the catalogue is left on the
page, every Chinese glyph is drawn with a CJK font (no boxes), and the header's switch turns the page to English and
back. Screenshots go to $MINIVLM_SCREENSHOTS when it is set: zh_chat.png, zh_kv.png, zh_vram.png."""
import os
import re

import pytest

from panels.holder import EXAMPLES_DIR
from panels.i18n import CATALOGUE, EN, ZH, t
from tests.app_server import app_in_process, browser_page, keep_shot
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS

pytestmark = pytest.mark.browser
NUM_BLOCKS = 16  # the step-through lesson's pool: its first step is the one docs/zh-CN quotes


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    out = os.environ.get("MINIVLM_SCREENSHOTS") or str(tmp_path_factory.mktemp("screenshots"))
    os.makedirs(out, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def page():
    with app_in_process(NUM_BLOCKS) as (_, url), \
            browser_page(url, CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, locale="zh-CN",
                         extra_http_headers={"Accept-Language": "zh-CN,zh;q=0.9"}) as pg:
        yield pg


def english_texts() -> list[re.Pattern]:
    """Every English message of the catalogue as the page would show it (markdown marks gone, fields any text)."""
    out = []
    for key, (en, zh) in CATALOGUE.items():
        if en == zh or key.startswith(("error.", "ev.", "plan.")):  # same in both; the engine's (checked by text)
            continue
        plain = re.sub(r"\*\*|^#+ |^- |`|_(?=\w)|(?<=\w)_(?!\w)", "", en).strip()
        parts = re.split(r"\{\w+\}", plain)
        if len(" ".join(parts).split()) < 2:  # one word ("Step", "free") may be a model's answer or a name
            continue
        out.append(re.compile(r"\s*" + ".*?".join(re.escape(p) for p in parts) + r"\s*", re.S))
    return out


def visible_lines(page) -> list[str]:
    """The text a person sees (innerText of the visible page), a line at a time."""
    return [line.strip() for line in page.evaluate("document.body.innerText").split("\n") if line.strip()]


def untranslated(page) -> list[str]:
    patterns = english_texts()
    return [line for line in visible_lines(page) if any(p.fullmatch(line) for p in patterns)]


def cjk_fonts_of(page, selector: str) -> list[str]:
    """The fonts chromium really drew `selector`'s text with (DevTools' platform fonts: a glyph no font has would
    be drawn as a box by a last-resort font)."""
    page.evaluate("""(selector) => {  // the first element under it whose own text is Chinese
        document.querySelectorAll('[data-cjk-probe]').forEach((el) => el.removeAttribute('data-cjk-probe'));
        const walker = document.createTreeWalker(document.querySelector(selector), NodeFilter.SHOW_TEXT);
        for (let n = walker.nextNode(); n; n = walker.nextNode())
            if (/[\u4e00-\u9fff]/.test(n.textContent)) { n.parentElement.setAttribute('data-cjk-probe', '1'); return; }
    }""", selector)
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": "[data-cjk-probe]"})["nodeId"]
    fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    cdp.detach()
    return [f["familyName"] for f in fonts]


def test_the_chat_in_chinese(page, shots):
    page.get_by_role("tab", name=t(ZH, "tab.chat")).wait_for()
    page.get_by_role("button", name=t(ZH, "chat.stop")).wait_for()
    page.locator("#chat-input input[type=file]").set_input_files(os.path.join(EXAMPLES_DIR, "blue_circle.png"))
    page.locator("#chat-input textarea").fill("这个形状是什么颜色？")  # a form the tiny model was trained on in Chinese
    page.locator("#chat-input textarea").press("Enter")
    page.wait_for_function("document.querySelector('#chat-stats')?.innerText.includes('结束原因：停止符')")
    assert "来自前缀缓存" in page.locator("#chat-stats").inner_text()
    assert page.locator("#chatbot [data-testid=bot]").last.inner_text().strip() == "蓝色"  # answered in Chinese
    assert page.locator("#chat-input textarea").get_attribute("aria-label") == t(ZH, "chat.input_aria")
    page.wait_for_function("document.querySelector('#engine-status')?.innerText.includes('运行于')")
    keep_shot(page, shots, "zh_chat.png", full_page=True)
    assert not untranslated(page), untranslated(page)
    fonts = cjk_fonts_of(page, "#chat-stats")
    assert any("CJK" in f or " SC" in f for f in fonts), fonts  # Noto Sans CJK SC from fonts-noto-cjk


def test_the_kv_tab_in_chinese_with_its_decision_log(page, shots):
    page.get_by_role("tab", name=t(ZH, "tab.kv")).click()
    page.get_by_role("button", name=t(ZH, "kv.pause")).click()
    page.wait_for_function("document.querySelector('#kv-summary')?.innerText.includes('引擎已暂停')")
    page.locator("#kv-n input[type=number]").fill("6")
    page.locator("#kv-n input[type=number]").press("Enter")
    page.get_by_role("button", name=t(ZH, "kv.launch")).click()
    page.get_by_text(t(ZH, "kv.queued", n=6)).first.wait_for()
    page.get_by_role("button", name=t(ZH, "kv.step"), exact=True).click()
    log = page.locator("#kv-decisions")
    page.wait_for_function("document.querySelector('#kv-decisions')?.innerText.includes('预填充 3 个请求')")
    text = log.inner_text()
    # the lesson's first step (docs/zh-CN/LESSON.md; here after the chat's steps), said from the events' numbers
    step = re.search(r"第 (\d+) 步 · 预填充 3 个请求，225 个 token", text)
    assert step and "到达：提示词 73 个 token，1 张图片" in text, text
    assert re.search(r"req-\d+ 分到了块 (\d+, ){5}\d+", text) and "计划：" in text, text
    page.locator("#kv-map .js-plotly-plot").wait_for()
    title = page.evaluate("document.querySelector('#kv-map .js-plotly-plot').layout.title.text")
    assert title.startswith(f"第 {step.group(1)} 步的 KV 池"), title
    page.get_by_role("button", name=t(ZH, "kv.resume")).click()
    page.wait_for_function("document.querySelector('#kv-summary')?.innerText.includes('完成 6 个')")
    keep_shot(page, shots, "zh_kv.png", full_page=True)
    assert not untranslated(page), untranslated(page)
    assert any("CJK" in f or " SC" in f for f in cjk_fonts_of(page, "#kv-map .gtitle")), "the plot's title font"


def test_the_vram_tab_in_chinese(page, shots):
    page.get_by_role("tab", name=t(ZH, "tab.vram")).click()
    page.wait_for_function("/放得下|放不下/.test(document.querySelector('#vram-headline')?.innerText || '')")
    page.locator("#vram-plot .js-plotly-plot").wait_for()
    titles = page.evaluate("[...document.querySelectorAll('#vram-plot .annotation-text')].map(a => a.textContent)")
    assert any(x.startswith("本引擎当前") for x in titles), titles
    page.wait_for_function("document.querySelector('#vram-gpus')?.innerText.includes('最少需要')")
    keep_shot(page, shots, "zh_vram.png", full_page=True)
    assert not untranslated(page), untranslated(page)


def test_the_header_switch_turns_the_page_english_and_back(page):
    page.get_by_role("tab", name=t(ZH, "tab.vram")).wait_for()
    page.locator("#lang-switch").get_by_text("English").click()
    page.get_by_role("tab", name=t(EN, "tab.vram")).wait_for()
    page.wait_for_function("/^### (Fits|Does not fit)|^(Fits|Does not fit)/.test("
                           "document.querySelector('#vram-headline')?.innerText.trim() || '')")
    page.get_by_role("tab", name=t(EN, "tab.kv")).click()
    page.get_by_role("button", name=t(EN, "kv.launch")).wait_for()
    page.wait_for_function("document.querySelector('#kv-summary')?.innerText.includes('This run')")
    assert "Engine lifetime" in page.locator("#kv-summary").inner_text()
    assert page.locator("#chat-input textarea").get_attribute("aria-label") == t(EN, "chat.input_aria")
    # nothing Chinese left but the switch's own name and gradio's footer (gradio's chrome follows the browser)
    allowed = ["中文", "通过 API 使用", "使用 Gradio 构建", "设置"]
    try:
        page.wait_for_function("""(allowed) => document.body.innerText.split('\\n').map((l) => l.trim())
            .filter((l) => /[\\u4e00-\\u9fff]/.test(l)).every((l) => allowed.includes(l))""", arg=allowed,
                               timeout=30_000)
    finally:
        chinese = [line for line in visible_lines(page) if re.search(r"[\u4e00-\u9fff]", line)]
        assert set(chinese) <= set(allowed), chinese
    page.locator("#lang-switch").get_by_text("中文").click()
    page.get_by_role("tab", name=t(ZH, "tab.kv")).wait_for()
    page.wait_for_function("document.querySelector('#kv-summary')?.innerText.includes('本次运行')")
