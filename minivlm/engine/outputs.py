"""What a caller receives: the Output of a request, the StreamEvent of each step, the CacheHits it was served from."""
from dataclasses import dataclass, field

from minivlm.views.snapshot import KVSnapshot


@dataclass
class CacheHit:
    """One prompt block served from the prefix cache; false_hit = its content differs from what we'd compute."""
    block_id: int
    logical_index: int
    false_hit: bool


@dataclass
class Output:
    """The result of one request."""
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None            # "stop" | "length" | "abort"
    num_prompt_tokens: int
    num_cached_tokens: int = 0
    cache_hits: list[CacheHit] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    notes: list[str] = field(default_factory=list)  # what was done to the input, e.g. "converted CMYK image to RGB"


@dataclass
class StreamEvent:
    """One scheduler step as seen by one request: new text, whether it finished, and the KV pool then; token_ids
    and logprobs are the step's sampled token and its {token: logprob} (when SamplingParams.logprobs asked)."""
    request_id: str
    delta: str
    text: str
    finished: bool
    snapshot: KVSnapshot | None
    output: Output | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
