"""The Anatomy tab in a real browser: the pictures show exactly the engine's anatomy of the same request, the key
table shows A fooled by two different images, and max_pixels changes C's keys but not B's. Screenshot:
anatomy.png (to $MINIVLM_SCREENSHOTS, as in test_browser.py)."""
import os
import re

import pytest

from minivlm import Request, SamplingParams
from minivlm.inputs.images import load_image

from panels.anatomy import BLUE, EXAMPLES, RED, pixel_range, pixels_kwargs
from panels.anatomy_keys import DIFFERENT, SAME
from tests.app_server import keep_shot
from tests.test_browser import app, open_tab, page, shots  # noqa: F401  (the same served app and browser page)

pytestmark = pytest.mark.browser
PROMPT = "What color is the shape?"
SHAPES = EXAMPLES[1][0]


def key_colors(page) -> dict[str, list[str]]:
    """Background of every key cell of the table, per strategy column."""
    return page.evaluate("""() => {
        const out = {A: [], B: [], C: []};
        for (const row of document.querySelectorAll('#anatomy-keys-table tr')) {
            const cells = row.querySelectorAll('td');
            if (cells.length === 4) ['A', 'B', 'C'].forEach((s, i) => out[s].push(cells[i + 1].style.background));
        }
        return out; }""")


def rgb(hex_color: str) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def wait_for_summary(page, num_tokens: int):
    page.wait_for_function(f"document.querySelector('#anat-summary').innerText.includes('{num_tokens} prompt tokens')")


# the statistics line of the chat's last answer ("" while none; gradio's timer beside it is not part of it)
FINISH_LINE = "((s) => s.split('\\n').find((l) => l.includes('finish:')) || '')"


def strip_points(page) -> int:
    return page.evaluate("document.querySelector('#anat-strip .js-plotly-plot').data[1].hovertext.length")


def test_anatomy_tab_shows_the_engine_anatomy(app, page, shots):
    holder, _ = app
    engine = holder.get()
    open_tab(page, "Anatomy")
    page.locator("#anat-strip .js-plotly-plot").wait_for()
    page.locator("#anatomy-keys-table").wait_for()
    a = engine.anatomy(Request(prompt=PROMPT, images=[load_image(RED)[0]]))
    summary = page.locator("#anat-summary").inner_text()
    assert f"{len(a.tokens)} prompt tokens" in summary and f"{len(a.blocks)} KV blocks" in summary
    traces = page.evaluate("document.querySelector('#anat-strip .js-plotly-plot').data.map(t => t.type)")
    assert traces.count("image") == 1 and len(traces) <= 4  # the thumbnails are one raster, not one trace each
    assert strip_points(page) == len(a.tokens)
    colors = key_colors(page)
    full = sum(b.full for b in a.blocks)
    assert colors["A"][:full] == [rgb(SAME)] * full  # red and blue circle: the same A keys
    assert colors["B"][:full] == colors["C"][:full] == [rgb(DIFFERENT)] * full
    keep_shot(page, shots, "anatomy.png", full_page=True)

    # the same image at a smaller max_pixels: fewer tokens, C's keys change, B's keys stay where the tokens match
    page.locator("#anat-img2 button[aria-label='Remove Image']").click()
    small = 4 * (engine.processor.image_processor.patch_size * engine.model.merge) ** 2 * 4
    page.locator("#anat-pixels input[type=number]").fill(str(small))
    page.locator("#anat-pixels input[type=number]").press("Enter")
    page.locator("#anat-show").click()
    b = engine.anatomy(Request(prompt=PROMPT, images=[load_image(RED)[0]],
                               mm_processor_kwargs=pixels_kwargs(engine, small)))
    wait_for_summary(page, len(b.tokens))
    assert len(b.tokens) < len(a.tokens) and strip_points(page) == len(b.tokens)
    colors = key_colors(page)
    same_tokens = [i for i, (x, y) in enumerate(zip(b.blocks, a.blocks)) if x.full and y.full and
                   [t.token_id for t in b.tokens[x.start:x.end]] == [t.token_id for t in a.tokens[y.start:y.end]]]
    assert same_tokens and all(colors["B"][i] == rgb(SAME) and colors["C"][i] == rgb(DIFFERENT) for i in same_tokens)

    # an example's click draws it (the image triggers listen to a person's input, so the example's own event does)
    page.locator("#anat-pixels input[type=number]").fill(str(pixel_range(engine)[3]))
    page.locator("#anat-pixels input[type=number]").press("Enter")
    page.get_by_text("What color is the triangle?").first.click()
    shapes = engine.anatomy(Request(prompt="What color is the triangle?", images=[load_image(SHAPES)[0]]))
    wait_for_summary(page, len(shapes.tokens))
    assert strip_points(page) == len(shapes.tokens)


def test_kv_tab_shows_the_prefix_tree_and_paging(app, page, shots):
    holder, _ = app
    engine = holder.get()
    for question in ("What color is the shape?", "What shape is it?"):
        engine.generate(Request(prompt=question, images=[RED]), SamplingParams(max_tokens=2))
    nodes = engine.prefix_tree()
    open_tab(page, "KV blocks (live)")
    page.locator("#kv-map .js-plotly-plot").wait_for()
    page.get_by_role("button", name="Refresh now").click()
    page.wait_for_function(f"""() => {{
        const el = document.querySelector('#kv-tree .js-plotly-plot');
        return el && el.data.filter(t => (t.name || '').endsWith(' block'))
                             .reduce((n, t) => n + t.x.length, 0) === {len(nodes)}; }}""")
    title = page.evaluate("document.querySelector('#kv-tree .js-plotly-plot').layout.title.text")
    assert f"{len(nodes)} blocks a lookup finds" in title and "1 branch point" in title
    assert "Paged vs contiguous" in page.locator("#kv-summary").inner_text()
    keep_shot(page.locator("#kv-tree"), shots, "prefix_tree.png")


@pytest.mark.slow  # two turns and a two-picture anatomy; the chat-to-anatomy path stays (test_browser_matrix.py,
def test_anatomy_of_the_chats_last_request(app, page):  # test_browser_video.py); CI runs it with -m slow
    """#52: "Use the chat's last request" draws exactly the tokens the engine received for the chat's last answer:
    as many as that answer's num_prompt_tokens (the chat's statistics line, the engine's own count), not the next
    request (the answer and a new assistant header appended); the form's boxes then show that request's pictures and
    question, and with two pictures the rope caption says where the text resumes after each one (the engine's own
    positions)."""
    holder, _ = app
    open_tab(page, "Chat")
    page.get_by_role("button", name="Clear chat").click()
    lines = []
    for picture in (BLUE, SHAPES):  # two turns: the last request holds both pictures and the first answer
        before = page.locator("#chat-stats").inner_text()
        page.locator("#chat-input input[type=file]").set_input_files(picture)
        page.locator("#chat-input textarea").fill(PROMPT)
        page.locator("#chat-input textarea").press("Enter")
        page.wait_for_function(f"(before) => {FINISH_LINE}(document.querySelector('#chat-stats')?.innerText || '') "
                               f"!== {FINISH_LINE}(before)", arg=before)  # the new answer's line, not a timer
        lines.append(page.evaluate(f"{FINISH_LINE}(document.querySelector('#chat-stats').innerText)"))
    received = int(re.search(r"prompt (\d+) tokens", lines[-1]).group(1))
    first_answer = page.locator("#chatbot .message-row.bot-row, #chatbot [data-testid=bot]").first.inner_text().strip()
    open_tab(page, "Anatomy")
    page.locator("#anat-from-chat").click()
    wait_for_summary(page, received)
    page.wait_for_function(f"document.querySelector('#anat-strip .js-plotly-plot')?.data?.[1]?.hovertext?.length "
                           f"=== {received}")  # the strip draws the same tokens, one cell each
    assert page.locator("#anat-prompt textarea").input_value() == PROMPT
    shown = [page.locator(f"{box} img").get_attribute("src") for box in ("#anat-img1", "#anat-img2")]
    assert os.path.basename(BLUE) in shown[0] and os.path.basename(SHAPES) in shown[1], shown
    messages = [{"role": "user", "content": [{"type": "image", "image": BLUE}, {"type": "text", "text": PROMPT}]},
                {"role": "assistant", "content": [{"type": "text", "text": first_answer}]},
                {"role": "user", "content": [{"type": "image", "image": SHAPES}, {"type": "text", "text": PROMPT}]}]
    a = holder.get().anatomy(Request(messages=messages))
    assert len(a.tokens) == received  # the same request, rebuilt here from what the page shows
    title = page.evaluate("document.querySelector('#anat-rope .js-plotly-plot').layout.title.text")
    for k, info in enumerate(a.images):
        after = next(tok for tok in a.tokens[info.end:] if tok.type == "text")
        said = re.search(rf"image {k + 1} starts at (\d+); the text after it resumes at (\d+)", title)
        assert said and int(said.group(1)) == a.tokens[info.start].position[0], title
        assert int(said.group(2)) == after.position[0], (k, title)
