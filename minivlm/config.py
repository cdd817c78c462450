"""EngineConfig: every knob of the engine in one dataclass, validated up front with clear messages."""
import os
from dataclasses import dataclass, replace

from minivlm.kv_events.config import KVEventsConfig, kv_events_config, settings_dict

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "tiny-qwen-vl")
STRATEGIES = ("none", "A", "B", "C")
DEVICES = ("auto", "cuda", "mps", "cpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")
GRAMMAR_BACKENDS = ("auto", "xgrammar", "guidance")  # vLLM's structured_outputs_config.backend: the two minivlm has
# chunked prefill's default: mixed steps at most 1.3x a decode step's median. The goal is p99 ITL <= 2x steady, and a
# step's own spread (p99 / p50 about 1.3-1.4 on 2 CPU cores) multiplies it: 1.3 x 1.4 < 2 (bench/RESULTS.md, round 8)
DEFAULT_STEP_SLOWDOWN = 1.3


MTP_ALIASES = ("qwen3_next_mtp", "qwen3_5_mtp")  # vLLM's names for the MTP heads of the families minivlm runs


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's names: EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 4,
    "prompt_lookup_max": 4, "prompt_lookup_min": 1}), or {"method": "mtp", "num_speculative_tokens": k} (the model's
    own multi-token-prediction head; vLLM's family names for it, MTP_ALIASES, mean the same)."""
    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1

    @classmethod
    def parse(cls, value) -> "SpeculativeConfig | None":
        if value is None or isinstance(value, cls):
            return value
        cfg = cls(**settings_dict(value, cls, "speculative_config"))
        if cfg.method in MTP_ALIASES:  # vLLM maps its family-specific names onto "mtp" the same way
            cfg = replace(cfg, method="mtp")
        if cfg.method not in ("ngram", "mtp"):
            raise ValueError(f"speculative_config.method {cfg.method!r} is not supported: minivlm speculates with "
                             f"'ngram' (prompt lookup; no draft model) or 'mtp' (the model's own MTP head)")
        for name, lo, hi in (("num_speculative_tokens", 1, 16), ("prompt_lookup_max", 1, 32),
                             ("prompt_lookup_min", 1, 32)):
            v = getattr(cfg, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"speculative_config.{name} must be an integer in [{lo}, {hi}], got {v!r}")
        if cfg.prompt_lookup_min > cfg.prompt_lookup_max:
            raise ValueError("speculative_config.prompt_lookup_min must be <= prompt_lookup_max")
        return cfg


@dataclass
class EngineConfig:
    """Engine settings (docs/API.md describes each). num_blocks=None derives the KV pool from the memory budget."""
    model: str = DEFAULT_MODEL
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 16
    max_model_len: int = 4096
    max_num_batched_tokens: int | None = None   # tokens one step may compute (the step's token budget)
    enable_chunked_prefill: bool = False    # split long prefills into chunks mixed with the decodes of each step
    max_step_slowdown: float | None = None  # chunked: a mixed step may take this x a decode step (adaptive budget)
    cache_strategy: str = "C"
    seed: int = 0
    encoder_cache_size: int | None = None   # vLLM's name: embeddings (rows of tower output) kept cached; None: 8192
    vision_cache_bytes: int | None = None   # the same bound in bytes, converted for the loaded model (the old knob)
    async_vision: bool = False      # run the vision tower on its own thread, overlapping the running requests' steps
    max_images_per_request: int = 8
    cpu_memory_budget_bytes: int = 2 * 2**30
    event_log_size: int = 20_000    # events kept in the ring log, packed: ~800 bytes each (0 = no event log)
    kv_events: KVEventsConfig | dict | str | None = None  # vLLM's --kv-events-config (docs/KV_EVENTS.md)
    enforce_eager: bool = False     # vLLM's name: no fused C decode paths, every layer in PyTorch ops (comparisons)
    state_checkpoints: int | None = None  # recurrent models: saved states the prefix cache may reuse; None: 2 x max_num_seqs
    speculative_config: dict | str | None = None  # vLLM's: {"method": "ngram", "num_speculative_tokens": 4, ...}
    quantization: str | None = None  # vLLM's name: "int8" | "int4" weight-only, the decoder's linears (CPU)
    structured_outputs_backend: str = "auto"  # vLLM's structured_outputs_config.backend: xgrammar where installed

    def __post_init__(self):
        def positive_int(name):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"EngineConfig.{name} must be a positive integer, got {v!r}")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("EngineConfig.model must be a local checkpoint directory or a hub id")
        if self.device not in DEVICES:
            raise ValueError(f"EngineConfig.device must be one of {DEVICES}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"EngineConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.cache_strategy not in STRATEGIES:
            raise ValueError(f"EngineConfig.cache_strategy must be one of {STRATEGIES}, got {self.cache_strategy!r}")
        for name in ("block_size", "max_num_seqs", "max_model_len", "max_images_per_request"):
            positive_int(name)
        if self.num_blocks is not None:
            positive_int("num_blocks")
        if self.state_checkpoints is not None and (not isinstance(self.state_checkpoints, int) or
                                                   isinstance(self.state_checkpoints, bool) or self.state_checkpoints < 0):
            raise ValueError(f"EngineConfig.state_checkpoints must be an integer >= 0 (or None), got {self.state_checkpoints!r}")
        for name in ("encoder_cache_size", "vision_cache_bytes"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"EngineConfig.{name} must be an integer >= 0 (or None), got {v!r}")
        if self.encoder_cache_size is not None and self.vision_cache_bytes is not None:
            raise ValueError("EngineConfig: give encoder_cache_size (embeddings) or vision_cache_bytes, not both")
        if not isinstance(self.event_log_size, int) or isinstance(self.event_log_size, bool) or self.event_log_size < 0:
            raise ValueError(f"EngineConfig.event_log_size must be an integer >= 0, got {self.event_log_size!r}")
        self.kv_events = kv_events_config(self.kv_events)
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        if self.quantization not in (None, "int8", "int4"):
            raise ValueError(f"EngineConfig.quantization must be 'int8', 'int4' or None, got {self.quantization!r}")
        if self.structured_outputs_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"EngineConfig.structured_outputs_backend must be one of {GRAMMAR_BACKENDS}, got "
                             f"{self.structured_outputs_backend!r}")
        if self.kv_events is not None and self.kv_events.active and not self.event_log_size:
            raise ValueError("EngineConfig.kv_events publishes from the event log: event_log_size must be > 0")
        for name in ("enable_chunked_prefill", "async_vision", "enforce_eager"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EngineConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if self.max_num_batched_tokens is None:  # chunked: a short step, so decodes keep their pace
            if self.enable_chunked_prefill and self.max_step_slowdown is None:  # no budget pinned: measure one
                self.max_step_slowdown = DEFAULT_STEP_SLOWDOWN
            self.max_num_batched_tokens = 512 if self.enable_chunked_prefill else max(self.max_model_len, 2048)
        if self.max_step_slowdown is not None and (isinstance(self.max_step_slowdown, bool) or not isinstance(
                self.max_step_slowdown, (int, float)) or not 1 < self.max_step_slowdown <= 100):
            raise ValueError("EngineConfig.max_step_slowdown must be a number in (1, 100] (a mixed step's time over a "
                             f"decode step's), got {self.max_step_slowdown!r}")
        if self.max_step_slowdown is not None and not self.enable_chunked_prefill:
            raise ValueError("EngineConfig.max_step_slowdown sizes prefill chunks: it needs enable_chunked_prefill=True")
        positive_int("max_num_batched_tokens")
        if not isinstance(self.gpu_memory_utilization, (int, float)) or not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"EngineConfig.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.max_num_batched_tokens < self.max_model_len and not self.enable_chunked_prefill:
            raise ValueError("EngineConfig.max_num_batched_tokens must be >= max_model_len unless "
                             "enable_chunked_prefill=True (otherwise a long prompt could never be scheduled)")
