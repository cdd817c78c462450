"""The OpenAI chat-completions request: strict pydantic models (wrong types refused, not coerced), parameters this
engine cannot honour refused by name, and the translation into minivlm's SamplingParams."""
import json
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from minivlm.api.errors import ApiError
from minivlm.engine.request import SamplingParams

# OpenAI parameters minivlm does not implement: accepted only at their neutral value, otherwise refused by name
NEUTRAL = {"frequency_penalty": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
           "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
           "parallel_tool_calls": (None, False, True), "response_format": (None, {"type": "text"})}


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
    fps: float | int | None = Field(None, gt=0, le=120)
    num_frames: int | None = Field(None, ge=1)


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[Annotated[Union[TextPart, ImagePart, VideoPart], Field(discriminator="type")]]
    name: str | None = None


class StreamOptions(Strict):
    include_usage: bool = False


class ChatCompletionRequest(Strict):
    """The fields of POST /v1/chat/completions that minivlm implements (plus vLLM's top_k, ignore_eos and
    cache_salt)."""
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=-2**63, le=2**63 - 1)  # what torch.Generator takes
    stop: str | list[str] | None = None
    n: int = 1
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    cache_salt: str | None = None
    ignore_eos: bool = False
    mm_processor_kwargs: VideoKwargs | None = None


FIELD_NAMES = {name for model in (ChatCompletionRequest, Message, TextPart, ImagePart, ImageURL, VideoPart, VideoURL,
                                  VideoKwargs, StreamOptions) for name in model.model_fields}


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
    if req.n != 1:
        raise ApiError(400, f"n={req.n}: minivlm returns one choice per request (n=1); send n requests instead",
                       param="n", code="unsupported_value")
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed with stream=true", param="stream_options",
                       code="invalid_value")
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs", code="invalid_value")
    return req


def sampling_params(req: ChatCompletionRequest, defaults: dict, max_tokens: int) -> SamplingParams:
    """OpenAI fields -> SamplingParams (max_tokens already resolved); unset ones come from `defaults` (the
    checkpoint's generation_config)."""
    def pick(name, fallback):
        value = getattr(req, name)
        return value if value is not None else defaults.get(name, fallback)
    top_k = pick("top_k", 0)
    return SamplingParams(max_tokens=max_tokens,
                          temperature=float(pick("temperature", 1.0)), top_p=float(pick("top_p", 1.0)),
                          top_k=max(0, top_k), seed=req.seed, stop=req.stop, ignore_eos=req.ignore_eos,
                          logprobs=(req.top_logprobs or 0) if req.logprobs else None)
