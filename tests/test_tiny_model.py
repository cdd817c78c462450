"""The shipped tiny Qwen3-VL: standard HF layout, loads with Auto classes, and really sees (through our Engine)."""
import json
import os
import random

import pytest
import torch

from tools.eval_tiny import ROWS, EngineBackend, HFBackend, evaluate
from tools.scenes import (COLORS, COUNT_WORDS, SHAPES, ZH_COLORS, ZH_COUNTS, ZH_POSITIONS, ZH_SHAPES, ZH_YES_NO,
                          Scene, Shape, answer_to, ask, describe, position, possible_types, random_scene, render,
                          trained_questions, trained_questions_zh)
from tools.scenes_alt import alt_sample, alt_scene
from tools.tiny_tokenizer import CORPUS, POSITION_WORDS, ZH_WORDS, build_tokenizer, extend_tokenizer, zh_tokens

MODEL_DIR = os.path.join(os.path.dirname(__file__), "..", "assets", "tiny-qwen-vl")
# the rows the shipped model was trained for, a few points under the model card's targets (colour 98, shape 90,
# count 90, colour-of 85, is-there 85, where 90, describe 95 / 85 / 70 with 1 / 2 / 3 shapes); follow-ups ask
# questions of these types
THRESHOLDS = {"color": 0.95, "shape": 0.85, "count": 0.85, "color_of": 0.80, "is_there": 0.80, "follow_up": 0.75,
              "where": 0.85, "describe_1": 0.90, "describe_2": 0.80, "describe_3": 0.65}
ASKED = {qtype for row, qtype, _ in ROWS if row in THRESHOLDS}
PER_TYPE = 20  # x 10 rows = 200 fresh scenes
TEST_SEED = 9_100_000  # disjoint from eval_tiny's streams and from training's


# asked in Chinese (stage 3), a few points under issue #30's targets: colour 95, shape and count 90, colour-of,
# is-there and where 85, describe 90 / 80 / 65
THRESHOLDS_ZH = {"color": 0.90, "shape": 0.85, "count": 0.85, "color_of": 0.80, "is_there": 0.80, "follow_up": 0.75,
                 "where": 0.80, "describe_1": 0.85, "describe_2": 0.75, "describe_3": 0.55}


@pytest.fixture(scope="module")
def engine_results():
    torch.set_num_threads(2)
    return evaluate(EngineBackend(MODEL_DIR), PER_TYPE, seed=TEST_SEED, types=list(THRESHOLDS), asked=ASKED)


@pytest.fixture(scope="module")
def engine_results_zh():
    torch.set_num_threads(2)
    return evaluate(EngineBackend(MODEL_DIR), PER_TYPE, seed=TEST_SEED, types=list(THRESHOLDS_ZH), asked=ASKED,
                    lang="zh", renderer="alt")


def test_checkpoint_files_are_standard_and_small():
    names = set(os.listdir(MODEL_DIR))
    for required in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                     "processor_config.json", "generation_config.json", "README.md"):
        assert required in names, required
    assert os.path.getsize(os.path.join(MODEL_DIR, "model.safetensors")) <= 25 * 2**20
    with open(os.path.join(MODEL_DIR, "config.json")) as f:
        assert json.load(f)["model_type"] == "qwen3_vl"


def test_loads_with_auto_classes_and_answer_words_are_single_tokens():
    import minivlm.inputs.processor  # noqa: F401  registers the image-only processors with AutoProcessor
    from transformers import AutoModelForImageTextToText, AutoProcessor
    processor = AutoProcessor.from_pretrained(MODEL_DIR)
    model = AutoModelForImageTextToText.from_pretrained(MODEL_DIR)
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    assert sum(p.numel() for p in model.parameters()) > 1_000_000
    for word in (*COLORS, *SHAPES, *COUNT_WORDS, "yes", "no", *(" " + w for w in (*COLORS, *SHAPES))):
        assert len(processor.tokenizer(word).input_ids) == 1, word  # at an answer's start and after a space
    assert processor.tokenizer.chat_template
    assert model.get_input_embeddings().weight.shape[0] == len(processor.tokenizer)


def test_extended_tokenizer_keeps_every_id_and_makes_position_words_one_token():
    first = build_tokenizer()
    extended = extend_tokenizer(first)
    for text in CORPUS + ["<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Is there an orange cat?"]:
        assert extended(text).input_ids == first(text).input_ids, text
    assert extended.get_vocab().items() >= first.get_vocab().items()
    for word in POSITION_WORDS:
        assert len(extended(word).input_ids) == 1, word
    assert len(extended("purple triangle at the top right and red circle at the center").input_ids) == 12


def test_chinese_tokens_are_whole_and_english_tokenizes_exactly_as_before():
    stage2 = extend_tokenizer(build_tokenizer())
    stage3 = extend_tokenizer(stage2, zh_tokens())
    assert stage3.get_vocab().items() >= stage2.get_vocab().items()  # every existing id unchanged
    english = [*CORPUS, *trained_questions(), *COLORS, *SHAPES, *COUNT_WORDS, "yes", "no",
               *(describe(random_scene(random.Random(seed))) for seed in range(50))]
    for text in english:
        assert stage3(text).input_ids == stage2(text).input_ids, text
    prompt = stage2.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {
        "type": "text", "text": "Where is the red circle?"}]}], tokenize=False, add_generation_prompt=True)
    assert stage3(prompt).input_ids == stage2(prompt).input_ids
    for word in (*ZH_WORDS, *ZH_COLORS.values(), *ZH_SHAPES.values(), *ZH_COUNTS.values(), *ZH_YES_NO.values(),
                 *ZH_POSITIONS.values(), "在", "，", "？", "的", "吗"):
        assert len(stage3(word).input_ids) == 1, word
    pieces = [stage3.decode([i]) for i in stage3("红色的圆形在哪里？").input_ids]
    assert pieces == ["红色", "的", "圆形", "在", "哪里", "？"]
    assert stage3.decode(stage3("你好，请问图中有几个形状？还有别的吗").input_ids) == "你好，请问图中有几个形状？还有别的吗"


def test_chinese_questions_have_the_english_truth_in_chinese_words():
    en_to_zh = {**ZH_COLORS, **ZH_SHAPES, **ZH_COUNTS, **ZH_YES_NO, **ZH_POSITIONS}
    for seed in range(200):
        scene = random_scene(random.Random(seed))
        for qtype in possible_types(scene):
            (q_en, a_en), (q_zh, a_zh) = (ask(scene, qtype, random.Random(seed), lang=lang) for lang in ("en", "zh"))
            if qtype == "describe":  # the same shapes in the same order, "{颜色}{形状}在{位置}" joined by "，"
                parts = [p.split(" at the ") for p in a_en.split(" and ")]
                assert a_zh == "，".join(f"{en_to_zh[p[0].split()[0]]}{en_to_zh[p[0].split()[1]]}在{en_to_zh[p[1]]}"
                                        for p in parts)
            else:
                assert a_zh == en_to_zh[a_en], (q_en, a_en, q_zh, a_zh)
            assert answer_to(scene, q_zh) == a_zh
    assert len(trained_questions_zh()) == len(trained_questions())
    assert {"这个形状是什么颜色？", "这是什么形状？", "图中有几个形状？", "圆形是什么颜色？", "图中有红色的圆形吗？",
            "红色的圆形在哪里？", "描述这张图片。", "图中有蓝色的正方形吗？", "三角形是什么颜色？",
            "绿色的三角形在哪里？"} <= set(trained_questions_zh())
    scene = Scene(300, 150, (250, 250, 250), (Shape("circle", "red", COLORS["red"], 0, 0, 40),
                                              Shape("circle", "blue", COLORS["blue"], 80, 30, 40)))
    assert describe(scene, "zh") == "红色圆形在左上，蓝色圆形在中间"


def test_the_independent_renderer_keeps_the_spec_and_draws_other_pixels():
    for seed in range(100):
        image, question, answer, qtype, scene = alt_sample(seed, "describe", 1 + seed % 3)
        assert 112 <= scene.width <= 336 and 112 <= scene.height <= 336 and len(scene.shapes) == 1 + seed % 3
        assert all(200 <= c <= 255 for c in scene.background) and image.size == (scene.width, scene.height)
        short = min(scene.width, scene.height)
        for i, sh in enumerate(scene.shapes):
            assert 0.25 * short <= sh.side <= 0.45 * short + 1 and sh.x >= 0 and sh.y >= 0
            assert sh.x + sh.side <= scene.width and sh.y + sh.side <= scene.height
            assert all(abs(c - p) <= 20 for c, p in zip(sh.rgb, COLORS[sh.color]))
            assert image.getpixel((sh.x + sh.side // 2, sh.y + sh.side * 3 // 4)) == sh.rgb  # inside every kind
            for other in scene.shapes[i + 1:]:  # boxes apart
                assert (sh.x + sh.side < other.x or other.x + other.side < sh.x or
                        sh.y + sh.side < other.y or other.y + other.side < sh.y)
        assert image.getpixel((0, 0)) == scene.background or any(s.x == 0 and s.y == 0 for s in scene.shapes)
        assert answer == describe(scene) and question == "Describe the picture."
    # the same scene drawn by the training generator's code gives other pixels (its own edges)
    scene = alt_scene(__import__("numpy").random.default_rng(1), 3)
    from tools.scenes_alt import rasterise
    assert rasterise(scene).tobytes() != render(scene, supersample=2).tobytes()


def test_positions_and_descriptions_follow_the_thirds_rule():
    def box(kind, color, x, y, side):
        return Shape(kind, color, COLORS[color], x, y, side)
    # 300 x 150 canvas: columns cut at x = 100 and 200, rows at y = 50 and 100 (a centre on a cut goes below it)
    a, b = box("circle", "red", 0, 0, 40), box("square", "blue", 80, 30, 40)  # centres (20, 20), (100, 50)
    c, d = box("triangle", "green", 230, 100, 40), box("circle", "orange", 80, 90, 40)  # (250, 120), (100, 110)
    scene = Scene(300, 150, (250, 250, 250), (c, d, b, a))
    assert [position(s, scene) for s in (a, b, c, d)] == ["top left", "center", "bottom right", "bottom center"]
    # left to right by centre x; b and d tie at x = 100, so the upper one (b) comes first
    assert describe(scene) == ("red circle at the top left and blue square at the center and orange circle at "
                               "the bottom center and green triangle at the bottom right")


def test_engine_is_accurate_on_fresh_scenes(engine_results):
    table, _ = engine_results
    low = {q: acc for q, (acc, _) in table.items() if acc < THRESHOLDS[q]}
    assert not low, f"below threshold: {low}; table {table}"


def test_engine_greedy_matches_hf_generate(engine_results):
    _, engine_answers = engine_results
    types = ("shape", "is_there", "follow_up", "where", "describe_3")  # the longest answers, and a binding one
    _, hf_answers = evaluate(HFBackend(MODEL_DIR), PER_TYPE, seed=TEST_SEED, types=types, asked=ASKED)
    for q in types:
        assert engine_answers[q] == hf_answers[q], q


@pytest.mark.slow  # 200 more scenes (and 60 HF generations below): the model's Chinese, not another engine path;
def test_engine_answers_chinese_questions_in_chinese(engine_results_zh):  # the browser's zh chat stays (CI: -m slow)
    """Each trained form asked in Chinese, on scenes of the independent renderer, answered in the Chinese words."""
    table, answers = engine_results_zh
    low = {q: acc for q, (acc, _) in table.items() if acc < THRESHOLDS_ZH[q]}
    assert not low, f"below threshold: {low}; table {table}"
    words = set(ZH_COLORS.values()) | set(ZH_SHAPES.values()) | set(ZH_COUNTS.values()) | set(ZH_YES_NO.values())
    assert all(a in words for q in ("color", "shape", "count", "is_there") for a in answers[q])
    assert all(a in ZH_POSITIONS.values() for a in answers["where"])


@pytest.mark.slow  # as above: English keeps the engine = HF generate check in the default run
def test_engine_greedy_matches_hf_generate_in_chinese(engine_results_zh):
    _, engine_answers = engine_results_zh
    types = ("is_there", "where", "describe_3")
    _, hf_answers = evaluate(HFBackend(MODEL_DIR), PER_TYPE, seed=TEST_SEED, types=types, asked=ASKED, lang="zh",
                             renderer="alt")
    for q in types:
        assert engine_answers[q] == hf_answers[q], q


def test_answer_to_agrees_with_the_generated_questions():
    for seed in range(200):
        rng = random.Random(seed)
        scene = random_scene(rng)
        for qtype in possible_types(scene):
            question, truth = ask(scene, qtype, rng)
            assert answer_to(scene, question) == truth, (question, truth)
    with pytest.raises(ValueError, match="not a question of the trained forms"):
        answer_to(scene, "What is the meaning of this?")
