"""Why the engine will not run a request, as data: a refusal carries a `code` (what the HTTP API answers), the
`param` at fault, a `reason` (which sentence: the page says "error.<reason>" in its own language) and the `fields`
the sentence names. str() is the English sentence, for logs and English readers; nothing keys on its wording.
It imports nothing, so the input side and the engine both raise it."""


class Name(str):
    """How a refusal names one image or video of a request, "image 2 (cat.png)": its kind, number and file stay
    readable, so a page can name it in its own words."""
    kind: str
    number: int
    file: str | None

    def __new__(cls, kind: str, number: int, file: str | None = None):
        name = super().__new__(cls, f"{kind} {number}" + (f" ({file})" if file else ""))
        name.kind, name.number, name.file = kind, number, file
        return name

    def __reduce__(self):
        return Name, (self.kind, self.number, self.file)


def render(value, name=str) -> str:
    """A field as a sentence writes it: a list's items joined by " + ", a tuple's by spaces, a Name by `name`."""
    if isinstance(value, list):
        return " + ".join(render(v, name) for v in value)
    if isinstance(value, tuple):
        return " ".join(render(v, name) for v in value)
    return name(value) if isinstance(value, Name) else str(value)


class Refused(ValueError):
    """The engine refused a request (too large, unreadable, over a limit): nothing of it was queued.

    code: the HTTP API's error code ("image_too_large", "context_length_exceeded", ...; docs/API.md lists them)
    param: the request field at fault ("messages", "max_tokens", "mm_processor_kwargs")
    reason: which sentence of its code (defaults to the code)
    fields: the values the sentence names; `template` is the English sentence with {fields}"""

    def __init__(self, code: str, template: str, *, reason: str | None = None, param: str | None = "messages",
                 **fields):
        self.code, self.reason, self.param, self.template, self.fields = code, reason or code, param, template, fields
        super().__init__(template.format(**{k: render(v) for k, v in fields.items()}))

    def __reduce__(self):  # str() is built from the template: rebuild from the parts, not from args
        return _rebuild, (self.code, self.template, self.reason, self.param, self.fields)


def _rebuild(code, template, reason, param, fields):
    return Refused(code, template, reason=reason, param=param, **fields)


class EngineClosed(RuntimeError):
    """A request sent to an engine that was closed (the app rebuilt it meanwhile): send it again."""
    code = reason = "engine_closed"
    param = None
    fields: dict = {}

    def __init__(self, message: str = "this engine is closed"):
        super().__init__(message)
