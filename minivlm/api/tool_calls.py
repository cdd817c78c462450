"""Tool calls read back from the text a model wrote, as OpenAI's `message.tool_calls`, whole or as the growing text
streams. Three forms: a named function (the whole answer is its JSON arguments), `required` (a JSON array of
{"name", "parameters"}, the form vLLM constrains it to) and `auto`, the model's own format, in `<tool_call>` blocks
after any text: Qwen2.5's and Qwen3's (Hermes') JSON `{"name": ..., "arguments": {...}}`, read as vLLM's hermes
parser reads it, or Qwen3.5's and Qwen3-Coder's XML `<function=NAME><parameter=P>value</parameter></function>`,
read as vLLM's qwen3_coder parser reads it (each value typed by the tool's parameter schema). The text before the
first block is the content; a block that parses as neither makes the whole answer plain content. Arguments are the
model's own JSON text where it wrote them whole, so a streamed call adds up to the same string as the non-streamed
one."""
import json
import re
import uuid

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
BLOCKS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)  # an unclosed last block counts too
XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)
_decoder = json.JSONDecoder()


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def call(name: str, arguments: str, id: str | None = None) -> dict:
    return {"id": id or call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def hermes_calls(text: str, schemas: dict | None = None) -> tuple[str | None, list[dict]]:
    """(content, calls) of an `auto` answer: the text before the first <tool_call> block and each block's call
    (JSON, or XML typed by schemas: tool name -> its parameters' JSON Schema); no block, or a block that parses as
    neither, leaves the whole text as content."""
    start = text.find(TOOL_OPEN)
    if start < 0:
        return text, []
    calls = []
    for closed, unclosed in BLOCKS.findall(text[start:]):
        block = closed or unclosed
        parsed = xml_call(block, schemas or {}) if block.lstrip().startswith("<function=") else json_call(block)
        if parsed is None:
            return text, []
        calls.append(parsed)
    return text[:start] or None, calls


def json_call(block: str) -> dict | None:
    try:
        obj = json.loads(block)
        name, args = obj["name"], obj.get("arguments", {})
        if not isinstance(name, str):
            raise TypeError
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return call(name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def xml_call(block: str, schemas: dict) -> dict | None:
    """<function=NAME> with its <parameter=P> values (one newline trimmed each side), typed by NAME's schema."""
    m = XML_FUNCTION.match(block)
    if m is None:
        return None
    name, body = m.group(1).strip(), m.group(2)
    properties = (schemas.get(name) or {}).get("properties", {})
    args = {}
    for key, value in XML_PARAMETER.findall(body):
        value = value[1:] if value.startswith("\n") else value
        args[key.strip()] = typed(value[:-1] if value.endswith("\n") else value, properties.get(key.strip(), {}))
    return call(name, json.dumps(args, ensure_ascii=False))


def typed(value: str, schema: dict):
    """A parameter's text as its schema's type: strings as written; integers, numbers, booleans, objects and arrays
    parsed (vLLM's qwen3_coder rules); "null" is None; a value that does not parse stays a string."""
    kind = schema.get("type", "string") if isinstance(schema, dict) else "string"
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if value.strip().lower() == "null":
        return None
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            number = float(value)
            return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
        if kind == "boolean":
            return {"true": True, "false": False}[value.strip().lower()]
        if kind in ("object", "array"):
            return json.loads(value)
    except (ValueError, KeyError):
        pass
    return value


def value_end(text: str, start: int) -> int | None:
    """Where the JSON value that starts at text[start] ends (one past it), None while it is incomplete."""
    if start >= len(text):
        return None
    if text[start] not in "{[":
        try:
            _, end = _decoder.raw_decode(text, start)
        except ValueError:
            return None
        return end if end < len(text) or text[start] in '"tfn' else None  # a number may go on: what follows ends it
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            escaped, in_string = (not escaped and c == "\\"), in_string and (escaped or c != '"')
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def required_progress(text: str) -> list[tuple[str, str, bool]]:
    """(name, arguments so far, complete) of each call in a `required` answer as far as it has been written. The
    grammar writes each item as {"name": "<tool>", "parameters": <arguments>} (compact JSON, name first)."""
    calls, at = [], 0
    while (head := text.find('{"name": ', at)) >= 0:
        try:
            name, at = _decoder.raw_decode(text, head + len('{"name": '))
        except ValueError:
            break  # the name is still being written
        if not text.startswith(', "parameters": ', at):
            break  # still being written
        start = at + len(', "parameters": ')
        end = value_end(text, start)
        calls.append((name, text[start:end], end is not None))
        if end is None:
            break
        at = end
    return calls


def required_calls(text: str) -> list[dict]:
    return [call(name, args) for name, args, _ in required_progress(text)]


def message(text: str, mode: str, function: str | None = None, parallel: bool = True,
            schemas: dict | None = None) -> dict:
    """The assistant message of a finished answer: content, and tool_calls when the mode reads any (schemas: each
    tool's parameters, which type `auto`'s XML values)."""
    content, calls = text, []
    if mode == "named":
        content, calls = None, [call(function, text)]
    elif mode == "required":
        content, calls = None, required_calls(text)
    elif mode == "auto":
        content, calls = hermes_calls(text, schemas)
    out = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        out["tool_calls"] = calls if parallel else calls[:1]
    return out


class ToolCallStream:
    """One choice's tool calls as its text grows: update(text) returns the new part as an OpenAI delta (content
    and/or tool_calls entries, each naming its call by index); {} when there is nothing new to send yet."""

    def __init__(self, mode: str, function: str | None = None, parallel: bool = True, schemas: dict | None = None):
        self.mode, self.function, self.parallel, self.schemas = mode, function, parallel, schemas
        self.sent_args: list[int] = []  # per call announced: how much of its arguments was sent
        self.sent_content = 0
        self.called = False

    def _args(self, progress: list[tuple[str, str]]) -> list[dict]:
        """Deltas for calls as far as written: a new call with its id and name, then its arguments as they grow."""
        parts = []
        for i, (name, args) in enumerate(progress[:None if self.parallel else 1]):
            if i == len(self.sent_args):
                parts.append({"index": i, **call(name, args)})
                self.sent_args.append(len(args))
            elif len(args) > self.sent_args[i]:
                parts.append({"index": i, "function": {"arguments": args[self.sent_args[i]:]}})
                self.sent_args[i] = len(args)
        self.called = self.called or bool(self.sent_args)
        return parts

    def update(self, text: str, final: bool = False) -> dict:
        if self.mode == "named":
            parts = self._args([(self.function, text)] if text or final else [])
        elif self.mode == "required":
            parts = self._args([(name, args) for name, args, _ in required_progress(text)])
        else:
            return self._auto(text, final)
        return {"tool_calls": parts} if parts else {}

    def _auto(self, text: str, final: bool) -> dict:
        """Text before the first <tool_call> streams as content (a tail that may be the start of one waits); each
        block is sent as a call once it closes (at the end, also an unclosed one)."""
        start = text.find(TOOL_OPEN)
        if start < 0:
            keep = 0 if final else next((k for k in range(len(TOOL_OPEN) - 1, 0, -1)
                                         if text.endswith(TOOL_OPEN[:k])), 0)
            return self._content(text[:len(text) - keep])
        closed = text[:text.rfind(TOOL_CLOSE) + len(TOOL_CLOSE)] if TOOL_CLOSE in text[start:] else text[:start]
        _, calls = hermes_calls(text if final else closed, self.schemas)
        if final and not calls:  # a block that does not parse: the rest is content after all
            return self._content(text)
        delta = self._content(text[:start])
        parts = self._args([(c["function"]["name"], c["function"]["arguments"]) for c in calls])
        return {**delta, "tool_calls": parts} if parts else delta

    def _content(self, text: str) -> dict:
        new, self.sent_content = text[self.sent_content:], max(self.sent_content, len(text))
        return {"content": new} if new else {}
