"""The event log: replay of the log equals snapshot() at every step; preemptions say who and why; false hits
show in cache_lookup events; a paused engine advances one step per step() and gives free running's tokens."""
import gc
import json
import threading
import time

import pytest

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.engine.event_log import EventLog
from minivlm.engine.outputs import CacheHit
from minivlm.views.events import by_step, describe, describe_step, replay, replay_steps
from minivlm.experiments.mm_cache import BLUE, GREEN, Q, RED, shape_image

LONG = SamplingParams(max_tokens=40, ignore_eos=True)


def tight_engine(path, strategy, chunk=None):
    chunked = {"enable_chunked_prefill": True, "max_num_batched_tokens": chunk} if chunk else {}
    return Engine(EngineConfig(model=path, num_blocks=22, block_size=8, max_model_len=512, cache_strategy=strategy,
                               **chunked))


def check_replay_every_step(engine, mismatches: list):
    """Debug hook: after every step, the state rebuilt from the log equals the engine's own snapshot."""
    def check(core):
        snap = core.snapshot()
        rebuilt = replay(core.events.since(0), core.num_blocks, core.config.block_size)
        for field in ("blocks", "block_tables", "running", "waiting", "step"):
            if getattr(rebuilt, field) != getattr(snap, field):
                mismatches.append((core.step_count, field))
    engine.core.after_step = check


def workload(engine):
    """Warm the cache, then: a same-text other-image request (a false hit under A), more requests than the pool
    holds (preemption), one aborted midway, a cache reset, and one more request afterwards."""
    engine.generate(Request(prompt=Q, images=[shape_image(RED)], request_id="warm"), SamplingParams(max_tokens=4))
    reqs = [Request(prompt=Q, images=[shape_image(BLUE)], request_id="blue")] + [
        Request(prompt=f"Describe the scene {i}.", images=[shape_image(GREEN, size=(96 + 16 * i, 96))],
                request_id=f"load-{i}") for i in range(4)]
    gen = engine.stream_many(reqs, LONG)
    for n, ev in enumerate(gen):
        if n == 20:
            engine.abort("load-3")
    engine.reset_prefix_cache()
    engine.generate(Request(prompt=Q, images=[shape_image(RED)], request_id="after"), SamplingParams(max_tokens=3))


@pytest.mark.parametrize("strategy,chunk", [("A", None), ("C", None), ("C", 13)])
def test_replay_equals_snapshot_at_every_step(checkpoints, strategy, chunk):
    mismatches = []
    with tight_engine(checkpoints["qwen3_vl"], strategy, chunk) as engine:
        check_replay_every_step(engine, mismatches)
        workload(engine)
        events = engine.events()
        final = replay(events, engine.num_blocks, engine.config.block_size)
        snap = engine.snapshot()
        kinds = {e.kind for e in events}
    assert not mismatches, mismatches[:5]
    assert final.blocks == snap.blocks and final.block_tables == snap.block_tables == {}
    assert {"arrived", "scheduled", "cache_lookup", "allocated", "BlockStored", "freed", "BlockRemoved",
            "AllBlocksCleared", "preempted", "finished"} <= kinds
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    if chunk:  # prefill chunks ran beside decodes, and replay followed the partial fills
        assert "mixed" in {e.step_kind for e in events if e.kind == "scheduled"}
    aborted = [e for e in events if e.kind == "finished" and e.request_id == "load-3"]
    assert aborted and aborted[0].finish_reason == "abort"
    steps = dict(replay_steps(events, engine.num_blocks, engine.config.block_size))
    assert sorted(steps) == sorted(by_step(events)) and steps[max(steps)].blocks == snap.blocks


def test_replay_of_one_run_from_a_snapshot_of_the_idle_pool(checkpoints):
    """A timeline of the current run: replay its events on top of the snapshot taken when it started."""
    mismatches = []
    with tight_engine(checkpoints["qwen3_vl"], "A") as engine:
        engine.generate(Request(prompt=Q, images=[shape_image(RED)], request_id="earlier"), SamplingParams(max_tokens=4))
        base = engine.snapshot()
        assert any(b.cached for b in base.blocks)

        def check(core):
            snap = core.snapshot()
            rebuilt = replay(core.events.since(base.last_event_seq), core.num_blocks, 8, base=base)
            if (rebuilt.blocks, rebuilt.block_tables, rebuilt.step) != (snap.blocks, snap.block_tables, snap.step):
                mismatches.append(core.step_count)
        engine.core.after_step = check
        out = engine.generate(Request(prompt=Q, images=[shape_image(BLUE)], request_id="blue"), LONG)
        run = engine.events(since=base.last_event_seq)
    assert not mismatches, mismatches
    assert out.cache_hits and run[0].kind == "arrived" and run[0].request_id == "blue"
    with pytest.raises(ValueError, match=f"from seq {base.last_event_seq + 1}"):
        replay(run[1:], engine.num_blocks, 8, base=base)


def test_preemptions_name_the_victim_and_the_reason(checkpoints):
    with tight_engine(checkpoints["qwen3_vl"], "C") as engine:
        workload(engine)
        events = engine.events()
    preempted = [e for e in events if e.kind == "preempted"]
    assert preempted
    for e in preempted:
        assert "needs a block for its next token" in e.reason and e.request_id in e.reason
        assert e.block_ids and f"releasing its {len(e.block_ids)} blocks" in e.reason
        # the same as data: who needed the block (the victim itself when it ran alone), what it freed, what it redoes
        assert e.reason.startswith(f"{e.needed_by} needs") and (e.needed_by == e.request_id) == ("itself" in e.reason)
        assert f"({e.num_freed} become free); its {e.num_tokens} tokens" in e.reason and e.num_tokens > 0
        later = [x for x in events if x.seq > e.seq and x.request_id == e.request_id]
        assert later[0].kind == "freed" or later[0].kind == "cache_lookup"  # its blocks go, then it is re-admitted
        assert any(x.kind == "cache_lookup" for x in later), "a preempted request is recomputed later"


def test_false_hits_under_a_are_cache_lookup_events_on_the_right_blocks(checkpoints):
    with tight_engine(checkpoints["qwen3_vl"], "A") as engine:
        engine.generate(Request(prompt=Q, images=[shape_image(RED)], request_id="red"), SamplingParams(max_tokens=2))
        out = engine.generate(Request(prompt=Q, images=[shape_image(BLUE)], request_id="blue"),
                              SamplingParams(max_tokens=2))
        seq = engine.make_sequence(Request(prompt=Q, images=[shape_image(BLUE)]), SamplingParams())
        lookup = [e for e in engine.events() if e.kind == "cache_lookup" and e.request_id == "blue"][0]
    bs, first_image = 8, seq.images[0].start
    # Independent truth: the prompts differ only inside the image, so every reused block from the one holding the
    # first image token on (keys are chained) holds the red image's K/V; blocks before it are true hits.
    expected = [i >= first_image // bs for i in range(len(lookup.hits))]
    assert len(lookup.hits) == (len(seq) - 1) // bs and any(expected)
    assert [h.false_hit for h in lookup.hits] == expected
    assert [h.logical_index for h in lookup.hits] == list(range(len(lookup.hits)))
    assert lookup.hits == out.cache_hits and lookup.num_cached_tokens == out.num_cached_tokens
    assert "FALSE hits" in describe(lookup)


def test_paused_engine_advances_one_step_per_step_call_and_matches_free_running(checkpoints):
    reqs = lambda: [Request(prompt=f"Describe the scene {i}.", images=[shape_image(GREEN, size=(96 + 16 * i, 96))],
                            request_id=f"r{i}") for i in range(4)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    with tight_engine(checkpoints["qwen3_vl"], "C") as free:
        expected = [o.token_ids for o in free.generate(reqs(), params)]
    with tight_engine(checkpoints["qwen3_vl"], "C") as engine:
        engine.pause()
        results = {}
        caller = threading.Thread(target=lambda: results.update(out=engine.generate(reqs(), params)))
        caller.start()
        time.sleep(1.0)  # the loop would have run several steps by now
        assert engine.core.step_count == 0 and engine.has_unfinished() and not engine.events()
        for k in range(1, 6):
            events = engine.step()
            assert engine.core.step_count == k and {e.step for e in engine.events()} <= set(range(1, k + 1))
            assert all(ev.delta is not None for ev in events)
        time.sleep(0.3)
        assert engine.core.step_count == 5, "a paused engine does not step by itself"
        while "out" not in results and engine.has_unfinished():
            engine.step()  # step-through to the end
        caller.join(timeout=30)
        assert [o.token_ids for o in results["out"]] == expected
        engine.resume()
        assert [o.token_ids for o in engine.generate(reqs(), params)] == expected
        with pytest.raises(RuntimeError, match="pause"):
            engine.step()


def test_resume_continues_exactly(checkpoints):
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    req = lambda: Request(prompt="Describe the scene.", images=[shape_image(BLUE)], request_id="one")
    with tight_engine(checkpoints["qwen3_vl"], "C") as engine:
        expected = engine.generate(req(), params).token_ids
        engine.reset_prefix_cache()
        engine.pause()
        out = {}
        caller = threading.Thread(target=lambda: out.update(o=engine.generate(req(), params)))
        caller.start()
        time.sleep(0.3)
        for _ in range(4):
            engine.step()
        engine.resume()
        caller.join(timeout=30)
        assert out["o"].token_ids == expected


def test_jsonl_ring_bound_and_sentences(checkpoints):
    with Engine(EngineConfig(model=checkpoints["qwen3_vl"], num_blocks=64, block_size=8, event_log_size=40)) as engine:
        engine.generate([Request(prompt=Q, images=[shape_image(RED)]), Request(prompt="Hello")],
                        SamplingParams(max_tokens=20, ignore_eos=True))
        events = engine.events()
        lines = engine.events_jsonl(since=events[-5].seq).splitlines()
        assert len(events) == 40 and engine.events_dropped > 0 and events[0].seq == engine.events_dropped + 1
        assert [json.loads(line)["seq"] for line in lines] == [e.seq for e in events[-4:]]
        with pytest.raises(ValueError, match="needs the log from seq 1"):
            replay(events, engine.num_blocks, 8)
        steps = by_step(events)
        line = describe_step(steps[max(steps)])
        assert line.startswith(f"step {max(steps)} · decode") and "finished (length)" in line
    with Engine(EngineConfig(model=checkpoints["qwen3_vl"], num_blocks=64, event_log_size=0)) as quiet:
        quiet.generate(Request(prompt="Hello"), SamplingParams(max_tokens=3))
        assert quiet.events() == []


def test_the_ring_holds_nothing_the_cycle_collector_walks_and_reads_back_what_was_emitted(checkpoints):
    """A full ring of EngineEvents was ~900k tracked objects (a 282 ms full collection while serving); packed,
    every record but the rare one marshal cannot write is untracked, and readers still get the emitted types."""
    with Engine(EngineConfig(model=checkpoints["qwen3_vl"], num_blocks=64, block_size=8)) as engine:
        engine.generate([Request(prompt=Q, images=[shape_image(RED)]), Request(prompt="Hello"),
                         Request(prompt="Hi there")], SamplingParams(max_tokens=12, ignore_eos=True))
        engine.generate(Request(prompt=Q, images=[shape_image(RED)]), SamplingParams(max_tokens=2))  # prefix hits
        ring = engine.core.events.ring
        gc.collect()  # the collector untracks tuples of untracked items as it meets them
        walked = [(r[2], {type(h).__name__ for h in r[4]["hits"]}) for r in ring if gc.is_tracked(r)]
        assert len(ring) > 40 and walked == [("cache_lookup", {"CacheHit"})], walked  # CacheHits stay objects
        plans = [e for e in engine.events() if e.kind == "scheduled"]
        assert len(plans) > 10 and all(type(e.plan) is list and type(e.plan[0]["new_blocks"]) is list
                                       and type(e.num_scheduled_tokens) is dict for e in plans)
        arrived = next(e for e in engine.events() if e.kind == "arrived")
        assert type(arrived.image_spans) is list and type(arrived.image_spans[0]) is tuple
        plans[0].plan.clear()  # a reader's copy is its own
        assert engine.events(plans[0].seq - 1)[0].plan

    log = EventLog(3)
    fields = {"a": [1, (2.5, None), {"k": [True]}], "b": "x", "c": (), "d": {}}
    log.emit("scheduled", "r", **fields)
    log.emit("cache_lookup", "r", hits=[CacheHit(3, 0, False)], num_cached_tokens=8)
    ev, hit = log.since(0)
    assert ev.fields == fields and type(ev.a[1]) is tuple and type(ev.a[2]["k"]) is list
    assert hit.hits == [CacheHit(3, 0, False)] and (ev.seq, ev.step, ev.kind, ev.request_id) == (1, 0, "scheduled", "r")
    assert [e.seq for e in log.newer_than(0, kinds=("cache_lookup",))] == [2]


def test_the_log_says_truly_what_became_of_blocks_that_held_guesses():
    """#52 item 4, on a real speculative run (n-gram) of the shipped tiny model, step by step: a `freed` sentence says
    "stays cached" of exactly the blocks a later prefix lookup finds after that step (the engine's prefix tree), a
    block that held only rejected guesses is said to be so, and a decode's "(new block b)" stands beside the slots
    that lie in block b (slot // block_size)."""
    import re

    from minivlm.views.events import describe_plan, describe_request
    from panels.i18n import EN, ZH
    from panels.i18n.events import describe_in, plan_in
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    request = Request(prompt="Read this back: red circle, blue square, red circle, blue square, red circle.")
    freed, plans = [], []
    with Engine(EngineConfig(device="cpu", num_blocks=64, speculative_config=spec)) as engine:
        bs, seen = engine.config.block_size, 0
        engine.pause()
        handle = engine.submit(request, SamplingParams(max_tokens=45, ignore_eos=True))
        while not handle.finished:
            engine.step()
            while handle.get(0) is not None:
                pass
            events, servable = engine.events(since=seen), {n.block_id for n in engine.prefix_tree()}
            seen = events[-1].seq
            freed += [(ev, servable & set(ev.block_ids)) for ev in events if ev.kind == "freed"]
            plans += [ev for ev in events if ev.kind == "scheduled"]
        engine.resume()
    numbers = lambda text: sorted(re.findall(r"\d+", text))
    for ev, found in freed:
        said = describe(ev)
        assert said == describe_in(ev, EN) and numbers(said) == numbers(describe_in(ev, ZH)) != []
        assert describe_in(ev, ZH) != said
        if ev.fields.get("rejected_draft"):
            assert not found and said.endswith("which held only guesses it did not keep (never cached)"), said
        elif found == set(ev.block_ids):
            assert said.endswith("(content stays cached until reused)"), said
        else:
            kept, rest = [b for b in ev.block_ids if b in found], [b for b in ev.block_ids if b not in found]
            named = lambda ids: f"block {ids[0]}" if len(ids) == 1 else f"blocks {', '.join(map(str, ids))}"
            assert said.endswith(f"({named(kept)}: content stays cached until reused; {named(rest)}: not cached)"
                                 if kept else "(content not cached)"), said
    assert any(ev.fields.get("rejected_draft") for ev, _ in freed), "the run gave back no block of guesses"
    assert any(found != set(ev.block_ids) and not ev.fields.get("rejected_draft") for ev, found in freed), \
        "the run released no block that was not cached (its last, partly filled block)"
    guess_only = 0
    for ev in plans:
        assert plan_in(ev, EN) == describe_plan(ev, step=False) and numbers(plan_in(ev, ZH)) == numbers(plan_in(ev, EN))
        for r in (r for r in ev.plan if r["kind"] == "decode" and r["new_blocks"]):
            said, own_block = describe_request(r), r["slots"][0] // bs
            draft_blocks = {s // bs for s in r.get("draft_slots", [])} - {own_block}
            assert set(r["new_blocks"]) <= draft_blocks | {own_block}  # every new block holds a slot of this step
            if own_block in r["new_blocks"]:
                assert f"at slot {r['slots'][0]} (new block {own_block})" in said, said
            new_guesses = [b for b in r["new_blocks"] if b in draft_blocks]
            if new_guesses:
                guess_only += 1
                assert said.endswith(f"(new block {','.join(map(str, new_guesses))})") and "(new block" not in \
                    said.split(" + ")[0], said
    assert guess_only, "no step put guesses alone in a new block"
