"""GET /metrics read with prometheus_client's own text parser: after a known workload each counter has moved by
exactly what the responses (and the engine) say happened."""
import dataclasses
import os

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minivlm import Request, SamplingParams
from panels.holder import EXAMPLES_DIR
from tests.api_app import MODEL, QUESTION, image_message, inprocess_app


@pytest.fixture(scope="module")
def app():
    """The app served from this process, so the test can also submit requests the way the UI does."""
    with inprocess_app(num_blocks=40, cache_strategy="A") as (holder, url):
        yield holder, url, openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=120)


def scrape(url: str) -> dict[str, float]:
    """Every sample of /metrics by name (labels other than model_name and finished_reason summed away)."""
    r = httpx.get(url + "metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            key = s.name + (f"[{s.labels['finished_reason']}]" if "finished_reason" in s.labels else "")
            if "le" in s.labels:
                continue
            out[key] = out.get(key, 0) + s.value
    return out


def ask(client, name: str, **kw):
    return client.chat.completions.create(model=MODEL, temperature=0, messages=image_message(name), **kw)


def delta(after, before, name):
    return after.get(name, 0) - before.get(name, 0)


def test_vllm_metric_names_are_served(app):
    _, url, _ = app
    names = set(scrape(url))
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "minivlm:prefix_cache_false_hits_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "minivlm:encoder_cache_hits_total",
                 "minivlm:encoder_cache_misses_total", "minivlm:encoder_cache_usage_embeddings"):
        assert name in names, name


def test_counters_move_by_what_the_workload_did(app):
    """Strategy A: red circle cold, red again (true hits), then blue and (streamed) green with the same text
    (false hits: A keys image blocks by text tokens only)."""
    holder, url, client = app
    holder.get().reset_prefix_cache()
    before, encoder_before = scrape(url), holder.get().encoder_cache_stats()
    red = ask(client, "red_circle.png")
    red_again = ask(client, "red_circle.png")
    blue = ask(client, "blue_circle.png")
    chunks = list(ask(client, "green_triangle.png", stream=True, stream_options={"include_usage": True}))
    streamed = chunks[-1].usage
    after, encoder_after = scrape(url), holder.get().encoder_cache_stats()
    usages = [red.usage, red_again.usage, blue.usage, streamed]
    for what in ("hits", "misses"):  # the encoder cache's counters, as the engine counts them
        assert delta(after, before, f"minivlm:encoder_cache_{what}_total") == encoder_after[what] - encoder_before[what]
    assert encoder_after["misses"] > encoder_before["misses"]  # the cold red circle, at least, ran the tower
    assert after["minivlm:encoder_cache_usage_embeddings"] == encoder_after["used"]
    hits = sum(u.prompt_tokens_details.cached_tokens for u in usages)
    finish = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    reports = [r.model_extra["minivlm"] for r in (red, red_again, blue, finish)]
    false_blocks = sum(r["false_hit_blocks"] for r in reports)
    assert reports[1]["false_hit_blocks"] == 0 < reports[1]["cache_hit_blocks"]  # red again: true hits
    assert reports[2]["false_hit_blocks"] > 0  # blue reuses red's image blocks under A
    assert delta(after, before, "vllm:prefix_cache_hits_total") == hits
    assert delta(after, before, "minivlm:prefix_cache_false_hits_total") == false_blocks * 16
    assert delta(after, before, "vllm:prefix_cache_queries_total") == sum(u.prompt_tokens for u in usages)
    assert delta(after, before, "vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta(after, before, "vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta(after, before, "vllm:request_success_total[stop]") == 4
    assert delta(after, before, "vllm:time_to_first_token_seconds_count") == 4
    assert delta(after, before, "vllm:e2e_request_latency_seconds_count") == 4
    assert delta(after, before, "vllm:inter_token_latency_seconds_count") == \
        sum(u.completion_tokens - 1 for u in usages)
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0


def test_engine_wide_counters_include_the_uis_requests_and_preemptions(app):
    """Requests submitted to the engine directly (as the UI's tabs do) move the prefix-cache and preemption
    counters too; a 40-block pool under 8 requests of 120 tokens each must preempt."""
    holder, url, _ = app
    engine = holder.get()
    before, snap_before = scrape(url), engine.snapshot()
    path = os.path.join(EXAMPLES_DIR, "yellow_square.png")
    outs = engine.generate([Request(prompt=QUESTION, images=[path]) for _ in range(8)],
                           SamplingParams(max_tokens=120, ignore_eos=True))
    after, snap_after = scrape(url), engine.snapshot()
    preempted = snap_after.num_preemptions - snap_before.num_preemptions
    assert preempted > 0
    assert delta(after, before, "vllm:num_preemptions_total") == preempted
    assert delta(after, before, "vllm:prefix_cache_hits_total") == sum(o.num_cached_tokens for o in outs) > 0


def test_token_counters_include_the_uis_requests(app):
    """Requests that never touch the HTTP API (the UI's) count in the token and request counters too."""
    holder, url, _ = app
    before = scrape(url)
    outs = holder.get().generate([Request(prompt=QUESTION, images=[os.path.join(EXAMPLES_DIR, name)])
                                  for name in ("red_circle.png", "two_shapes.png", "blue_circle.png")],
                                 SamplingParams(max_tokens=20, ignore_eos=True))
    after = scrape(url)
    assert delta(after, before, "vllm:prompt_tokens_total") == sum(o.num_prompt_tokens for o in outs)
    assert delta(after, before, "vllm:prefix_cache_queries_total") == sum(o.num_prompt_tokens for o in outs)
    assert delta(after, before, "vllm:generation_tokens_total") == sum(len(o.token_ids) for o in outs) == 60
    assert delta(after, before, "vllm:request_success_total[length]") == 3


def test_counters_survive_an_engine_rebuild(app):
    holder, url, client = app
    ask(client, "red_circle.png")
    before = scrape(url)
    holder.load(dataclasses.replace(holder.config))
    rebuilt = scrape(url)
    for name in ("vllm:prefix_cache_hits_total", "vllm:num_preemptions_total", "vllm:prompt_tokens_total"):
        assert rebuilt[name] == before[name], name  # a new engine starts at zero; the exported total does not
    ask(client, "red_circle.png")
    again = ask(client, "red_circle.png")
    after = scrape(url)
    assert delta(after, rebuilt, "vllm:prefix_cache_hits_total") == again.usage.prompt_tokens_details.cached_tokens > 0


def test_without_an_event_log_the_api_counts_its_own_requests():
    """An engine built with event_log_size=0 has no log to read: the API layer counts the requests it serves."""
    with inprocess_app(event_log_size=0) as (_, url):
        client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=120)
        before = scrape(url)
        usages = [ask(client, name).usage for name in ("red_circle.png", "red_circle.png")]
        after = scrape(url)
    assert delta(after, before, "vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta(after, before, "vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta(after, before, "vllm:prefix_cache_hits_total") == usages[1].prompt_tokens_details.cached_tokens > 0
    assert delta(after, before, "vllm:request_success_total[stop]") == 2


def test_generation_tokens_count_sampled_tokens_and_each_prompt_once(checkpoints):
    """#25 defect 1: with chunked prefill a prompt's chunks sample nothing, so generation tokens are the tokens
    sampled, not the requests scheduled; a preempted request's second prefix lookup is not a second query."""
    from minivlm import Engine, EngineConfig
    from minivlm.api.metrics import RequestCounts
    from tests.test_parity import scene
    config = EngineConfig(model=checkpoints["qwen3_vl"], device="cpu", dtype="float32", num_blocks=12,
                          max_model_len=512, enable_chunked_prefill=True, max_num_batched_tokens=16)
    with Engine(config) as engine:
        reqs = [Request(prompt="Describe the image.", images=[scene(120, 90, (200, 30, 30))]) for _ in range(3)]
        outs = engine.generate(reqs, SamplingParams(max_tokens=40, ignore_eos=True))
        counts = RequestCounts()
        counts.read_events(engine, caching=True)
        events = engine.events()
    assert any(e.kind == "preempted" for e in events)  # some lookups happened twice
    assert counts.counts["generation_tokens"] == sum(len(o.token_ids) for o in outs) == 120
    prompt = sum(o.num_prompt_tokens for o in outs)
    assert counts.counts["source:local_compute"] + counts.counts["source:local_cache_hit"] == prompt
    assert counts.counts["queries"] == prompt
    first_hits = {}
    for e in events:
        if e.kind == "cache_lookup":
            first_hits.setdefault(e.request_id, e.num_cached_tokens)
    assert counts.counts["source:local_cache_hit"] == sum(first_hits.values()) > 0


def test_prompt_tokens_by_source_is_served(app):
    _, url, client = app
    before = scrape(url)
    first, second = ask(client, "red_circle.png", max_tokens=2), ask(client, "red_circle.png", max_tokens=2)
    after = scrape(url)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    prompt = first.usage.prompt_tokens + second.usage.prompt_tokens
    assert delta(after, before, "vllm:prompt_tokens_by_source_total") == prompt
