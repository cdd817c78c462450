"""GET /metrics: Prometheus text with vLLM's metric names. Engine-wide state and counters (every request, UI and
API) are read from the serving engine at scrape time; latencies are measured per API request as it streams."""
import threading
import time
import weakref

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()  # no *_created series, as vLLM serves them

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


class EngineCollector:
    """Gauges and lifetime counters from engine.snapshot(). Counters continue across engine rebuilds: when the
    app swaps engines, the old engine's last-scraped totals become the base the new engine's counts add to."""

    def __init__(self, get_engine, model_name):
        self.get_engine, self.model_name = get_engine, model_name
        self.lock = threading.Lock()
        self.engine_ref = None
        self.base: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def totals(self, engine, snap) -> dict[str, float]:
        """Lifetime counters of the serving process (prefix-cache figures in tokens, as vLLM counts them)."""
        st, bs = snap.cache_stats or {}, snap.block_size
        now = {"preemptions": snap.num_preemptions, "hits": st.get("hits", 0) * bs,
               "false_hits": st.get("false_hits", 0) * bs, "lookups": st.get("lookups", 0)}
        with self.lock:
            if self.engine_ref is None or self.engine_ref() is not engine:
                for k, v in self.last.items():
                    self.base[k] = self.base.get(k, 0) + v
                self.engine_ref = weakref.ref(engine)
            self.last = now
            return {k: v + self.base.get(k, 0) for k, v in now.items()}

    def collect(self):
        engine = self.get_engine()
        snap = engine.snapshot()
        total = self.totals(engine, snap)
        labels, name = ["model_name"], [self.model_name(engine)]
        used = sum(b.ref_count > 0 for b in snap.blocks)
        for metric, doc, value in (
                ("vllm:num_requests_running", "Requests in the running batch.", len(snap.running)),
                ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", len(snap.waiting)),
                ("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).", used / snap.num_blocks)):
            g = GaugeMetricFamily(metric, doc, labels=labels)
            g.add_metric(name, value)
            yield g
        for metric, doc, key in (
                ("vllm:num_preemptions", "Requests preempted (blocks freed, recomputed later).", "preemptions"),
                ("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.", "hits"),
                ("minivlm:prefix_cache_false_hits", "Prompt tokens served from the prefix cache whose KV was "
                                                    "computed from different content (strategies A and B).",
                 "false_hits"),
                ("minivlm:prefix_cache_lookups", "Requests looked up in the prefix cache.", "lookups")):
            c = CounterMetricFamily(metric, doc, labels=labels)
            c.add_metric(name, total[key])
            yield c


class ApiMetrics:
    """The /metrics registry: engine-wide figures plus per-request token counts and latencies."""

    def __init__(self, get_engine, model_name):
        self.get_engine, self.model_name = get_engine, model_name
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(get_engine, model_name))
        labels, r = ["model_name"], self.registry
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", labels, registry=r)
        self.queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", labels,
                               registry=r)
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               labels + ["finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time from arrival to the first token.", labels,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a request.",
                             labels, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token.", labels,
                             buckets=E2E_BUCKETS, registry=r)

    def exposition(self) -> bytes:
        name = self.model_name(self.get_engine())
        for metric in (self.prompt_tokens, self.generation_tokens, self.queries, self.ttft, self.itl, self.e2e):
            metric.labels(name)  # every series exists (at 0) from the first scrape
        for reason in ("stop", "length"):
            self.success.labels(name, reason)
        return generate_latest(self.registry)

    def finished(self, engine, out, token_times: list[float], arrival: float):
        """Record one finished API request: its tokens and, from the time each token arrived, its latencies."""
        name = self.model_name(engine)
        self.prompt_tokens.labels(name).inc(out.num_prompt_tokens)
        self.generation_tokens.labels(name).inc(len(out.token_ids))
        if engine.config.cache_strategy != "none":
            self.queries.labels(name).inc(out.num_prompt_tokens)
        self.success.labels(name, out.finish_reason).inc()
        if token_times:
            self.ttft.labels(name).observe(token_times[0] - arrival)
            for a, b in zip(token_times, token_times[1:]):
                self.itl.labels(name).observe(b - a)
            self.e2e.labels(name).observe(token_times[-1] - arrival)


def now() -> float:
    return time.perf_counter()
