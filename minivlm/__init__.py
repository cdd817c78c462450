"""minivlm: a small, readable vLLM-style engine for Qwen-VL models (paged KV, continuous batching, prefix cache)."""
import os

os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")  # must be set before torch is imported

from minivlm.config import EngineConfig  # noqa: E402
from minivlm.engine import Engine  # noqa: E402
from minivlm.core import RequestFailed  # noqa: E402
from minivlm.output import Output  # noqa: E402
from minivlm.request import CacheHit, Request, SamplingParams  # noqa: E402
from minivlm.snapshot import BlockInfo, KVSnapshot, MemoryReport, StreamEvent  # noqa: E402

__all__ = ["Engine", "EngineConfig", "Request", "SamplingParams", "Output", "CacheHit", "StreamEvent",
           "KVSnapshot", "BlockInfo", "MemoryReport", "RequestFailed"]
