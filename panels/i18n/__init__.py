"""The app in English and 简体中文: one message catalogue (message id -> English, Chinese; the per-panel tables in
this package) that feeds both gradio's own i18n (static labels, translated in the browser by its language) and the
server's `t(lang, id, **fields)` for what handlers write (markdown, decision log, plot titles, errors). A session's
language is the header's switch if it was used, else the browser's Accept-Language; API clients get English."""
import collections
import re
import threading

import gradio as gr
from gradio.i18n import I18nData

from panels.i18n import (app_text, chat_text, events_text, groups_text, kv_text, other_text, roofline_text,
                         timeline_text, vram_text)

EN, ZH = "en", "zh-CN"
LANGS = (EN, ZH)
SWITCH_CHOICES = [("English", EN), ("中文", ZH)]  # the header's switch: each language named in itself
# every message: id -> (English, Chinese); ids are "panel.what"
CATALOGUE: dict[str, tuple[str, str]] = {}
for _table in (app_text, chat_text, events_text, groups_text, kv_text, vram_text, other_text, roofline_text,
               timeline_text):
    for _key, _pair in _table.MESSAGES.items():
        if _key in CATALOGUE:
            raise ValueError(f"message id {_key} is defined twice")
        CATALOGUE[_key] = _pair

# the browser picks by navigator.language: every Chinese locale gets the simplified text (better than English)
I18N = gr.I18n(en={k: v[0] for k, v in CATALOGUE.items()},
               **{loc: {k: v[1] for k, v in CATALOGUE.items()} for loc in ("zh-CN", "zh", "zh-TW", "zh-HK")})


def t(lang: str | None, key: str, /, **fields) -> str:
    """Message `key` in `lang` (English for anything but Chinese), its {fields} filled in."""
    text = CATALOGUE[key][1 if lang == ZH else 0]
    return text.format(**fields) if fields else text


def word(lang: str, group: str, text: str) -> str:
    """A fixed word of the engine's (a step kind, a finish reason, a budget item) in `lang`: message "group.text",
    or the word itself when the catalogue has none."""
    key = f"{group}.{text}"
    return t(lang, key) if key in CATALOGUE else text


def L(key: str) -> I18nData:  # noqa: N802 (a label, as gettext's _)
    """A static label (component label, info, placeholder, button text, tab title, fixed markdown): translated
    in the browser at first paint, and re-sent by the server when the header's switch changes the language."""
    if key not in CATALOGUE:
        raise KeyError(f"no message {key} in the catalogue")
    return I18N(key)


def from_accept_language(header: str | None) -> str:
    """The first language of an Accept-Language header (by q-value) that the app speaks; English otherwise."""
    ranked = []
    for i, part in enumerate((header or "").split(",")):
        tag, _, q = part.strip().partition(";q=")
        try:
            weight = float(q) if q else 1.0
        except ValueError:
            weight = 0.0
        ranked.append((-weight, i, tag.strip().lower()))
    for _, _, tag in sorted(ranked):
        if tag.startswith("zh"):
            return ZH
        if tag.startswith("en"):
            return EN
    return EN


class Languages:
    """Session -> language chosen with the header's switch (the newest sessions; like holder.salt, by hash)."""
    KEPT = 10_000

    def __init__(self):
        self.chosen: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.lock = threading.Lock()

    def set(self, request: gr.Request | None, lang: str):
        session = getattr(request, "session_hash", None)
        if session and lang in LANGS:
            with self.lock:
                self.chosen[session] = lang
                self.chosen.move_to_end(session)
                while len(self.chosen) > self.KEPT:
                    self.chosen.popitem(last=False)

    def of(self, request: gr.Request | None) -> str:
        """The session's language: its switch, else its browser's Accept-Language, else (an API client) English."""
        if request is None:
            return EN
        with self.lock:
            chosen = self.chosen.get(getattr(request, "session_hash", None) or "")
        if chosen:
            return chosen
        headers = getattr(request, "headers", None) or {}
        return from_accept_language(headers.get("accept-language"))


LANGUAGES = Languages()


def lang_of(request: gr.Request | None) -> str:
    return LANGUAGES.of(request)


_KEY = re.compile(r'^__i18n__\{"__type__": "translation_metadata", "key": "([^"]+)"\}$')
STATIC_ATTRS = ("label", "info", "placeholder", "value")


def message_id(value) -> str | None:
    """The catalogue id a static attribute holds (an L(...) value, or its string form), else None."""
    if isinstance(value, I18nData):
        return value.key
    m = _KEY.match(value) if isinstance(value, str) else None
    return m.group(1) if m else None


def static_texts(demo: gr.Blocks) -> list[tuple[gr.blocks.Block, dict[str, str]]]:
    """Every component whose label, info, placeholder or fixed value is a catalogue id: (block, {attr: id}). An
    examples table's column headers (its inputs' labels) are one attribute, a list of ids: gradio's page translates
    a label but shows a header as the raw `__i18n__{...}` text, so they are set to English words here and the
    switch sends them in the page's language."""
    out = []
    for block in demo.blocks.values():
        ids = {a: k for a in STATIC_ATTRS if (k := message_id(getattr(block, a, None)))}
        headers = getattr(block, "headers", None) if isinstance(block, gr.Dataset) else None
        if headers and any(message_id(h) for h in headers):
            ids["headers"] = [message_id(h) or h for h in headers]
            block.headers = said(EN, ids["headers"])
        if ids:
            out.append((block, ids))
    return out


def said(lang: str, key):
    """A static attribute in `lang`: a catalogue id's text, or for a list (headers) each id's (other words kept)."""
    if isinstance(key, list):
        return [t(lang, k) if k in CATALOGUE else k for k in key]
    return t(lang, key)


def static_updates(texts, lang: str) -> list:
    """The updates that put every static text of the page in `lang` (what the switch and a page load send)."""
    return [gr.update(**{a: said(lang, k) for a, k in ids.items()}) for _, ids in texts]


def in_english(value):
    """`value` (the API's description of the app) with every translatable label as its English text: the HTTP and
    gradio_client APIs name their parameters in English, whatever the page's language."""
    if isinstance(value, dict):
        if value.get("__type__") == "translation_metadata":
            return t(EN, value["key"])
        return {k: in_english(v) for k, v in value.items()}
    if isinstance(value, list):
        return [in_english(v) for v in value]
    key = message_id(value)
    return t(EN, key) if key else value


def english_api(demo: gr.Blocks) -> gr.Blocks:
    """Make `demo`'s API description (/info, the client's view_api) say its labels in English."""
    describe = demo.get_api_info
    demo.get_api_info = lambda *args, **kwargs: in_english(describe(*args, **kwargs))
    return demo
