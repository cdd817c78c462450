"""The engine's refusals in the page's language. The engine (and its HTTP API) speaks English; each refusal a
person meets in the UI has its English wording in the catalogue with {fields} ("error.*"), so the Chinese page reads
the fields back out of the message and fills them into the Chinese text. A message no pattern knows stays as it is."""
import functools
import re

from panels.i18n import CATALOGUE, EN, t

# parts of a message that are themselves words: the image's name, the unit it is counted per, the advice
WORDS = {"what": {"image": "error.what_image", "video": "error.what_video"},
         "advice": {"send a smaller file": "error.advice_smaller", "send a shorter or smaller file":
                    "error.advice_shorter"},
         "why": {"the fused C paths are for the CPU in fp32": "engine.decode_not_cpu", "compiling": "engine.compiling"}}
IMAGE_NAME = re.compile(r"\bimage (\d+)\b")
# messages without fields: English text -> id
FIXED = {en: key for key, (en, _) in CATALOGUE.items() if key.startswith(("error.", "engine.")) and "{" not in en}


@functools.cache
def patterns() -> list[tuple[str, re.Pattern]]:
    """(message id, a regex of its English text whose groups are its fields), longest texts first."""
    out = []
    for key, (en, _) in CATALOGUE.items():
        if not key.startswith(("error.", "engine.")) or "{" not in en:
            continue
        regex = "".join(f"(?P<{part[1:-1]}>.*?)" if part.startswith("{") else re.escape(part)
                        for part in re.split(r"(\{\w+\})", en))
        out.append((key, re.compile(f"^{regex}$", re.S)))
    return sorted(out, key=lambda p: -len(CATALOGUE[p[0]][0]))


def localize_error(message: str, lang: str) -> str:
    """`message` (an engine refusal in English) in `lang`: translated when its form is known, else unchanged."""
    if lang == EN:
        return message
    for line in message.split("\n"):
        for key, pattern in patterns():
            m = pattern.match(line.strip())
            if m is None:
                continue
            fields = {}
            for name, value in m.groupdict().items():
                known = WORDS.get(name, {}).get(value)
                fields[name] = t(lang, known) if known else IMAGE_NAME.sub(
                    lambda n: t(lang, "error.image_name", n=n.group(1)), value)
            message = message.replace(line.strip(), t(lang, key, **fields))
            break
        else:
            fixed = FIXED.get(line.strip())
            if fixed:
                message = message.replace(line.strip(), t(lang, fixed))
    return message
