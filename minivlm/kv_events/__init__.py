"""KV-cache events on the wire in vLLM's format: the publisher (ZMQ PUB + replay ROUTER) and the decoders and
watcher that read vLLM's, SGLang's and minivlm's streams. docs/KV_EVENTS.md is the reference."""
from minivlm.kv_events.config import KVEventsConfig, kv_events_config

__all__ = ["KVEventsConfig", "kv_events_config"]
