"""The OpenAI chat-completions request: strict pydantic models (wrong types refused, not coerced), parameters this
engine cannot honour refused by name, and the translation into minivlm's SamplingParams (structured outputs and
tools: minivlm/api/constraints.py)."""
import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from minivlm.api.errors import ApiError
from minivlm.engine.request import MAX_N, SamplingParams

# OpenAI's deprecated function-calling fields (tools replaced them): accepted only at their neutral value
NEUTRAL = {"functions": (None, []), "function_call": (None, "none")}


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ImageURL(Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(Strict):
    type: Literal["image_url"]
    image_url: ImageURL


class VideoURL(Strict):
    url: str


class VideoPart(Strict):
    """vLLM's video part: {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."}}."""
    type: Literal["video_url"]
    video_url: VideoURL


class VideoKwargs(Strict):
    """vLLM's mm_processor_kwargs for video sampling, applied to every video of the request."""
    fps: float | None = Field(None, gt=0, le=120)
    num_frames: int | None = Field(None, ge=1)


class FunctionCall(Strict):
    name: str
    arguments: str  # JSON text, as the API answered it


class ToolCall(Strict):
    """A tool call of an earlier assistant turn, sent back with the conversation."""
    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Annotated[Union[TextPart, ImagePart, VideoPart], Field(discriminator="type")]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None           # tool turns: the call this result answers


class JsonSchema(Strict):
    """response_format.json_schema: the answer is valid against `schema` (always enforced, whatever `strict` says)."""
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class StructuredOutputs(Strict):
    """vLLM's extra field: exactly one of a JSON Schema, any JSON object, a regex, a choice of strings, a grammar."""
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


class Function(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: Any = None  # a JSON Schema; checked by compiling it (constraints.check_tools)
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: Function


class FunctionName(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: FunctionName


class StreamOptions(Strict):
    include_usage: bool = False


class ChatCompletionRequest(Strict):
    """The fields of POST /v1/chat/completions that minivlm implements (plus vLLM's top_k, ignore_eos, cache_salt,
    repetition_penalty, structured_outputs and mm_processor_kwargs)."""
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=-2**63, le=2**63 - 1)  # what torch.Generator takes
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    cache_salt: str | None = None
    ignore_eos: bool = False
    mm_processor_kwargs: VideoKwargs | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=10)  # vLLM's
    logit_bias: dict[str, float] | None = None  # token id (as a string, as OpenAI sends it) -> bias
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


MODELS = (ChatCompletionRequest, Message, TextPart, ImagePart, ImageURL, VideoPart, VideoURL, VideoKwargs,
          StreamOptions, ToolCall, FunctionCall, JsonSchema, ResponseFormat, StructuredOutputs, Function, Tool,
          FunctionName, NamedToolChoice)
FIELD_NAMES = {field.alias or name for model in MODELS for name, field in model.model_fields.items()}


def _param(loc: tuple) -> str:
    """pydantic's error location -> the field path the client sent, e.g. 'messages[0].content[1].image_url.url'
    (union branch labels such as 'str' or a repeated tag are not fields and are dropped)."""
    out, previous = "", None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in FIELD_NAMES and part != previous:
            out += f".{part}" if out else part
        previous = part
    return out


def parse_request(raw: bytes) -> ChatCompletionRequest:
    """Body bytes -> a validated request, or an ApiError that names the offending field."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    for name, neutral in NEUTRAL.items():
        if name in body:
            value = body.pop(name)
            if value not in neutral:
                raise ApiError(400, f"minivlm does not support {name!r} (got {json.dumps(value)[:80]})", param=name,
                               code="unsupported_parameter")
    unknown = sorted(set(body) - set(ChatCompletionRequest.model_fields))
    if unknown:
        raise ApiError(400, f"unrecognized request argument supplied: {', '.join(unknown)}", param=unknown[0],
                       code="unknown_parameter")
    try:
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        deepest = max(e.errors(), key=lambda x: len(x["loc"]))  # the branch of a union the client meant
        param = _param(deepest["loc"])
        why = " or ".join(dict.fromkeys(x["msg"] for x in e.errors() if _param(x["loc"]) == param))
        raise ApiError(400, f"{param}: {why}", param=param, code="invalid_value") from None
    check_messages(req.messages)
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed with stream=true", param="stream_options",
                       code="invalid_value")
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs", code="invalid_value")
    return req


def check_messages(messages: list[Message]):
    """What OpenAI asks of a conversation with tool calls: a tool turn names the call it answers, one of the calls of
    the assistant turn before it (only tool turns between them), tool_calls only on assistant turns, no content only
    where an assistant turn calls tools."""
    calls: list[str] | None = None  # the ids the assistant turn before may be answered by; None: no such turn
    for i, m in enumerate(messages):
        if m.role == "tool" and not m.tool_call_id:
            raise ApiError(400, f"messages[{i}] is a 'tool' message: it needs the tool_call_id it answers",
                           param=f"messages[{i}].tool_call_id", code="invalid_value")
        if m.role == "tool" and not calls:
            raise ApiError(400, f"messages[{i}] is a 'tool' message answering tool_call_id {m.tool_call_id[:80]!r}, "
                                f"but no assistant message with tool_calls comes before it",
                           param=f"messages[{i}].role", code="invalid_value")
        if m.role == "tool" and m.tool_call_id not in calls:
            raise ApiError(400, f"messages[{i}].tool_call_id {m.tool_call_id[:80]!r} answers no call of the assistant "
                                f"message before it (its tool_calls: {', '.join(map(repr, calls))[:200]})",
                           param=f"messages[{i}].tool_call_id", code="invalid_value")
        if m.role != "tool":
            calls = [c.id for c in m.tool_calls] if m.role == "assistant" and m.tool_calls else None
        if m.tool_calls is not None and m.role != "assistant":
            raise ApiError(400, f"messages[{i}]: only assistant messages carry tool_calls",
                           param=f"messages[{i}].tool_calls", code="invalid_value")
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise ApiError(400, f"messages[{i}].content is missing (only an assistant turn with tool_calls may leave "
                                f"it out)", param=f"messages[{i}].content", code="invalid_value")


def logit_bias(req: ChatCompletionRequest) -> dict[int, float] | None:
    """OpenAI's logit_bias keys are token ids written as strings."""
    if not req.logit_bias:
        return None
    bad = next((k for k in req.logit_bias if not k.isdigit()), None)
    if bad is not None:
        raise ApiError(400, f"logit_bias keys are token ids (as strings of digits), got {bad[:40]!r}",
                       param="logit_bias", code="invalid_value")
    return {int(k): float(v) for k, v in req.logit_bias.items()}


def sampling_params(req: ChatCompletionRequest, defaults: dict, max_tokens: int, structured=None) -> SamplingParams:
    """OpenAI fields -> SamplingParams (max_tokens already resolved); unset ones come from `defaults` (the
    checkpoint's generation_config); `structured`: the StructuredOutputsParams the answer must follow."""
    def pick(name, fallback):
        value = getattr(req, name)
        return value if value is not None else defaults.get(name, fallback)
    top_k = pick("top_k", 0)
    return SamplingParams(max_tokens=max_tokens,
                          temperature=float(pick("temperature", 1.0)), top_p=float(pick("top_p", 1.0)),
                          top_k=max(0, top_k), seed=req.seed, stop=req.stop, ignore_eos=req.ignore_eos,
                          logprobs=(req.top_logprobs or 0) if req.logprobs else None, n=req.n,
                          presence_penalty=float(req.presence_penalty or 0),
                          frequency_penalty=float(req.frequency_penalty or 0),
                          repetition_penalty=float(req.repetition_penalty or 1), logit_bias=logit_bias(req),
                          structured_outputs=structured)
