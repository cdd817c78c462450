"""KVEventsConfig: vLLM's --kv-events-config, field for field, validated up front. Imports nothing heavy, so
EngineConfig can hold one without pulling in zmq."""
import json
from dataclasses import asdict, dataclass, fields

PUBLISHERS = ("zmq", "null")


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's KVEventsConfig fields and defaults; publisher None means "zmq" when events are enabled."""
    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self):
        def fail(msg):
            raise ValueError(f"kv_events: {msg}")
        if not isinstance(self.enable_kv_cache_events, bool):
            fail(f"enable_kv_cache_events must be true or false, got {self.enable_kv_cache_events!r}")
        if self.publisher is None:  # vLLM's default: zmq when enabled, else the null publisher
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        if self.publisher not in PUBLISHERS:
            fail(f"publisher must be one of {PUBLISHERS}, got {self.publisher!r}")
        for name in ("endpoint", "topic"):
            if not isinstance(getattr(self, name), str):
                fail(f"{name} must be a string, got {getattr(self, name)!r}")
        if not self.endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            fail(f"endpoint must be a ZMQ address (tcp://, ipc:// or inproc://), got {self.endpoint!r}")
        if self.replay_endpoint is not None and (not isinstance(self.replay_endpoint, str) or
                                                 not self.replay_endpoint.startswith(("tcp://", "ipc://", "inproc://"))):
            fail(f"replay_endpoint must be a ZMQ address or null, got {self.replay_endpoint!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                fail(f"{name} must be an integer >= 0, got {v!r}")
        if self.max_queue_size == 0:
            fail("max_queue_size must be at least 1")

    @property
    def active(self) -> bool:
        """Whether this config publishes anything (enabled, and not the null publisher)."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @property
    def binds(self) -> bool:
        """vLLM's rule: bind a wildcard, IPv6 or local endpoint, connect to anything else."""
        e = self.endpoint
        return "*" in e or "::" in e or e.startswith(("ipc://", "inproc://"))

    def to_dict(self) -> dict:
        return asdict(self)


def settings_dict(value, cls, what: str) -> dict:
    """A dict of a settings dataclass's fields from a dict or its JSON text (vLLM's --*-config flags), every key
    one of the dataclass's fields; a bad one raises naming `what`."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{what}: not valid JSON ({e.msg} at char {e.pos}): {value!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a dict of {cls.__name__} fields, got {type(value).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {unknown}; the fields are {sorted(known)}")
    return value


def kv_events_config(value) -> KVEventsConfig | None:
    """A KVEventsConfig from None, a KVEventsConfig, a dict of vLLM's field names, or its JSON text."""
    if value is None or isinstance(value, KVEventsConfig):
        return value
    return KVEventsConfig(**settings_dict(value, KVEventsConfig, "kv_events"))
