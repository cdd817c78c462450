"""The step plan (#25): EngineCore.update is the only writer of request progress, the `scheduled` event carries the
very plan that drove its step, the snapshots of a run rebuild from the plans (no cache_lookup / allocated events),
and the plan's one-line view agrees with the block manager's own decisions."""
import dataclasses
import sys

import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.views.events import describe_plan, replay
from minivlm.experiments.mm_cache import GREEN, Q, RED, shape_image
from minivlm.engine.outputs import CacheHit
from minivlm.engine.scheduling.plan import StepPlan
from minivlm.engine.kv_cache.prefix_keys import extend_keys
from minivlm.engine.sequence import GUARDED, Sequence, StateWriteError

LONG = SamplingParams(max_tokens=30, ignore_eos=True)


def chunked_engine(path):
    """A tight pool (preemption), chunked prefill with a small budget (mixed steps) and prefix caching (hits)."""
    return Engine(EngineConfig(model=path, num_blocks=22, block_size=8, max_model_len=512, cache_strategy="C",
                               enable_chunked_prefill=True, max_num_batched_tokens=13))


def workload(engine):
    engine.generate(Request(prompt=Q, images=[shape_image(RED)], request_id="warm"), SamplingParams(max_tokens=4))
    reqs = [Request(prompt=Q, images=[shape_image(RED)], request_id="again")] + [
        Request(prompt=f"Describe the scene {i}.", images=[shape_image(GREEN, size=(96 + 16 * i, 96))],
                request_id=f"load-{i}") for i in range(4)]
    for n, _ in enumerate(engine.stream_many(reqs, LONG)):
        if n == 20:
            engine.abort("load-3")


def test_request_progress_is_written_only_inside_update(checkpoints, monkeypatch):
    writes = []  # (field, written inside update) for every guarded write to an admitted request
    real = Sequence.__setattr__

    def recording(self, name, value):
        real(self, name, value)  # raises for a write the guard refuses
        if name in GUARDED and self.sealed:
            writes.append((name, any(sys._getframe(k).f_code.co_name == "update" for k in range(1, 4))))
    monkeypatch.setattr(Sequence, "__setattr__", recording)
    caught = []
    with chunked_engine(checkpoints["qwen3_vl"]) as engine:
        def poke(core):  # between steps, every sealed request refuses a write from outside update
            for seq in list(core.live.values())[:1]:
                for attempt in (lambda: setattr(seq, "num_computed", 0), lambda: seq.append_token(7),
                                lambda: extend_keys(seq, 8, "C", "m", "float32")):
                    with pytest.raises(StateWriteError, match=seq.request_id):
                        attempt()
                    caught.append(seq.seq_id)
        engine.core.after_step = poke
        workload(engine)
        events = engine.events()
    assert caught, "the run had live requests between steps"
    assert not [e for e in events if e.kind == "finished" and e.finish_reason == "error"]
    assert {"preempted", "BlockStored"} <= {e.kind for e in events}
    assert any(e.kind == "cache_lookup" and e.hits for e in events)
    assert {"num_computed", "cache_hits"} <= {name for name, _ in writes}
    assert all(inside for _, inside in writes), [w for w in writes if not w[1]][:5]


def test_the_log_carries_the_plan_that_drove_each_step_and_replays_from_plans_alone(checkpoints):
    plans, mismatches = {}, []
    with chunked_engine(checkpoints["qwen3_vl"]) as engine:
        def check(core):
            plan = core.last_plan
            if plan is not None and plan.step == core.step_count:
                plans[plan.step] = plan
            # the log without the block manager's allocation events: tables and fills come from the plans
            log = [e for e in core.events.since(0) if e.kind not in ("cache_lookup", "allocated")]
            rebuilt = replay([e if e.kind != "scheduled" else dataclasses.replace(e, fields={"plan": e.plan})
                              for e in log], core.num_blocks, 8)
            snap = core.snapshot()
            for field in ("blocks", "block_tables", "running", "waiting", "step"):
                if getattr(rebuilt, field) != getattr(snap, field):
                    mismatches.append((core.step_count, field))
        engine.core.after_step = check
        workload(engine)
        events = engine.events()
    assert not mismatches, mismatches[:5]
    scheduled = {e.step: e for e in events if e.kind == "scheduled"}
    assert set(scheduled) == set(plans) and "mixed" in {p.kind for p in plans.values()}
    for step, plan in plans.items():
        assert scheduled[step].plan == plan.to_dict() and scheduled[step].step_kind == plan.kind
        assert scheduled[step].num_scheduled_tokens == {r.request_id: r.num_tokens for r in plan}
    for ev in (e for e in events if e.kind == "preempted"):
        assert any(p.request_id == ev.request_id and p.needed_by == ev.needed_by for p in plans[ev.step].preemptions)


def test_plan_agrees_with_the_block_managers_decisions_and_says_them(checkpoints):
    with chunked_engine(checkpoints["qwen3_vl"]) as engine:
        workload(engine)
        events = engine.events()
    for ev in (e for e in events if e.kind == "scheduled"):
        same_step = [e for e in events if e.step == ev.step]
        for r in ev.plan:
            rid = r["request_id"]
            lookups = [e for e in same_step if e.kind == "cache_lookup" and e.request_id == rid]
            got = [b for e in same_step if e.kind == "allocated" and e.request_id == rid for b in e.block_ids]
            assert r["new_blocks"] == got, (ev.step, rid)
            if r["admitted"]:
                assert r["hits"] == [h.block_id for h in lookups[-1].hits]
                assert r["start"] == lookups[-1].num_cached_tokens
            line = describe_plan(ev)
            assert line.startswith(f"step {ev.step}: ")
            if r["kind"] == "decode":
                assert f"{rid} decode 1 token at slot {r['slots'][0]}" in line
            else:
                assert f"{rid} {'prefill chunk' if r['kind'] == 'chunk' else 'prefill'} tokens " \
                       f"{r['start']}–{r['end'] - 1}" in line
                if r["hits"]:
                    assert f"into blocks {','.join(map(str, r['hits']))} (hits)" in line


def test_a_plan_is_immutable(checkpoints):
    with chunked_engine(checkpoints["qwen3_vl"]) as engine:
        engine.generate(Request(prompt="hi"), SamplingParams(max_tokens=2))
        plan = engine.core.last_plan
    assert isinstance(plan, StepPlan) and plan.requests
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.requests[0].end = 99
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.kind = "decode"


# the Chinese lesson (docs/zh-CN/LESSON.md) quotes the same two plans as the Chinese page shows them
ZH_PLANS = ("req-3 预填充 token 48–73，写入块 0,1,2（命中） + 15,14（新分配）；采样一个 token；"
            "req-4 预填充 token 48–71，写入块 5,6,7（命中） + 13,12（新分配）",
            "req-0 解码 1 个 token 写入槽位 208（新块 13）；req-1 解码 1 个 token 写入槽位 158")


@pytest.mark.parametrize("doc", ["README.md", "docs/zh-CN/LESSON.md"])
def test_readme_quotes_the_plans_of_the_step_through_lesson(doc):
    """The README's step-through lesson quotes two plans of its run (the shipped model, 16 blocks, six requests);
    the Chinese lesson quotes them as the Chinese page shows them."""
    import os
    import re
    from panels.i18n.events import plan_in
    from panels.kv_blocks import demo_requests
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, doc), encoding="utf-8") as f:
        readme = " ".join(f.read().split())
    with Engine(EngineConfig(model=os.path.join(root, "assets", "tiny-qwen-vl"), device="cpu", num_blocks=16)) as engine:
        outs = engine.generate(demo_requests(6, None), SamplingParams(max_tokens=48))
        events = engine.events(0)
    names = {o.request_id: f"req-{i}" for i, o in enumerate(outs)}
    plans = {e.step: re.sub(r"\breq-\d+\b", lambda m: names[m.group()], describe_plan(e, step=False))
             for e in events if e.kind == "scheduled"}
    step7 = ("req-3 prefill tokens 48–73 into blocks 0,1,2 (hits) + 15,14 (new); samples a token; "
             "req-4 prefill tokens 48–71 into blocks 5,6,7 (hits) + 13,12 (new)")
    step11 = "req-0 decode 1 token at slot 208 (new block 13); req-1 decode 1 token at slot 158"
    assert plans[7].startswith(step7) and plans[11] == step11
    if doc == "README.md":
        assert step7 in readme and step11 in readme
    else:
        zh = {e.step: re.sub(r"\breq-\d+\b", lambda m: names[m.group()], plan_in(e, "zh-CN"))
              for e in events if e.kind == "scheduled"}
        assert zh[7].startswith(ZH_PLANS[0]) and zh[11] == ZH_PLANS[1]
        assert all(p in readme for p in ZH_PLANS), [p for p in ZH_PLANS if p not in readme]


def frozen_ints(part) -> bool:
    """A group's part of a plan (AttentionGroupStep, StateGroupStep): frozen, of ints and tuples of ints only."""
    return dataclasses.is_dataclass(part) and part.__dataclass_params__.frozen and all(
        isinstance(v, int) or (isinstance(v, tuple) and all(isinstance(i, int) for i in v))
        for v in (getattr(part, f.name) for f in dataclasses.fields(part)))


def test_the_plan_is_plain_data_and_the_runner_keeps_each_requests_sampling_state(checkpoints):
    """No mutable object rides in a plan: a request's params and seed reach the runner once (NewRequestData, in the
    first plan that schedules it; a preempted request is not sent again), and its sampling state lives in the
    runner's batch until it leaves; the tokens the penalties count there are the request's own tokens, step after
    step, though the runner only extends them by what it samples; and so is its block table, though the plans carry
    only the blocks each step adds."""
    sent, plain, drift, tables, seen = [], [], [], [], set()
    params = SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.8, seed=3, repetition_penalty=1.3,
                            presence_penalty=0.2)
    with chunked_engine(checkpoints["qwen3_vl"]) as engine:
        def check(core):
            plan = core.last_plan
            if plan is None or plan.step != core.step_count:
                return
            sent.extend((plan.step, n.seq_id) for n in plan.new_requests)
            seen.update(r.seq_id for r in plan)
            for r in plan:
                for f in dataclasses.fields(r):
                    value = getattr(r, f.name)
                    items = value if isinstance(value, tuple) else (value,)
                    plain.append(all(isinstance(v, (int, str, tuple, type(None), CacheHit))
                                     or (f.name == "positions" and v is not None)
                                     or (f.name == "groups" and frozen_ints(v)) for v in items))
            for seq in core.live.values():
                if seq.seq_id in core.runner.batch:
                    drift.append(core.runner.batch[seq.seq_id].history != seq.token_ids)
            for seq in core.scheduler.running:  # the table the runner kept from the deltas is the block manager's
                tables.append(core.runner.batch[seq.seq_id].block_table == core.block_manager.table(seq))
        engine.core.after_step = check
        reqs = [Request(prompt=f"Describe the scene {i}.", images=[shape_image(GREEN, size=(96 + 16 * i, 96))],
                        request_id=f"pen-{i}") for i in range(4)]
        outs = engine.generate(reqs, params)
        events = engine.events()
        left = dict(engine.core.runner.batch.states)
    assert any(e.kind == "preempted" for e in events), "the tight pool preempts"
    assert sorted(i for _, i in sent) == sorted(seen), "each request sent once, by the first plan that schedules it"
    assert plain and all(plain) and drift and not any(drift) and tables and all(tables)
    assert not left, "a request's state leaves the runner with it"
    assert all(len(o.token_ids) == 30 for o in outs)
