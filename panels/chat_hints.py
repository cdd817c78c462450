"""What a teaching model was trained to answer: a checkpoint that ships `questions.json` (the shipped tiny model
does) gets a hint instead of a guess when a question has no picture, and a note when a question is not one of
its trained forms (a typo, "colour", another language), so a confident wrong answer is never left unexplained."""
import functools
import json
import os
import re

from panels.i18n import CATALOGUE, EN, t

HINT_TITLE = t(EN, "chat.hint_title")
HINT_TITLES = CATALOGUE["chat.hint_title"]  # a bubble keeps the language it was written in


@functools.lru_cache(maxsize=8)
def trained_questions(model_dir: str) -> tuple | None:
    """(what the pictures show, the questions in their exact words, the Chinese forms or ()) for a model directory,
    or None."""
    path = os.path.join(model_dir, "questions.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        spec = json.load(f)
    return spec["about"], tuple(spec["questions"]), tuple(spec.get("questions_zh", ())), spec.get("about_zh")


def knows_chinese(model_dir: str) -> bool:
    """Whether the model was trained on the Chinese forms too (its questions.json lists them)."""
    trained = trained_questions(model_dir)
    return trained is not None and bool(trained[2])


def _norm(text: str) -> str:  # case, spacing and the width of a question mark do not make another question
    return re.sub(r"\s+", " ", text).strip().lower().replace("？", "?")


def summary(questions: tuple[str, ...]) -> str:
    """The trained forms in one line, with placeholders: "What color is the {shape}?" for three questions (the
    Chinese forms: "{形状}是什么颜色？")."""
    colour, zh_colour = r"(red|green|blue|yellow|purple|orange)", "(红色|绿色|蓝色|黄色|紫色|橙色)"
    forms = dict.fromkeys(re.sub(rf"\b{colour}\b", "{colour}", re.sub(rf"\ban? {colour}\b", "a {colour}",
                                 re.sub(r"\b(circle|square|triangle)\b", "{shape}", q))) for q in questions)
    forms = dict.fromkeys(re.sub(zh_colour, "{颜色}", re.sub("(圆形|正方形|三角形)", "{形状}", q)) for q in forms)
    return " · ".join(forms)


def trained_summary(trained: tuple, lang: str = EN) -> tuple[str, str]:
    """(what the pictures show, the trained forms) in the page's language where the model was trained in it."""
    about, questions, questions_zh, about_zh = trained
    if lang != EN and questions_zh:
        return about_zh or about, summary(questions_zh)
    return about, summary(questions)


def hint(model_dir: str, has_image: bool, question: str, lang: str = EN) -> str | None:
    """What to tell the user before (no picture) or after (an untrained question) the model's answer."""
    trained = trained_questions(model_dir)
    if trained is None:
        return None
    about, forms = trained_summary(trained, lang)
    if not has_image:
        return t(lang, "chat.hint_no_picture", about=about, questions=forms)
    if _norm(question) and _norm(question) not in {_norm(q) for q in trained[1] + trained[2]}:
        return t(lang, "chat.hint_untrained", question=question.strip()[:80], questions=forms)
    return None
