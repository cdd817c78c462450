"""engine.anatomy against independent truths: transformers' own get_rope_index and processor on the same messages,
smart_resize, the keys the engine's cache really stores; the prefix tree against the block manager's evictions."""
import itertools

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from minivlm import Request, SamplingParams
from minivlm.inputs.processor import load_processor
from tests.conftest import FAMILIES
from tests.hf_reference import hf_model


def noise(w: int, h: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def turn(role: str, text: str, images=()) -> dict:
    images = [{"type": "image", "image": im} for im in images]
    return {"role": role, "content": images + [{"type": "text", "text": text}]}


CASES = {  # 1, 2 and 3 images of different shapes; the 2- and 3-image chats are multi-turn
    "one image": [turn("user", "what color is it?", [noise(150, 90, 1)])],
    "two images, two turns": [turn("user", "what color?", [noise(120, 200, 2)]), turn("assistant", "red"),
                              turn("user", "and this one?", [noise(300, 100, 3)])],
    "three images, three turns": [turn("user", "compare", [noise(64, 64, 4), noise(200, 120, 5)]),
                                  turn("assistant", "they differ"), turn("user", "and now?", [noise(90, 260, 6)]),
                                  turn("assistant", "blue"), turn("user", "how many shapes?")],
}


def hf_inputs(path: str, family: str, messages: list[dict]):
    """The checkpoint's own processor on the same chat (images as placeholders for its chat template)."""
    processor = load_processor(path, family)
    images = [c["image"] for m in messages for c in m["content"] if c["type"] == "image"]
    plain = [{"role": m["role"], "content": [c if c["type"] == "text" else {"type": "image"} for c in m["content"]]}
             for m in messages]
    text = processor.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    return processor, processor(text=[text], images=images, return_tensors="pt")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("family", FAMILIES)
def test_positions_and_token_counts_equal_transformers(checkpoints, engines, family, case):
    messages = CASES[case]
    a = engines[family].anatomy(Request(messages=messages))
    processor, out = hf_inputs(checkpoints[family], family, messages)
    ids = out["input_ids"]
    pos, delta = hf_model(checkpoints[family]).model.get_rope_index(
        ids, out["mm_token_type_ids"], out["image_grid_thw"], attention_mask=torch.ones_like(ids))
    assert [t.token_id for t in a.tokens] == ids[0].tolist()
    assert [t.position for t in a.tokens] == [tuple(p) for p in pos[:, 0, :].T.tolist()]
    assert a.rope_delta == int(delta[0])
    # image token counts: the processor's placeholder runs, in order
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    runs = [len(list(g)) for t, g in itertools.groupby(ids[0].tolist()) if t == image_id]
    assert [im.num_tokens for im in a.images] == runs
    assert [im.grid_thw for im in a.images] == [tuple(g) for g in out["image_grid_thw"].tolist()]
    ip = processor.image_processor
    sources = [c["image"] for m in messages for c in m["content"] if c["type"] == "image"]
    for im, src in zip(a.images, sources):
        h, w = smart_resize(src.height, src.width, ip.patch_size * ip.merge_size, ip.size.shortest_edge,
                            ip.size.longest_edge)
        assert im.original_size == src.size and im.resized_size == (w, h)
        assert im.num_patches == im.num_tokens * ip.merge_size ** 2
    # every image token sits on its image's merged grid, in row-major order
    for k, im in enumerate(a.images):
        cells = [(t.grid_row, t.grid_col) for t in a.tokens if t.image_index == k]
        rows, cols = im.grid_thw[1] // im.merge_size, im.grid_thw[2] // im.merge_size
        assert cells == [(r, c) for r in range(rows) for c in range(cols)]


def block_keys(a, strategy):
    return [b.keys[strategy] for b in a.blocks if b.full]


def test_two_images_same_text_share_a_keys_only(engines):
    engine = engines["qwen2_vl"]
    one = engine.anatomy(Request(prompt="what is in the picture?", images=[noise(224, 224, 7)]))
    two = engine.anatomy(Request(prompt="what is in the picture?", images=[noise(224, 224, 8)]))
    assert [t.token_id for t in one.tokens] == [t.token_id for t in two.tokens] and len(block_keys(one, "A")) >= 2
    assert block_keys(one, "A") == block_keys(two, "A")  # A cannot tell the images apart: a false hit waits
    for s in ("B", "C"):  # the image is in block 0, so every chained key after it differs too
        assert all(k1 != k2 for k1, k2 in zip(block_keys(one, s), block_keys(two, s)))
    assert one.blocks[0].key_inputs["A"] == () and one.blocks[0].key_inputs["B"] == (one.images[0].content_hash,)


def test_max_pixels_changes_c_but_not_b(engines):
    engine, image = engines["qwen2_vl"], noise(448, 448, 9)
    big = engine.anatomy(Request(prompt="describe", images=[image]))
    small = engine.anatomy(Request(prompt="describe", images=[image], mm_processor_kwargs={"max_pixels": 28 * 28 * 64}))
    assert big.images[0].grid_thw != small.images[0].grid_thw
    assert big.images[0].num_tokens > small.images[0].num_tokens
    assert big.images[0].content_hash == small.images[0].content_hash
    same = [b.index for b, c in zip(big.blocks, small.blocks) if b.full and c.full and
            [t.token_id for t in big.tokens[b.start:b.end]] == [t.token_id for t in small.tokens[c.start:c.end]]]
    assert len(same) >= 2  # blocks made of the same placeholder tokens in both
    for i in same:
        assert big.blocks[i].keys["B"] == small.blocks[i].keys["B"]  # B is fooled: same pixels, other grid
        assert big.blocks[i].keys["C"] != small.blocks[i].keys["C"]


def test_keys_are_the_ones_the_engine_caches(engines):
    engine = engines["qwen3_vl"].isolated(num_blocks=64)
    try:
        req = Request(prompt="what color is the shape?", images=[noise(200, 140, 10)])
        a = engine.anatomy(req)
        engine.generate(req, SamplingParams(max_tokens=1))
        held = engine.core.block_manager.key_to_block
        assert all(k in held for k in block_keys(a, "C")) and a.strategy == "C"
        assert not any(k in held for k in block_keys(a, "A") + block_keys(a, "B"))
    finally:
        engine.close()


def test_prefix_tree_edges_and_eviction_order(engines):
    engine = engines["qwen2_5_vl"].isolated(num_blocks=48)
    try:
        red, blue = noise(224, 224, 11), noise(224, 224, 12)
        requests = [Request(prompt=q, images=[im]) for im, q in
                    [(red, "what color is the shape in this picture?"), (red, "how many shapes are there here?"),
                     (blue, "what color is the shape in this picture?")]]
        anatomies = [engine.anatomy(r) for r in requests]
        for r in requests:
            engine.generate(r, SamplingParams(max_tokens=1))
        tree = engine.prefix_tree()
        expected = {(keys[i - 1] if i else None, keys[i]) for a in anatomies for keys in [block_keys(a, "C")]
                    for i in range(len(keys))}
        assert {(n.parent_key, n.key) for n in tree} == expected
        bm = engine.core.block_manager
        assert {n.key: n.block_id for n in tree} == bm.key_to_block
        by_key = {n.key: n for n in tree}
        assert all(n.parent_block == by_key[n.parent_key].block_id for n in tree if n.parent_key)
        children = [sum(m.parent_key == n.key for m in tree) for n in tree]
        assert max(children) == 2  # the two red-image prompts share a path, then branch
        # eviction: take free blocks one by one and watch which cached block is overwritten when
        predicted = sorted((n for n in tree if n.eviction_rank is not None), key=lambda n: n.eviction_rank)
        assert all(n.ref_count == 0 for n in predicted) and len(predicted) == len(tree)
        evicted, taken = [], 0
        while bm.free:
            before = dict(bm.key_to_block)
            bm.full._take_free()  # the full-attention group's free queue
            taken += 1
            evicted += [(b, taken) for k, b in before.items() if k not in bm.key_to_block]
        assert evicted == [(n.block_id, n.evicted_after) for n in predicted]
    finally:
        engine.close()
