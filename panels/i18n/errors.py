"""The engine's refusals in the page's language. A refusal (minivlm.Refused, or a closed engine) carries its reason
and its fields as data: the page says "error.<reason>" from the catalogue with those fields, and names each image
or video in its own words. Its English wording is never read. A refusal the catalogue has no sentence for, and any
other error, is shown as the engine wrote it.

The engine's words in the status line (engine.*) are not refusals either: each backend's words carry their message
id and fields (minivlm.model.backends.Said), and are said by the id; the device notes, plain text, are matched
against their English in the catalogue (localize_status)."""
import functools
import re

from minivlm.refusals import Name, render
from panels.i18n import CATALOGUE, EN, t


def name_in(lang: str, name: Name) -> str:
    """"image 2 (cat.png)" in `lang`: the file's name stays as it is."""
    return t(lang, f"error.{name.kind}_name", n=name.number) + (f" ({name.file})" if name.file else "")


def localize_error(error: BaseException | str, lang: str) -> str:
    """`error` (a refusal raised by the engine, or any exception or text) in `lang`: a refusal whose reason the
    catalogue knows is said from its fields; anything else is shown as it is (status words: localize_status)."""
    if lang == EN:
        return str(error)
    key = f"error.{getattr(error, 'reason', None)}"
    if isinstance(error, BaseException) and key in CATALOGUE:
        fields = {k: render(v, functools.partial(name_in, lang)) for k, v in getattr(error, "fields", {}).items()}
        return t(lang, key, **fields)
    return localize_status(error if isinstance(error, str) else str(error), lang)  # a Said keeps its id


@functools.cache
def patterns() -> list[tuple[str, re.Pattern]]:
    """(message id, a regex of its English text whose groups are its fields) of the status words, longest first."""
    out = []
    for key, (en, _) in CATALOGUE.items():
        if key.startswith("engine.") and "{" in en:
            regex = "".join(f"(?P<{part[1:-1]}>.*?)" if part.startswith("{") else re.escape(part)
                            for part in re.split(r"(\{\w+\})", en))
            out.append((key, re.compile(f"^{regex}$", re.S)))
    return sorted(out, key=lambda p: -len(CATALOGUE[p[0]][0]))


def localize_status(text: str, lang: str) -> str:
    """The engine's status words (the backends it runs, why a device is unavailable) in `lang`, when known: by the
    message id a backend's words carry (their fields likewise), else by the English of a fixed or patterned one."""
    if lang == EN:
        return text
    if getattr(text, "key", None) in CATALOGUE:
        return t(lang, text.key, **{k: localize_status(v, lang) if isinstance(v, str) else v
                                    for k, v in text.fields.items()})
    fixed = {en: key for key, (en, _) in CATALOGUE.items() if key.startswith("engine.") and "{" not in en}
    if text.strip() in fixed:
        return t(lang, fixed[text.strip()])
    for key, pattern in patterns():
        m = pattern.match(text.strip())
        if m is not None:
            return t(lang, key, **m.groupdict())
    return text
