"""The app's one engine. Engines cannot live in gr.State (not deep-copyable), so app.py makes one holder and every
tab reads the engine from it at event time; a rebuild swaps it under a lock and closes the old one."""
import dataclasses
import gc
import os
import threading

try:  # ZeroGPU Spaces: a GPU is attached only inside functions decorated with spaces.GPU (import before torch)
    import spaces
    gpu = spaces.GPU
except ImportError:
    def gpu(fn=None, **_):
        """No-op stand-in for spaces.GPU outside Hugging Face Spaces."""
        return fn if fn is not None else (lambda f: f)

from minivlm import Engine, EngineConfig  # noqa: E402

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "examples")


def status_line(engine: Engine) -> str:
    """vLLM-style start-up line: model, device, dtype, KV cache size in tokens, max concurrency."""
    rep, cfg = engine.memory_report(), engine.config
    return (f"**{os.path.basename(cfg.model.rstrip('/')) or cfg.model}** ({engine.hf_config.model_type}) on "
            f"**{rep.device}** ({rep.dtype}) · weights {rep.weights_bytes / 2**20:,.1f} MiB · "
            f"KV cache: {rep.num_blocks:,} blocks × {rep.block_size} = **{rep.kv_cache_tokens:,} tokens** "
            f"({rep.kv_cache_bytes / 2**20:,.1f} MiB) · maximum concurrency for {cfg.max_model_len:,} tokens per "
            f"request: **{rep.max_concurrency:.2f}x** · prefix cache: {cfg.cache_strategy}")


class EngineHolder:
    """Holds the shared engine; `shared` = a public deployment (strategy C, one cache salt per session)."""

    def __init__(self, config: EngineConfig, shared: bool = False):
        self.shared = shared
        self.config = dataclasses.replace(config, cache_strategy="C") if shared else config
        self.engine: Engine | None = None
        self.status = "no engine loaded"
        self._lock = threading.Lock()

    def load(self, config: EngineConfig | None = None) -> str:
        """Replace the engine by one built for `config` (default: the current one). The old engine is closed and
        released first, so a big model's memory is free for the new one; if the build fails, the previous
        configuration is loaded again and the ValueError propagates with the engine's message."""
        config = config or self.config
        if self.shared:
            config = dataclasses.replace(config, cache_strategy="C")
        with self._lock:
            previous = self.config if self.engine is not None else None
            self._release()
            try:
                self.engine = Engine(config)
            except Exception:
                if previous is not None:
                    self.engine = Engine(previous)  # keep serving what worked
                raise
            self.config = config
            self.status = status_line(self.engine)
            return self.status

    def _release(self):
        if self.engine is not None:
            self.engine.close()  # requests still streaming on it end as aborted
            self.engine = None
            gc.collect()  # drop its weights and KV pool now, not whenever the collector runs

    def get(self) -> Engine:
        """The current engine (waits while a rebuild runs; loads the configured one on first use)."""
        with self._lock:
            if self.engine is None:
                self.engine = Engine(self.config)
                self.status = status_line(self.engine)
            return self.engine

    def salt(self, session_hash: str | None) -> str | None:
        """Per-session cache salt on shared deployments: users never share KV blocks (no timing side channel)."""
        return f"session:{session_hash}" if self.shared and session_hash else None

