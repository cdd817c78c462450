"""The engine's refusals in the page's language. A refusal (minivlm.Refused, or a closed engine) carries its reason
and its fields as data: the page says "error.<reason>" from the catalogue with those fields, and names each image
or video in its own words. Its English wording is never read. A refusal the catalogue has no sentence for, and any
other error, is shown as the engine wrote it.

The engine's words in the status line (engine.*) are not refusals either: each backend's words, and why a device is
not available, carry their message id and fields (minivlm.model.backends.Said), and are said by the id
(localize_status). No English is parsed here."""
import functools

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


def localize_status(text: str, lang: str) -> str:
    """The engine's status words (the backends it runs, why a device is unavailable) in `lang`: by the message id
    they carry (a Said; its fields likewise); text without an id (a word such as "enforce_eager") stays as it is."""
    if lang == EN or getattr(text, "key", None) not in CATALOGUE:
        return text
    return t(lang, text.key, **{k: localize_status(v, lang) if isinstance(v, str) else v
                                for k, v in text.fields.items()})
