"""minivlm: a small, readable vLLM-style inference engine for vision-language models in Hugging Face format
(Qwen2/2.5/3-VL, SmolVLM2 / Idefics3, InternVL3 / 3.5, text-only Qwen2 / Qwen3): a paged KV cache, continuous
batching with preemption, chunked prefill, streaming and a multimodal-safe prefix cache. docs/ENGINE.md is the map;
the names below are the public API (docs/API.md)."""
import os

os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")  # must be set before torch is imported

from minivlm.config import EngineConfig  # noqa: E402
from minivlm.engine import Engine  # noqa: E402
from minivlm.engine.handle import RequestHandle  # noqa: E402
from minivlm.engine.step_result import RequestFailed  # noqa: E402
from minivlm.engine.outputs import CacheHit, Output, StreamEvent  # noqa: E402
from minivlm.engine.request import Request, SamplingParams, StructuredOutputsParams  # noqa: E402
from minivlm.engine.outputs import BlockInfo, KVSnapshot, MemoryReport  # noqa: E402
from minivlm.device import available_devices  # noqa: E402
from minivlm.loader import resolve_model_dir  # noqa: E402
from minivlm.inputs.images import load_image  # noqa: E402
from minivlm.inputs.prompt import split_images  # noqa: E402
from minivlm.refusals import EngineClosed, Refused  # noqa: E402

__all__ = ["Engine", "EngineConfig", "Request", "SamplingParams", "StructuredOutputsParams", "Output", "CacheHit", "StreamEvent",
           "KVSnapshot", "BlockInfo", "MemoryReport", "RequestFailed", "available_devices", "resolve_model_dir",
           "load_image", "split_images", "Refused", "EngineClosed", "RequestHandle"]
