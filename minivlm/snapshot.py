"""Plain-data views of the engine (safe to hand to another thread): KV block map, stream events, memory."""
from dataclasses import dataclass, field

from minivlm.request import Output


@dataclass
class BlockInfo:
    """One physical KV block. kind: text | image | mixed | free; cached = free but revivable through its hash."""
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


@dataclass
class StreamEvent:
    """One scheduler step as seen by one request: new text, whether it finished, and the KV pool then."""
    request_id: str
    delta: str
    text: str
    finished: bool
    snapshot: KVSnapshot | None
    output: Output | None = None


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
