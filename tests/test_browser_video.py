"""A short clip sent in the chat of a real browser, then its anatomy opened from the chat: on a (random-weight)
Qwen2.5-VL checkpoint, since the shipped tiny model takes images only. Screenshot: anatomy_video.png."""
import os
import re

import pytest

from minivlm import Request

from panels.holder import EXAMPLES_DIR
from tests.app_server import app_in_process, browser_page, keep_shot
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, open_tab, shots  # noqa: F401
from tests.test_browser_anatomy import strip_points, wait_for_summary

pytestmark = pytest.mark.browser
CLIP = os.path.join(EXAMPLES_DIR, "moving_square.mp4")
PROMPT = "What happens in the video?"


@pytest.fixture(scope="module")
def app(checkpoints):
    with app_in_process(96, model=checkpoints["qwen2_5_vl"]) as served:
        yield served


@pytest.fixture(scope="module")
def page(app):
    with browser_page(app[1], CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, height=1000) as pg:
        yield pg


def test_clip_in_chat_then_its_anatomy(app, page, shots):  # noqa: F811
    holder, _ = app
    page.locator("#chat-input input[type=file]").set_input_files(CLIP)
    page.locator("#chat-input textarea").fill(PROMPT)
    page.locator("#chat-input textarea").press("Enter")
    page.wait_for_function("document.querySelector('#chat-stats')?.innerText.includes('finish:')")
    sent = int(re.search(r"prompt (\d+) tokens", page.locator("#chat-stats").inner_text()).group(1))
    assert "refused" not in page.locator("#chat-stats").inner_text()
    open_tab(page, "Anatomy")
    page.wait_for_function("document.querySelector('#anat-summary')?.innerText.includes('prompt tokens')")  # the
    page.wait_for_timeout(1000)  # tab's own render of its form, done before the chat's request is asked for
    page.locator("#anat-from-chat").click()
    messages = [{"role": "user", "content": [{"type": "video", "video": CLIP}, {"type": "text", "text": PROMPT}]}]
    # the chat's last request as the engine received it: the answer is not part of it
    a = holder.get().anatomy(Request(messages=messages))
    assert len(a.tokens) == sent  # the request's num_prompt_tokens, as the chat's line says
    video = a.images[0]
    assert video.kind == "video" and video.grid_thw[0] == 3  # 3 s at the processor's 2 fps: 6 frames, 3 pairs
    page.wait_for_function("document.querySelector('#anat-summary').innerText.includes('video 1')")  # not the form's
    wait_for_summary(page, len(a.tokens))
    page.wait_for_function(f"document.querySelector('#anat-strip .js-plotly-plot')?.data?.[1]?.hovertext?.length "
                           f"=== {len(a.tokens)}")  # the strip drawn for this request (not the form's)
    assert strip_points(page) == len(a.tokens)
    page.wait_for_function("document.querySelector('#anat-grid .js-plotly-plot')?.layout?.title?.text?.includes('pairs')")
    strip = page.evaluate("document.querySelector('#anat-grid .js-plotly-plot').layout.title.text")
    assert "3 pairs" in strip and f"{video.num_tokens} tokens" in strip
    page.wait_for_function("document.querySelector('#anat-rope .js-plotly-plot')?.layout?.title?.text?.includes('video')")
    t_panel = page.evaluate("document.querySelector('#anat-rope .js-plotly-plot').data[0].z")
    per_pair = video.num_tokens // 3
    expected = [a.tokens[video.start + p * per_pair].position[0] for p in range(3)]
    assert [row[0] for row in t_panel] == expected, "the t heatmap's rows are the frame pairs' t ids"
    assert len(set(expected)) == 3  # t moves from pair to pair (Qwen2.5-VL: by seconds x tokens_per_second)
    keep_shot(page.locator("#anat-grid"), shots, "anatomy_video.png")
