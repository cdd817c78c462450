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


MAX_N = 16  # choices one request may ask for (each is a request of its own inside the engine)


@dataclass
class StructuredOutputsParams:
    """Constrain the answer (vLLM's names), exactly one of: a JSON Schema (dict or JSON text), any JSON object, a
    regex, a choice among strings, or an EBNF grammar in the `root ::= ...` form (engine/sampling/structured_output.py)."""
    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def __post_init__(self):
        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] * bool(self.json_object)
        if len(given) != 1:
            raise Refused("invalid_value", "structured_outputs takes exactly one of json, json_object, regex, choice, "
                          "grammar; got {given}", param="structured_outputs", given=", ".join(given) or "none")
        for name, kinds in (("regex", str), ("grammar", str), ("json", (dict, str))):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), kinds):
                raise _bad(f"structured_outputs.{name}", "a string" if kinds is str else "a JSON Schema (dict or "
                           "JSON text)", getattr(self, name))
        if self.choice is not None and (not isinstance(self.choice, list) or not self.choice
                                        or not all(isinstance(c, str) and c for c in self.choice)):
            raise _bad("structured_outputs.choice", "a non-empty list of non-empty strings", self.choice)


@dataclass
class SamplingParams:
    """How to pick tokens: temperature 0 is greedy; logprobs=k reports the top-k (plus the sampled token); n
    choices; OpenAI's presence / frequency penalties and logit_bias, vLLM's repetition_penalty; structured_outputs
    constrains the answer to a grammar."""
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] | str | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    n: int = 1
    presence_penalty: float = 0.0     # subtracted once from every token the answer already holds
    frequency_penalty: float = 0.0    # subtracted per occurrence in the answer
    repetition_penalty: float = 1.0   # vLLM's: divides positive logits (multiplies negative) of prompt + answer tokens
    logit_bias: dict[int, float] | None = None
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self):
        if not isinstance(self.n, int) or isinstance(self.n, bool) or not 1 <= self.n <= MAX_N:
            raise _bad("n", f"an integer in [1, {MAX_N}]", self.n)
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not -2 <= v <= 2:
                raise _bad(name, "a number in [-2, 2]", v)
        if not isinstance(self.repetition_penalty, (int, float)) or not 0 < self.repetition_penalty <= 10:
            raise _bad("repetition_penalty", "a number in (0, 10]", self.repetition_penalty)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                    isinstance(k, int) and k >= 0 and isinstance(v, (int, float)) and -100 <= v <= 100
                    for k, v in self.logit_bias.items()):
                raise _bad("logit_bias", "a map of token ids to numbers in [-100, 100]", self.logit_bias)
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise _bad("structured_outputs", "a StructuredOutputsParams", self.structured_outputs)
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
    tools: list[dict] | None = None  # OpenAI tool objects, for a chat template that writes them into the prompt

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
