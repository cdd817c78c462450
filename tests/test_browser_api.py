"""An HTTP API request in the real browser's KV map: while an `openai` client streams from the app, the KV tab shows
its blocks under its api-… label; when the client hangs up, the engine aborts it and frees them."""
import os
import time

import openai
import pytest

from panels.plots import block_cell, request_color
from tests.api_app import MODEL, image_message, inprocess_app
from tests.app_server import browser_page
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def app():
    with inprocess_app(num_blocks=256) as served:
        yield served


def test_api_request_appears_in_the_kv_map(app, tmp_path):
    holder, url = app
    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is not installed (apt-get install -y chromium)")
    client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=120)
    with browser_page(url, CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS) as page:
        page.get_by_role("tab", name="KV blocks (live)").click()
        page.locator("#kv-map .js-plotly-plot").wait_for()
        stream = client.chat.completions.create(  # a long answer: it decodes while the page polls the engine
            model=MODEL, max_tokens=3900, stream=True, user="ann", extra_body={"ignore_eos": True},
            messages=image_message("red_circle.png"))
        request_id = next(iter(stream)).id.removeprefix("chatcmpl-")
        assert request_id.startswith("api-ann-")  # its label in the map says: the API, user ann
        holder.get().pause()  # it holds its blocks while the page draws them (a loaded machine could finish it first)
        plot = page.wait_for_function("""(rid) => {
            const el = document.querySelector('#kv-map .js-plotly-plot');
            if (!el || !el.data || !el.data.some(t => t.name === rid)) return null;  // its legend entry
            return {z: el.data[0].z, scale: el.data[0].colorscale, cols: el.layout.meta.cols,
                    hover: el.data[0].text.flat().filter(t => t.includes(rid)).length};
        }""", arg=request_id).json_value()
        page.wait_for_function("(rid) => document.querySelector('#kv-table')?.innerText.includes(rid)",
                               arg=request_id)
        page.screenshot(path=os.environ.get("MINIVLM_API_SHOT", str(tmp_path / "kv_api.png")), full_page=True)
        table = holder.get().snapshot().block_tables.get(request_id, [])
        holder.get().resume()
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
