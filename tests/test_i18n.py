"""The app in English and 简体中文 (#30 items 1, 4): the catalogue is complete and consistent, every panel string
comes from it, the English it holds is exactly what the engine says (the decision log, plans, budget limits), and
the Chinese says the same numbers; the engine's refusals a person meets reach the Chinese page in Chinese."""
import ast
import os
import re
import string

import pytest

from minivlm import Engine, EngineConfig, SamplingParams
from minivlm.budget import estimate, load_model_preset
from minivlm.budget.limits import context_limit, kv_limit, memory_limit
from minivlm.views.events import describe, describe_plan

from panels.i18n import CATALOGUE, EN, ZH, from_accept_language, t
from panels.i18n.budget import context_sentence, kv_sentence, limit_sentences, memory_sentence
from panels.i18n.errors import localize_error
from panels.i18n.events import describe_in, plan_in
from panels.kv_blocks import demo_requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CJK = re.compile(r"[\u4e00-\u9fff]")
ENGLISH_PLURALS = {"s", "s_roots", "s_branches"}  # fields only English needs (an "s" for a plural)
SAME_IN_BOTH = {"chat.top_p", "col.gpu", "col.gib"}  # technical names that Chinese writes as English does
PUNCTUATION = {"plan.sep"}  # Chinese punctuation only
# message ids built at run time from a fixed word (f"kind.{kind}"), each prefix spelt in the sources
DYNAMIC = ("kind.", "state.", "step.", "reason.", "seg.", "item.", "limit.name.", "preset.", "row.", "col.", "table.",
           "kv.what_", "map.", "error.", "engine.", "header.less_tested", "header.unavailable_choice", "insp.col.",
           "insp.hover_state.", "anat.kind.", "keys.what.")


def fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def sources() -> str:
    paths = [os.path.join(ROOT, "app.py")] + [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, "panels"))
                                             for f in fs if f.endswith(".py") and not f.endswith("_text.py")]
    return "\n".join(open(p, encoding="utf-8").read() for p in paths)


@pytest.mark.parametrize("key", sorted(CATALOGUE))
def test_every_message_has_both_languages_with_the_same_fields(key):
    en, zh = CATALOGUE[key]
    assert en.strip() and zh.strip(), key
    assert fields(zh) <= fields(en) and fields(en) - fields(zh) <= ENGLISH_PLURALS, (key, fields(en), fields(zh))
    if key in SAME_IN_BOTH:
        assert en == zh
    else:  # translated: Chinese words in it (a technical name may stay as it is inside them)
        assert zh != en and (CJK.search(zh) or key in PUNCTUATION), key


def test_every_message_is_used_and_no_panel_says_a_label_itself():
    code = sources()
    unused = [k for k in CATALOGUE if f'"{k}"' not in code and f"'{k}'" not in code and not k.startswith(DYNAMIC)]
    assert not unused, unused
    assert not [p for p in DYNAMIC if f'"{p.rstrip("._")}' not in code], "a dynamic prefix is no longer used"
    # a component's label, info, placeholder, or a button's / tab's / accordion's / markdown's fixed text, written
    # as a literal in a panel instead of L("id") from the catalogue
    literal = []
    for d, _, files in os.walk(os.path.join(ROOT, "panels")):
        for name in files:
            if not name.endswith(".py") or "i18n" in d:
                continue
            tree = ast.parse(open(os.path.join(d, name), encoding="utf-8").read())
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "gr"):
                    continue
                hidden = any(k.arg == "visible" and isinstance(k.value, ast.Constant) and k.value.value is False
                             for k in node.keywords)
                texts = [k.value for k in node.keywords if k.arg in ("label", "info", "placeholder")]
                if node.func.attr in ("Button", "Markdown", "Tab", "Accordion") and node.args:
                    texts.append(node.args[0])
                for v in texts:
                    if isinstance(v, ast.JoinedStr) or isinstance(v, ast.Constant) and isinstance(v.value, str) \
                            and re.search(r"[A-Za-z]{3}", v.value) and not hidden:
                        literal.append(f"{name}:{node.lineno} gr.{node.func.attr}")
    assert not literal, literal


@pytest.mark.parametrize("header, lang", [("zh-CN,zh;q=0.9,en;q=0.8", ZH), ("en-US,en;q=0.9", EN), ("zh-TW", ZH),
                                          ("fr-FR,fr;q=0.9", EN), ("fr;q=0.9, zh;q=0.5, en;q=0.4", ZH),
                                          ("en;q=0.3, zh;q=0.8", ZH), (None, EN), ("", EN)])
def test_the_browser_language_picks_the_page_language(header, lang):
    assert from_accept_language(header) == lang


@pytest.fixture(scope="module")
def lesson_events():
    """The step-through lesson's run: the shipped model, 16 blocks, six requests (a preemption, hits, evictions)."""
    config = EngineConfig(model=os.path.join(ROOT, "assets", "tiny-qwen-vl"), device="cpu", num_blocks=16)
    with Engine(config) as engine:
        engine.generate(demo_requests(6, None), SamplingParams(max_tokens=48))
        return engine.events(0)


def test_the_catalogues_english_is_the_engines_own_decision_log(lesson_events):
    kinds = {e.kind for e in lesson_events}
    assert {"arrived", "scheduled", "cache_lookup", "allocated", "BlockStored", "freed", "BlockRemoved", "preempted",
            "finished"} <= kinds
    for ev in lesson_events:
        assert describe_in(ev, EN) == describe(ev), ev.kind
        if ev.kind == "scheduled":
            assert plan_in(ev, EN) == describe_plan(ev, step=False)


def test_the_chinese_decision_log_says_the_same_numbers_in_chinese(lesson_events):
    for ev in lesson_events:
        for en, zh in ((describe(ev), describe_in(ev, ZH)),
                       *([(describe_plan(ev, step=False), plan_in(ev, ZH))] if ev.kind == "scheduled" else [])):
            assert CJK.search(zh), zh
            assert sorted(re.findall(r"\d+", en)) == sorted(re.findall(r"\d+", zh)), (en, zh)  # every id and number
            words = set(re.findall(r"\b[a-z]{4,}\b", re.sub(r"\breq-\d+\b", "", zh))) - {"token"}  # a term
            assert not words, (zh, words)  # no English word left (ids and key hashes aside)
    preempted = next(ev for ev in lesson_events if ev.kind == "preempted")
    assert "被抢占" in describe_in(preempted, ZH) and "之后会重新计算" in describe_in(preempted, ZH)


@pytest.mark.parametrize("case", [dict(max_model_len=4096, num_seqs=8, images_per_request=4, device="L4"),
                                  dict(max_model_len=4096, num_seqs=32, images_per_request=2, device="L4"),
                                  dict(max_model_len=32768, num_seqs=8, images_per_request=4, device="H100 80GB",
                                       model="Qwen2.5-VL-72B-Instruct", tensor_parallel_size=2)])
def test_the_budget_limits_in_both_languages(case):
    case = dict(case)
    est = estimate(load_model_preset(case.pop("model", "Qwen2.5-VL-7B-Instruct")), **case)
    assert est.limits
    said = [(context_limit, context_sentence), (memory_limit, memory_sentence), (kv_limit, kv_sentence)]
    assert [say(est, EN) for hit, say in said if hit(est)] == est.limits  # the catalogue's English is the engine's
    zh = limit_sentences(est, ZH)
    assert len(zh) == len(est.limits) and all(CJK.search(s) for s in zh)
    for en, z in zip(est.limits, zh):
        assert re.findall(r"[\d,.]+\d", en) == re.findall(r"[\d,.]+\d", z) or \
            sorted(re.findall(r"[\d,.]+\d", en)) == sorted(re.findall(r"[\d,.]+\d", z)), (en, z)


def test_the_refusals_a_person_meets_are_said_in_chinese(tmp_path):
    """Each refusal is said from its reason and fields (never from its English); the catalogue's English, filled
    with the same fields, is exactly the engine's sentence."""
    from PIL import Image
    from minivlm import Refused
    from minivlm.inputs import image_limits, video
    from minivlm.refusals import render
    bad = tmp_path / "notes.png"
    bad.write_bytes(b"not a picture at all")
    big = tmp_path / "huge.png"
    Image.new("L", (9000, 8000)).save(big)
    refused = []
    for call in (lambda: image_limits.check_file(str(bad), image_limits.image_name(str(bad), 0)),
                 lambda: image_limits.check_file(str(big), image_limits.image_name(str(big), 0)),
                 lambda: image_limits.open_all([str(big.parent / "a.png"), str(big.parent / "b.png")], None),
                 lambda: image_limits.check_size(0, 10, "image 2"),
                 lambda: image_limits.open_all([b"x" * (21 * 2**20)], None),
                 lambda: video.open_video(b"x" * (65 * 2**20), None, video.video_name("clip.mp4", 0)),
                 lambda: video._check_header(video.video_name("clip.mp4", 0), 64, 64, 40_000, 30.0),
                 lambda: video._check_header(video.video_name("clip.mp4", 0), 64, 64, 30_000, 30.0)):
        with pytest.raises(Refused) as e:
            call()
        refused.append(e.value)
    # the request's pixel budget: two images each under the per-image limit, over it together
    for name in ("a.png", "b.png"):
        Image.new("L", (7000, 5000)).save(tmp_path / name)
    with pytest.raises(Refused) as e:
        image_limits.open_all([str(tmp_path / "a.png"), str(tmp_path / "b.png")], None)
    refused.append(e.value)
    with Engine(EngineConfig(device="cpu", num_blocks=16)) as engine:
        from minivlm import Request
        for request, params in ((Request(prompt="x " * 5000), SamplingParams(max_tokens=4)),
                                (Request(prompt="What color is the shape?"), SamplingParams(max_tokens=4000)),
                                (Request(prompt="x", images=[str(big)] * 9), SamplingParams(max_tokens=4))):
            with pytest.raises(ValueError) as e:
                engine.generate(request, params)
            refused.append(e.value)
    assert len(refused) == 12
    for error in refused:
        message, zh = str(error), localize_error(error, ZH)
        assert CATALOGUE[f"error.{error.reason}"], message
        assert t(EN, f"error.{error.reason}", **{k: render(v) for k, v in error.fields.items()}) == message
        assert localize_error(error, EN) == message
        assert zh != message and CJK.search(zh), message
        assert sorted(re.findall(r"\d+", message)) == sorted(re.findall(r"\d+", zh)), (message, zh)
    assert "请先缩小" in localize_error(refused[1], ZH) and "图片 1 (huge.png)" in localize_error(refused[1], ZH)
    assert "图片 1 (a.png)" in localize_error(refused[8], ZH) and "视频 1 (clip.mp4)" in localize_error(refused[6], ZH)


def test_a_message_no_pattern_knows_stays_as_the_engine_wrote_it():
    assert localize_error("something new went wrong", ZH) == "something new went wrong"
    assert t(ZH, "chat.stop") == "停止" and t(EN, "chat.stop") == "Stop" and t(None, "chat.stop") == "Stop"
