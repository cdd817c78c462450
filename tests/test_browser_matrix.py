"""The app in a real browser on a tiled model (a SmolVLM2-layout checkpoint) and on a text-only one (Qwen3): chat
answers, Anatomy draws the request the chat sent (crops, tile markers, 1-D positions), and the KV tab's launcher
fills the block map (tiles' blocks marked ◇/◆ for the tiled model, none for the text one). Screenshots:
anatomy_tiled.png, kv_tiled.png, chat_text.png (to $MINIVLM_SCREENSHOTS)."""
import os
import re

import pytest

from panels.holder import EXAMPLES_DIR
from tests.app_server import app_in_process, browser_page, keep_shot
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, open_tab, shots  # noqa: F401

pytestmark = pytest.mark.browser
PLOT = "document.querySelector('#{} .js-plotly-plot')"


@pytest.fixture(scope="module", params=["smolvlm", "qwen3"])
def served(request, tmp_path_factory):
    from tools.make_checkpoint_matrix import make_matrix_checkpoint
    path = make_matrix_checkpoint(request.param, str(tmp_path_factory.mktemp(request.param)), seed=3)
    with app_in_process(96, model=path) as (holder, url):
        with browser_page(url, CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS) as page:
            yield request.param, holder, page


def send(page, text: str, image: str | None = None) -> int:
    """Send one chat message; returns the prompt token count the stats line reports once the answer ends."""
    if image:
        page.locator("#chat-input input[type=file]").set_input_files(image)
    page.locator("#chat-input textarea").fill(text)
    page.locator("#chat-input textarea").press("Enter")
    page.wait_for_function("document.querySelector('#chat-stats')?.innerText.includes('finish:')")
    bot = page.locator("#chatbot .message-row.bot-row, #chatbot [data-testid=bot]").last
    assert bot.inner_text().strip()
    return int(re.search(r"prompt (\d+) tokens", page.locator("#chat-stats").inner_text()).group(1))


@pytest.mark.parametrize("served", ["smolvlm", pytest.param("qwen3", marks=pytest.mark.slow)], indirect=True)
def test_chat_then_anatomy_of_the_same_request(served, shots):  # the text model (no tiles) runs with -m slow
    name, holder, page = served
    tiled = name == "smolvlm"
    image = os.path.join(EXAMPLES_DIR, "three_shapes.png") if tiled else None
    prompt_tokens = send(page, "Describe the picture." if tiled else "Hello, how are you?", image)
    if not tiled:
        keep_shot(page, shots, "chat_text.png", full_page=True)
    open_tab(page, "Anatomy")  # it first draws its own form's request (longer or shorter than the conversation)
    page.wait_for_function("/\\d+ prompt tokens/.test(document.querySelector('#anat-summary').innerText)")
    page.wait_for_function(f"{PLOT.format('anat-strip')}?.data?.[1]?.hovertext?.length > 0")
    before = page.locator("#anat-summary").inner_text()  # the tab's own request, which may be the longer one
    page.locator("#anat-from-chat").click()  # the chat's last request, exactly as the engine received it
    page.wait_for_function("([n, before]) => { const s = document.querySelector('#anat-summary').innerText; "
                           "const m = /^\\s*(\\d+) prompt tokens/.exec(s); "
                           "return s !== before && m && +m[1] === n; }",  # no queue/progress text above it
                           arg=[prompt_tokens, before])  # drawn anew: the tokens the engine received
    summary = page.locator("#anat-summary").inner_text()
    shown = int(re.search(r"(\d+) prompt tokens = \d+ text \+ (\d+) image", summary).group(1))
    assert shown == prompt_tokens  # that request's num_prompt_tokens (its answer is not part of it)
    page.wait_for_function(f"{PLOT.format('anat-strip')}?.data?.[1]?.hovertext?.length === {shown}")
    if tiled:  # the same image tokens as the engine makes of that picture
        from minivlm import Request, SamplingParams
        seq = holder.get().make_sequence(Request(prompt="x", images=[image]), SamplingParams(max_tokens=1))
        assert f"+ {sum(seq.token_types)} image" in summary
    hovers = page.evaluate(f"{PLOT.format('anat-strip')}.data[1].hovertext")
    assert all("1-D RoPE" in h for h in hovers)  # neither family uses M-RoPE
    rope_title = page.evaluate(f"{PLOT.format('anat-rope')}.layout.title.text")
    if not tiled:
        assert "No image" in rope_title and "(no image)" in page.locator("#anat-summary").inner_text()
        return
    labels = page.evaluate(f"{PLOT.format('anat-strip')}.data[1].hovertext.join(' ')")
    assert "<row_1_col_1>" in labels and "<global-img>" in labels  # the tile markers, as tokens of the strip
    grid_title = page.evaluate(f"{PLOT.format('anat-grid')}.layout.title.text")
    assert re.search(r"\d×\d crops of 64 px \+ a global view", grid_title), grid_title
    assert "1-D RoPE: every token" in rope_title
    keep_shot(page, shots, "anatomy_tiled.png", full_page=True)


@pytest.mark.parametrize("served", ["smolvlm", pytest.param("qwen3", marks=pytest.mark.slow)], indirect=True)
def test_launcher_fills_the_block_map(served, shots):  # the text model's run (no tile marks) runs with -m slow
    name, holder, page = served
    open_tab(page, "KV blocks (live)")
    page.locator("#kv-launch").click()
    marked = page.wait_for_function(f"""() => {{
        const el = {PLOT.format('kv-map')};
        if (!el || !el.data) return null;
        const z = el.data[0].z.flat();
        if (!z.some(v => v >= 3)) return null;   // blocks held by running requests
        return el.data.filter(t => t.name && t.name.endsWith('tokens')).map(t => t.x.length); }}""").json_value()
    if name == "smolvlm":
        assert sum(marked) > 0  # blocks holding tile tokens are marked
        keep_shot(page, shots, "kv_tiled.png", full_page=True)
    else:
        assert sum(marked) == 0
    page.wait_for_function("document.querySelector('#kv-summary')?.innerText.includes('finished')", timeout=240_000)
