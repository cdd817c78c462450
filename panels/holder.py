"""The app's one engine. Engines cannot live in gr.State (not deep-copyable), so app.py makes one holder and every
tab reads the engine from it at event time; a rebuild swaps it under a lock and closes the old one."""
import dataclasses
import gc
import hmac
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
from minivlm import resolve_model_dir  # noqa: E402

from panels.i18n import EN, t  # noqa: E402
from panels.i18n.errors import localize_status  # noqa: E402
from panels.sessions import Sessions  # noqa: E402

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "examples")
OPERATOR_TOKEN_ENV = "MINIVLM_ADMIN_TOKEN"  # on a shared deployment, whoever knows it may reconfigure the engine


def status_line(engine: Engine, lang: str = EN) -> str:
    """vLLM-style start-up line: model, device, dtype, KV cache size in tokens, max concurrency; for a hybrid model
    also what each KV-cache group holds; speculative decoding and its method when it is on."""
    rep, cfg = engine.memory_report(), engine.config
    line = t(lang, "header.status_line", model=os.path.basename(cfg.model.rstrip('/')) or cfg.model,
             model_type=engine.hf_config.model_type, device=rep.device,
             dtype=rep.dtype + ("; " + localize_status(engine.dtype_reason, lang) if engine.dtype_reason else ""),
             weights_mib=f"{rep.weights_bytes / 2**20:,.1f}", blocks=f"{rep.num_blocks:,}", block_size=rep.block_size,
             tokens=f"{rep.kv_cache_tokens:,}", kv_mib=f"{rep.kv_cache_bytes / 2**20:,.1f}",
             groups=groups_part(rep.groups, cfg.max_num_seqs, lang),
             max_len=f"{cfg.max_model_len:,}", concurrency=f"{rep.max_concurrency:.2f}", strategy=cfg.cache_strategy,
             attention=localize_status(engine.attention_backend, lang),
             linear=localize_status(engine.linear_backend, lang),
             decode=localize_status(engine.decode_backend, lang) + (
                 "; " + localize_status(engine.calibration, lang) if engine.calibration else ""))
    return line + speculation_part(cfg.speculative_config, lang)


def speculation_part(spec, lang: str = EN) -> str:
    """What speculative decoding does, for the status line (EngineConfig.speculative_config); "" when it is off."""
    if spec is None:
        return ""
    if spec.method == "mtp":  # the model's own head drafts: no lookup window to name
        return t(lang, "header.speculation_mtp", k=spec.num_speculative_tokens)
    low, high = spec.prompt_lookup_min, spec.prompt_lookup_max
    return t(lang, "header.speculation", method=spec.method, k=spec.num_speculative_tokens,
             lookup=f"{low}–{high}" if high > low else str(low))


def layer_ranges(layers: list[int]) -> str:
    """Decoder layer indices as runs: [0, 1, 2, 4, 5, 6] -> "0–2, 4–6"."""
    runs: list[list[int]] = []
    for i in sorted(layers):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}–{b}" if b > a + 1 else f"{a}, {b}" if b > a else str(a) for a, b in runs)


def shared_reads(reads: dict) -> str:
    """A kv_shared group's {layer: source layer} as "6–8 → 5, 9 → 4"."""
    by_source: dict[int, list[int]] = {}
    for layer, source in sorted(reads.items()):
        by_source.setdefault(source, []).append(layer)
    return ", ".join(f"{layer_ranges(layers)} → {source}" for source, layers in by_source.items())


def groups_part(groups: list[dict], max_num_seqs: int, lang: str = EN) -> str:
    """What each KV-cache group of a hybrid model holds (memory_report().groups), for the status line; "" for a model
    whose every layer attends fully (one group: its line says it all)."""
    if len(groups) < 2:
        return ""
    parts = []
    for g in groups:
        common = dict(layers=layer_ranges(g["layers"]), s="s" if len(g["layers"]) > 1 else "", size=f"{g['size']:,}",
                      mib=f"{g['bytes'] / 2**20:,.1f}")
        if g["kind"] == "recurrent":  # one running slot per request, the rest keep prefix-cache checkpoints
            running = min(max_num_seqs, g["size"])
            parts.append(t(lang, "header.group_recurrent", running=f"{running:,}",
                           checkpoints=f"{g['size'] - running:,}", **common))
        elif g["kind"] == "sliding_window":
            parts.append(t(lang, "header.group_sliding", window=f"{g['window']:,}", **common))
        elif g["kind"] == "kv_shared":  # Gemma 4: layers that read another layer's K/V, at 0 bytes
            parts.append(t(lang, "header.group_shared", reads=shared_reads(g["reads"]), **common))
        else:
            parts.append(t(lang, "header.group_full", **common))
    return t(lang, "header.groups", groups=t(lang, "plan.sep").join(parts))


class EngineHolder:
    """Holds the shared engine; `shared` = a public deployment (strategy C, one cache salt per session, and only
    the operator, who knows `operator_token`, may reconfigure the engine)."""

    def __init__(self, config: EngineConfig, shared: bool = False, operator_token: str | None = None):
        self.shared = shared
        self.operator_token = operator_token or None
        self.config = dataclasses.replace(config, cache_strategy="C") if shared else config
        self.engine: Engine | None = None
        self.status = t(EN, "header.no_engine")
        self.builds = 0  # engines built so far (a rebuild is one more)
        self._lock = threading.Lock()
        self.sessions = Sessions()  # what each session holds, released once it is idle (panels/sessions.py)

    def load(self, config: EngineConfig | None = None) -> str:
        """Replace the engine by one built for `config` (default: the current one). The old engine is closed and
        released first, so a big model's memory is free for the new one; if the build fails, the previous
        configuration is loaded again and a ValueError says why and that the prefix cache starts empty. A model that
        cannot be found or fetched fails before anything is released: the old engine and its cache keep serving."""
        config = config or self.config
        if self.shared:
            config = dataclasses.replace(config, cache_strategy="C")
        resolve_model_dir(config.model)  # download (or fail) while the old engine still serves
        with self._lock:
            previous = self.config if self.engine is not None else None
            self._release()
            try:
                self.engine = Engine(config)
                self.builds += 1
            except Exception as e:
                if previous is None:
                    raise
                self.engine = Engine(previous)  # keep serving what worked
                self.builds += 1
                self.status = status_line(self.engine)
                raise ValueError(f"{e} · the previous settings were loaded again; their prefix cache starts "
                                 "empty") from e
            self.config = config
            self.status = status_line(self.engine)
            return self.status

    def _release(self):
        if self.engine is not None:
            old, self.engine = self.engine, None  # first: whoever sees its requests end sees it is gone
            old.close()  # requests still streaming on it end as aborted
            del old
            gc.collect()  # drop its weights and KV pool now, not whenever the collector runs

    def get(self) -> Engine:
        """The current engine (waits while a rebuild runs; loads the configured one on first use)."""
        with self._lock:
            if self.engine is None:
                self.engine = Engine(self.config)
                self.builds += 1
                self.status = status_line(self.engine)
            return self.engine

    def status_in(self, lang: str = EN) -> str:
        """The status line in `lang` (the engine's, or what went wrong: that stays as it was written)."""
        engine = self.engine
        if lang == EN:
            return self.status
        return status_line(engine, lang) if engine is not None else t(lang, "header.no_engine")

    def rebuild_cost(self, lang: str = EN) -> str:
        """What a rebuild would end now, in words (said next to the settings before anyone changes one)."""
        engine = self.engine
        if engine is None:
            return t(lang, "header.cost_first")
        snap = engine.snapshot()
        active = len(set(snap.running) | set(snap.waiting))
        cached = len(engine.prefix_tree())  # the blocks a lookup finds, in use or free: the KV tab's tree counts them
        requests = t(lang, "header.cost_running", n=active, s="s" if active != 1 else "") if active \
            else t(lang, "header.cost_none")
        blocks = t(lang, "header.cost_cached", n=cached, s="s" if cached != 1 else "") if cached \
            else t(lang, "header.cost_nothing")
        return t(lang, "header.cost_line", requests=requests, blocks=blocks)

    def refusal(self, token: str | None, lang: str = EN) -> str | None:
        """Why this caller may not reconfigure the engine (None: they may). Checked on the server for every
        reconfiguring call, since a shared app's API is reachable without its page."""
        if not self.shared:
            return None
        if self.operator_token and token and hmac.compare_digest(token.encode(), self.operator_token.encode()):
            return None
        how = t(lang, "header.how_token" if self.operator_token else "header.how_restart", env=OPERATOR_TOKEN_ENV)
        return t(lang, "header.shared_refusal", how=how)

    def salt(self, session_hash: str | None) -> str | None:
        """Per-session cache salt on shared deployments: users never share KV blocks (no timing side channel)."""
        return f"session:{session_hash}" if self.shared and session_hash else None

