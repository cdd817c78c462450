"""GET /metrics: Prometheus text with vLLM's metric names. Engine-wide figures cover every request, the UI's and
the API's: gauges and cache counters come from engine.snapshot(), token and request counts from the engine's event
log, both read at scrape time. Latency histograms come from the same log's clock stamps (minivlm/views/timeline.py:
the numbers the Timeline tab shows), observed as each request finishes; an engine without a log has the API's own
requests timed as they stream."""
import collections
import threading
import time
import weakref

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from minivlm.views.timeline import TimelineBuilder

disable_created_metrics()  # no *_created series, as vLLM serves them

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
FINISH_REASONS = ("stop", "length", "abort", "error")
COUNTERS = (  # (metric, help, key in the totals)
    ("vllm:prompt_tokens", "Prompt tokens of requests that arrived.", "prompt_tokens"),
    ("vllm:generation_tokens", "Tokens sampled.", "generation_tokens"),
    ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "queries"),
    ("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.", "hits"),
    ("minivlm:prefix_cache_false_hits", "Prompt tokens served from the prefix cache whose KV was computed from "
                                        "different content (strategies A and B).", "false_hits"),
    ("vllm:num_preemptions", "Requests preempted (blocks freed, recomputed later).", "preemptions"))


def logs_events(engine) -> bool:
    return engine.config.event_log_size > 0


class RequestCounts:
    """Token and request counts of one engine. From its event log when it keeps one (engine.events: every
    request); an engine built with event_log_size=0 gets the API's own requests counted by add_output instead.
    Read at every scrape, so only a ring overflow between two scrapes (engine.events_dropped) could lose counts."""

    def __init__(self):
        self.since = 0
        self.counts: collections.Counter = collections.Counter()
        self.unlooked: dict[str, int] = {}  # request -> prompt tokens, until its first prefix-cache lookup
        self.timeline = TimelineBuilder()  # each request's token times, from the log's clock stamps
        self.done: list = []  # finished requests' timelines, not yet observed into the latency histograms

    def read_events(self, engine, caching: bool):
        for ev in engine.events(self.since):
            if (done := self.timeline.feed(ev)) is not None:
                self.done.append(self.timeline.requests.pop(done.request_id))
            if ev.kind == "arrived":
                self.counts["prompt_tokens"] += ev.num_prompt_tokens
                self.counts["queries"] += ev.num_prompt_tokens if caching else 0
                self.unlooked[ev.request_id] = ev.num_prompt_tokens
            elif ev.kind == "cache_lookup" and ev.request_id in self.unlooked:  # once per request: a preempted
                prompt = self.unlooked.pop(ev.request_id)                      # one's second lookup is no new query
                self.counts["source:local_cache_hit"] += ev.num_cached_tokens
                self.counts["source:local_compute"] += prompt - ev.num_cached_tokens
            elif ev.kind == "scheduled":  # a prefill chunk that does not end its prompt samples nothing
                self.counts["generation_tokens"] += len(ev.fields.get("sampling", ev.request_ids))
            elif ev.kind == "speculated":  # accepted guesses: tokens beyond the one its step samples anyway
                self.counts["generation_tokens"] += ev.accepted
            elif ev.kind == "finished":
                self.counts[f"success:{ev.finish_reason}"] += 1
            self.since = ev.seq
        self.timeline.steps.clear()  # only the requests' token times are kept between scrapes

    def add_output(self, out, caching: bool):
        self.counts["prompt_tokens"] += out.num_prompt_tokens
        self.counts["queries"] += out.num_prompt_tokens if caching else 0
        self.counts["generation_tokens"] += len(out.token_ids)
        self.counts[f"success:{out.finish_reason}"] += 1
        self.counts["source:local_cache_hit"] += out.num_cached_tokens
        self.counts["source:local_compute"] += out.num_prompt_tokens - out.num_cached_tokens


class EngineCollector:
    """Gauges and lifetime counters of the serving engine, read at scrape time. Counters continue across engine
    rebuilds: when the app swaps engines, the old engine's last-scraped totals become the base the new one adds to."""

    def __init__(self, get_engine, model_name):
        self.get_engine, self.model_name = get_engine, model_name
        self.lock = threading.Lock()
        self.engine_ref, self.counts = None, RequestCounts()
        self.base: collections.Counter = collections.Counter()
        self.last: collections.Counter = collections.Counter()

    def _follow(self, engine):
        """Under the lock: start counting a newly serving engine on top of the totals so far."""
        if self.engine_ref is None or self.engine_ref() is not engine:
            self.base += self.last
            self.last = collections.Counter()
            self.engine_ref, self.counts = weakref.ref(engine), RequestCounts()

    def finished_requests(self, engine) -> list:
        """Requests that finished since the last call, with their token times (engines that keep an event log)."""
        with self.lock:
            self._follow(engine)
            if not logs_events(engine):
                return []
            self.counts.read_events(engine, engine.config.cache_strategy != "none")
            done, self.counts.done = self.counts.done, []
            return done

    def counts_for(self, engine) -> RequestCounts:
        with self.lock:
            self._follow(engine)
            return self.counts

    def totals(self, engine, snap) -> dict[str, float]:
        """Lifetime counters of the serving process (prefix-cache figures in tokens, as vLLM counts them)."""
        st, bs = snap.cache_stats or {}, snap.block_size
        with self.lock:
            self._follow(engine)
            if logs_events(engine):
                self.counts.read_events(engine, engine.config.cache_strategy != "none")
            now = collections.Counter({"preemptions": snap.num_preemptions, "hits": st.get("hits", 0) * bs,
                                       "false_hits": st.get("false_hits", 0) * bs, **self.counts.counts})
            self.last = now
            return {k: now[k] + self.base[k] for k in set(now) | set(self.base)}

    def collect(self):
        engine = self.get_engine()
        snap = engine.snapshot()
        total = collections.defaultdict(float, self.totals(engine, snap))
        labels, name = ["model_name"], [self.model_name(engine)]
        used = sum(b.ref_count > 0 for b in snap.blocks)
        for metric, doc, value in (
                ("vllm:num_requests_running", "Requests in the running batch.", len(snap.running)),
                ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", len(snap.waiting)),
                ("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).", used / snap.num_blocks)):
            g = GaugeMetricFamily(metric, doc, labels=labels)
            g.add_metric(name, value)
            yield g
        for metric, doc, key in COUNTERS:
            c = CounterMetricFamily(metric, doc, labels=labels)
            c.add_metric(name, total[key])
            yield c
        c = CounterMetricFamily("vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from.",
                                labels=labels + ["source"])
        for source in ("local_compute", "local_cache_hit"):
            c.add_metric(name + [source], total[f"source:{source}"])
        yield c
        yield from kv_events_metrics(engine, labels, name)
        yield from spec_decode_metrics(engine, labels, name)
        yield from encoder_cache_metrics(engine, labels, name)
        c = CounterMetricFamily("vllm:request_success", "Finished requests by finish reason.",
                                labels=labels + ["finished_reason"])
        for reason in FINISH_REASONS:
            c.add_metric(name + [reason], total[f"success:{reason}"])
        yield c


def encoder_cache_metrics(engine, labels, name):
    """The encoder cache's hits and misses (one per image whose request took its images; vLLM exports no such
    metric, hence minivlm's prefix) and the embeddings it holds, per engine (from 0 when the app rebuilds it)."""
    stats = engine.encoder_cache_stats() if hasattr(engine, "encoder_cache_stats") else None
    if stats is None:
        return
    for what in ("hits", "misses"):
        c = CounterMetricFamily(f"minivlm:encoder_cache_{what}", f"Images whose vision-tower output was "
                                f"{'found in' if what == 'hits' else 'not in'} the encoder cache.", labels=labels)
        c.add_metric(name, stats[what])
        yield c
    g = GaugeMetricFamily("minivlm:encoder_cache_usage_embeddings", "Embeddings (rows of vision-tower output) the "
                          "encoder cache holds, in use or cached.", labels=labels)
    g.add_metric(name, stats["used"])
    yield g


def spec_decode_metrics(engine, labels, name):
    """vLLM's speculative-decoding counters, when the engine speculates (engine/spec_decode/ngram.py): speculating steps of
    a request (drafts), guessed tokens, accepted ones, and accepted ones per draft position."""
    stats = engine.spec_decode_stats() if hasattr(engine, "spec_decode_stats") else None
    if stats is None:
        return
    for key, doc in (("num_drafts", "Speculating steps of a request."), ("num_draft_tokens", "Draft tokens proposed."),
                     ("num_accepted_tokens", "Draft tokens accepted.")):
        c = CounterMetricFamily(f"vllm:spec_decode_{key}", doc, labels=labels)
        c.add_metric(name, getattr(stats, key))
        yield c
    c = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted, by their position "
                            "in the draft.", labels=labels + ["position"])
    for pos, n in enumerate(stats.accepted_per_pos):
        c.add_metric(name + [str(pos)], n)
    yield c


def kv_events_metrics(engine, labels, name):
    """The KV-event publisher's counters, when the engine publishes (docs/KV_EVENTS.md): batches sent, and
    batches dropped at a full send queue or at a subscriber's high-water mark."""
    stats = engine.kv_events_stats() if hasattr(engine, "kv_events_stats") else None
    if stats is None:
        return
    c = CounterMetricFamily("minivlm:kv_events_batches", "KV-event batches published.", labels=labels)
    c.add_metric(name, stats.get("batches", 0))
    yield c
    c = CounterMetricFamily("minivlm:kv_events_dropped", "KV-event batches dropped (queue: the send queue was "
                            "full; hwm: a subscriber was at the high-water mark).", labels=labels + ["reason"])
    for reason in ("queue", "hwm"):
        c.add_metric(name + [reason], stats.get(f"dropped_{reason}", 0))
    yield c


class ApiMetrics:
    """The /metrics registry: the engine's figures and vLLM's latency histograms."""

    def __init__(self, get_engine, model_name):
        self.get_engine, self.model_name = get_engine, model_name
        self.registry = CollectorRegistry()
        self.engine_stats = EngineCollector(get_engine, model_name)
        self.registry.register(self.engine_stats)
        labels, r = ["model_name"], self.registry
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time from arrival to the first token.", labels,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a request.",
                             labels, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token.", labels,
                             buckets=E2E_BUCKETS, registry=r)

    def exposition(self) -> bytes:
        engine = self.get_engine()
        name = self.model_name(engine)
        for metric in (self.ttft, self.itl, self.e2e):
            metric.labels(name)  # every series exists (at 0) from the first scrape
        for r in self.engine_stats.finished_requests(engine):  # every request of the engine, as vLLM's
            self.observe(name, r.token_times, r.arrived)
        return generate_latest(self.registry)

    def finished(self, engine, out, token_times: list[float], arrival: float):
        """Record one finished API request for an engine that keeps no event log: its tokens, and its latencies
        from the time each token arrived (an engine with a log has every request's read from it at scrape time)."""
        if not logs_events(engine):
            self.engine_stats.counts_for(engine).add_output(out, engine.config.cache_strategy != "none")
            self.observe(self.model_name(engine), token_times, arrival)

    def observe(self, name: str, token_times: list[float], arrival: float):
        if token_times:
            self.ttft.labels(name).observe(token_times[0] - arrival)
            for a, b in zip(token_times, token_times[1:]):
                self.itl.labels(name).observe(b - a)
            self.e2e.labels(name).observe(token_times[-1] - arrival)


def now() -> float:
    return time.perf_counter()
