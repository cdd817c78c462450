"""The Anatomy, prefix-tree and paging views say what the engine says: thumbnails cut from the right place of the
image, one raster however many tokens, the tree's layout and eviction mark from engine.prefix_tree(), paging
arithmetic against a request whose token count we know step by step."""
import math
import time

import numpy as np
from PIL import Image

from minivlm import Request, SamplingParams
from minivlm.inputs.images import load_image

from panels.anatomy import BLUE, RED, pixels_kwargs, render
from panels.anatomy_figures import cell_tiles, token_strip_figure
from panels.anatomy_keys import DIFFERENT, SAME, keys_html
from panels.paged_vs_contiguous import paging_figures
from panels.prefix_tree import NEXT_EVICTED, layout, tree_figure

PROMPT = "What color is the shape?"


def checkerboard(w: int, h: int, cell: int) -> Image.Image:
    """Every cell×cell square its own colour, so a thumbnail shows where it was cut from."""
    ys, xs = np.mgrid[0:h, 0:w] // cell
    return Image.fromarray(np.stack([xs * 37 % 256, ys * 53 % 256, (xs + ys) * 11 % 256], -1).astype(np.uint8))


def test_a_999_token_image_is_one_raster_and_renders_fast(engines, record_property):
    engine = engines["qwen2_vl"]  # patch 14, merge 2: 1024×768 at full resolution is 37×27 = 999 tokens
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (768, 1024, 3), dtype=np.uint8))
    small = engine.anatomy(Request(prompt=PROMPT, images=[image]))
    request = Request(prompt=PROMPT, images=[image], mm_processor_kwargs=pixels_kwargs(engine, 1024 * 768))
    render(engine, request, [image], request)  # plotly's one-off validator warm-up is not a per-render cost
    start = time.perf_counter()
    summary, grid, strip, rope, keys = render(engine, request, [image], request)
    seconds = time.perf_counter() - start
    record_property("anatomy_render_seconds_1024x768_999_tokens", round(seconds, 3))
    print(f"\nAnatomy tab, 1024×768 image, 999 image tokens: drawn in {seconds:.3f} s on CPU")
    a = engine.anatomy(request)
    assert a.images[0].num_tokens == 999 and small.images[0].num_tokens < 999
    assert len(strip.data) == len(token_strip_figure(small, [image]).data)  # trace count does not grow with tokens
    assert [t.type for t in strip.data].count("image") == 1 and len(strip.data[1].hovertext) == len(a.tokens)
    assert f"{len(a.tokens)} prompt tokens" in summary


def test_thumbnails_are_cut_from_their_merged_cell(engines):
    engine = engines["qwen3_vl"]
    a = engine.anatomy(Request(prompt=PROMPT, images=[checkerboard(280, 168, 28)]))
    info = a.images[0]
    resized = checkerboard(280, 168, 28).resize(info.resized_size, Image.BICUBIC)
    tiles = cell_tiles(resized, info, 28)
    side = info.patch_size * info.merge_size
    px = np.asarray(resized).astype(float)
    for t in (t for t in a.tokens if t.type == "image"):
        region = px[t.grid_row * side:(t.grid_row + 1) * side, t.grid_col * side:(t.grid_col + 1) * side]
        tile = tiles[t.grid_row, t.grid_col].astype(float)
        assert np.abs(tile[4:-4, 4:-4].mean((0, 1)) - region[2:-2, 2:-2].mean((0, 1))).max() < 12


def test_key_table_marks_a_fooled_by_two_images(engines):
    engine = engines["qwen3_vl"]
    red, blue = (engine.anatomy(Request(prompt=PROMPT, images=[load_image(p)[0]])) for p in (RED, BLUE))
    html = keys_html(red, blue)
    full = sum(b.full for b in red.blocks)
    cells = html.split("<td style='background:")[1:]
    colors = [c.split(";")[0] for c in cells]
    assert colors[0::3][:full] == [SAME] * full  # A
    assert colors[1::3][:full] == colors[2::3][:full] == [DIFFERENT] * full  # B, C
    assert keys_html(red, red).count(DIFFERENT) == 1  # only the legend names the colour


def test_prefix_tree_figure(engines):
    engine = engines["qwen2_vl"].isolated(num_blocks=40)
    try:
        for q in ("what color is the shape in this picture?", "how many shapes are there in the picture?"):
            engine.generate(Request(prompt=q, images=[load_image(RED)[0]]), SamplingParams(max_tokens=1))
        nodes = engine.prefix_tree()
        pos = layout(nodes)
        assert all(pos[n.block_id][0] == pos[n.parent_block][0] + 1 for n in nodes if n.parent_block is not None)
        assert all(pos[n.block_id][0] == 0 for n in nodes if n.parent_key is None)
        fig = tree_figure(nodes)
        points = sum(len(t.x) for t in fig.data if t.name and t.name.endswith(" block"))
        edges = [t for t in fig.data if t.mode == "lines"][0]
        nxt = [t for t in fig.data if t.name == "next to be evicted"][0]
        first = min((n for n in nodes if n.eviction_rank is not None), key=lambda n: n.eviction_rank)
        assert points == len(nodes) and len(edges.x) == 3 * sum(n.parent_block is not None for n in nodes)
        assert (nxt.x[0], nxt.y[0]) == pos[first.block_id] and nxt.marker.color == NEXT_EVICTED
        assert "1 branch point" in fig.layout.title.text
    finally:
        engine.close()


def test_paging_figures_follow_one_request(engines):
    engine = engines["qwen3_vl"].isolated(num_blocks=40)
    try:
        request = Request(prompt="count the shapes", images=[load_image(RED)[0]])
        prompt_len = len(engine.anatomy(request).tokens)
        bs, max_len = engine.config.block_size, engine.config.max_model_len
        events = list(engine.stream(request, SamplingParams(max_tokens=40, ignore_eos=True)))
        assert sum(e.snapshot is not None and not e.finished for e in events) == 39
        for i, ev in enumerate(e for e in events if e.snapshot is not None and not e.finished):
            f = paging_figures(ev.snapshot, max_len)
            filled = prompt_len + i  # the KV written so far: the prompt, then one token per decode step
            assert (f.requests, f.contiguous_slots) == (1, max_len)
            assert (f.paged_blocks, f.tokens) == (math.ceil(filled / bs), filled)
            assert f.unused_slots == f.paged_blocks * bs - filled < bs
    finally:
        engine.close()
