"""What a caller sends: a Request (prompt + images, or chat messages) and its SamplingParams; and where a request
stands inside the engine (RequestStatus)."""
import enum
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from minivlm.refusals import Refused

_ids = itertools.count()


def _bad(param: str, must: str, value) -> Refused:
    """A sampling parameter out of its range: refused naming the parameter (the HTTP API's `param`)."""
    return Refused("invalid_value", "{name} must be {must}, got {value}", reason="sampling_param", param=param,
                   name=param, must=must, value=repr(value))


class RequestStatus(enum.Enum):
    """A request's place in the engine (vLLM's names). Only engine/lifecycle.py moves a request between them:
    WAITING -> RUNNING (admitted: blocks allocated) -> PREEMPTED (blocks released, first in line) -> RUNNING ...
    -> one FINISHED_* (from any of them)."""
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"          # an EOS token or a stop string
    FINISHED_LENGTH_CAPPED = "length"  # max_tokens or max_model_len reached
    FINISHED_ABORTED = "abort"         # the caller cancelled it (or went away)
    FINISHED_ERROR = "error"           # a fault in one of its steps (RequestFailed)

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")

    @property
    def finish_reason(self) -> str | None:
        """The Output's finish_reason ("stop" | "length" | "abort" | "error"), None while unfinished."""
        return self.value if self.finished else None

    @classmethod
    def finished_by(cls, reason: str) -> "RequestStatus":
        return next(s for s in cls if s.finished and s.value == reason)


@dataclass
class SamplingParams:
    """How to pick tokens: temperature 0 is greedy; logprobs=k reports the top-k (plus the sampled token)."""
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] | str | None = None
    ignore_eos: bool = False
    logprobs: int | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise _bad("max_tokens", "an integer >= 1", self.max_tokens)
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise _bad("temperature", "a number >= 0", self.temperature)
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise _bad("top_p", "in (0, 1]", self.top_p)
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise _bad("top_k", "an integer >= 0 (0 = off)", self.top_k)
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise _bad("logprobs", "an integer >= 0 or None", self.logprobs)


@dataclass
class Request:
    """A prompt with images, or a chat history in HF messages format (exactly one of the two)."""
    prompt: str | None = None
    images: list[Any] = field(default_factory=list)
    messages: list[dict] | None = None
    cache_salt: str | None = None
    mm_processor_kwargs: dict | None = None
    request_id: str | None = None

    def __post_init__(self):
        if self.request_id is None:
            self.request_id = f"req-{next(_ids)}"
        if self.images is None:
            self.images = []

    def to_messages(self) -> list[dict]:
        """The chat this request means: images first, then the prompt, as one user turn."""
        if self.messages is not None:
            if self.prompt is not None or self.images:
                raise Refused("invalid_value", "give either messages or prompt/images, not both",
                              reason="messages_and_prompt")
            if not isinstance(self.messages, list) or not self.messages:
                raise Refused("invalid_value", "messages must be a non-empty list of dicts with 'role' and 'content'",
                              reason="messages_shape")
            return self.messages
        if not (self.prompt and self.prompt.strip()) and not self.images:
            raise Refused("invalid_value", "empty request: give a prompt, images, or messages", reason="empty_request")
        content = [{"type": "image", "image": im} for im in self.images]
        content.append({"type": "text", "text": self.prompt or ""})
        return [{"role": "user", "content": content}]
