"""/metrics' latency histograms (vLLM's names) hold exactly the timeline's numbers for the same requests: API
requests and a UI-style request on one engine, the histograms scraped before and after, every bucket and sum
compared with the latencies minivlm.views.timeline computes from the engine's events over the same window."""
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.api import create_router
from minivlm.api.metrics import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS
from minivlm.views.timeline import histogram, timeline
from tests.api_app import MODEL, QUESTION, image_message

HISTOGRAMS = {"vllm:time_to_first_token_seconds": TTFT_BUCKETS, "vllm:inter_token_latency_seconds": ITL_BUCKETS,
              "vllm:e2e_request_latency_seconds": E2E_BUCKETS}


def scrape(client) -> dict[str, tuple[list[float], float]]:
    """name -> (cumulative bucket counts, +Inf last; sum)."""
    out = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name in HISTOGRAMS:
            buckets = [s.value for s in family.samples if s.name.endswith("_bucket")]
            total = next(s.value for s in family.samples if s.name.endswith("_sum"))
            out[family.name] = (buckets, total)
    return out


@pytest.fixture(scope="module")
def served():
    with Engine(EngineConfig(device="cpu", dtype="float32", num_blocks=96, max_model_len=1024)) as engine:
        app = FastAPI()
        app.include_router(create_router(lambda: engine))
        with TestClient(app) as client:
            yield engine, client


def test_metrics_histograms_equal_the_timeline_of_the_same_requests(served):
    engine, client = served
    before, since = scrape(client), engine.snapshot().last_event_seq
    for name in ("red_circle.png", "two_shapes.png"):
        r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": image_message(name),
                                                       "max_tokens": 6, "temperature": 0})
        assert r.status_code == 200, r.text
    engine.generate([Request(prompt=QUESTION), Request(prompt="Say something longer, please.")],
                    SamplingParams(max_tokens=9, ignore_eos=True))  # the UI's way in: no HTTP layer
    after = scrape(client)
    tl = timeline(engine.events(since))
    reqs = list(tl.requests.values())
    assert len(reqs) == 4 and all(r.finished is not None for r in reqs)
    values = {"vllm:time_to_first_token_seconds": [r.ttft for r in reqs],
              "vllm:inter_token_latency_seconds": [g for r in reqs for g in r.itl],
              "vllm:e2e_request_latency_seconds": [r.e2e for r in reqs]}
    assert len(values["vllm:inter_token_latency_seconds"]) == sum(len(r.token_times) - 1 for r in reqs) >= 16
    for name, buckets in HISTOGRAMS.items():
        counts = [a - b for a, b in zip(after[name][0], before.get(name, ([0] * (len(buckets) + 1), 0))[0])]
        assert counts == histogram(values[name], buckets), name
        assert after[name][1] - before.get(name, (None, 0))[1] == pytest.approx(sum(values[name]), rel=1e-9), name
    summary = tl.summary()  # the timeline's own mean is the histogram's sum over its count
    ttft = after["vllm:time_to_first_token_seconds"]
    assert summary["ttft"]["mean"] == pytest.approx((ttft[1] - before.get("vllm:time_to_first_token_seconds",
                                                                          (None, 0))[1]) / 4)
