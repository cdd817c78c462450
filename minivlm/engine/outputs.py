"""What a caller receives: the Output of a request, the StreamEvent of each step, the CacheHits it was served from,
and the plain-data views of the pool (KVSnapshot, BlockInfo, MemoryReport), safe to hand to another thread."""
from __future__ import annotations

from dataclasses import dataclass, field


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
    index: int = 0                       # which of the request's n choices (SamplingParams.n)
    choices: list["Output"] = field(default_factory=list)  # generate(): every choice of the request, this one first


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
    index: int = 0                       # which of the request's n choices it belongs to


@dataclass(frozen=True)
class BlockInfo:
    """One physical KV block. kind: text | image | mixed | video | free; cached = free but revivable through its
    hash."""
    block_id: int
    ref_count: int
    num_tokens: int
    block_hash: str | None
    owners: list[str]
    kind: str
    cached: bool


@dataclass
class KVSnapshot:
    """The whole KV pool at one scheduler step."""
    block_size: int
    num_blocks: int
    blocks: list[BlockInfo]
    block_tables: dict[str, list[int]]
    step: int = 0
    running: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    num_preemptions: int = 0
    cache_stats: dict[str, int] = field(default_factory=dict)
    last_event_seq: int = 0           # the event log's last seq at this moment: events(since=it) follow it
    groups: list[GroupInfo] = field(default_factory=list)  # one per KV-cache group (a plain model: one, full)


@dataclass
class GroupInfo:
    """One KV-cache group at a snapshot (snap.groups): its layers and what each request holds in it."""
    name: str
    kind: str                         # full_attention | sliding_window | recurrent | kv_shared
    layers: list[int]
    window: int | None = None
    size: int = 0                     # blocks (attention kinds) or state slots (recurrent)
    free: int = 0
    block_tables: dict[str, list] = field(default_factory=dict)  # request id -> block ids (None: left the window)
    checkpoints: dict[str, int] = field(default_factory=dict)    # recurrent: block hash -> slot of the saved state
    reads: dict[int, int] = field(default_factory=dict)  # kv_shared: each of its layers -> the layer whose K/V it reads


@dataclass
class MemoryReport:
    """What the engine really allocated (bytes)."""
    weights_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    num_blocks: int
    block_size: int
    peak_bytes: int | None
    device: str
    dtype: str
    vision_weights_bytes: int = 0
    kv_cache_tokens: int = 0
    max_concurrency: float = 0.0
    weight_copies_bytes: int = 0      # CPU fp32: dense copies of the decoder's packed weights, for gemv.c
    groups: list[dict] = field(default_factory=list)  # hybrid models: per KV-cache group, its layers, size and bytes
    checkpoint_slots: int = 0         # recurrent models: state slots kept as prefix-cache checkpoints
    checkpoint_bytes: int = 0         # their memory, within kv_cache_bytes (the VRAM calculator's checkpoint_bytes)
