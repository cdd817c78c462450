"""What the KV tab says in words: the decision log (one line per scheduler step, in the engine's own sentences),
this run's counters (from the events) and the engine's lifetime counters (from a snapshot), labelled as such so
the two never read as the same number (pure functions, unit-tested)."""
from minivlm.views.events import by_step

from panels.i18n import EN, t
from panels.i18n.events import describe_in, plan_in, stored_run

MAX_LOG_STEPS = 40  # the log shows the newest steps; the JSONL download has all of them


def sentences(events, lang: str = EN) -> list[str]:
    """The step's decisions other than what it ran, one sentence each; a request's run of stored blocks of one
    KV-cache group is one (a hybrid model stores each block in its sliding-window group, then in the full one)."""
    out, i = [], 0
    while i < len(events):
        ev, j = events[i], i + 1
        if ev.kind == "BlockStored":
            while j < len(events) and events[j].kind == "BlockStored" and events[j].request_id == ev.request_id \
                    and events[j].fields.get("group") == ev.fields.get("group"):
                j += 1
            if j - i > 1:
                out.append(sliding_run(events[i:j], lang) if ev.fields.get("group") else stored_run(events[i:j], lang))
                i = j
                continue
        if ev.kind != "scheduled":
            out.append(describe_in(ev, lang))
        i = j
    return out


def sliding_run(events, lang: str = EN) -> str:
    """A request's run of blocks stored in the sliding-window group, in one sentence."""
    return t(lang, "groups.stored_run", rid=events[0].request_id, blocks=", ".join(str(b) for e in events
                                                                                  for b in e.block_ids),
             keys=", ".join(e.block_hashes[0][:8] + "…" for e in events))


def decision_log(events, until_step: int | None = None, max_steps: int = MAX_LOG_STEPS, lang: str = EN) -> str:
    """Markdown, newest step first: "- **step 14** · decode 8 request(s), 8 token(s)", under it the step's plan
    ("plan: req-3 prefill tokens 48–73 into blocks 0,1,2 (hits) + 15,14 (new); req-0 decode 1 token at slot 213")
    and every other decision of that step as a sentence ("req-3 filled block 41 (16/16) → stored under key …")."""
    steps = [(s, evs) for s, evs in by_step(events).items() if until_step is None or s <= until_step]
    if not steps:
        return t(lang, "kv.no_decisions")
    lines = []
    for s, evs in reversed(steps[-max_steps:]):
        ran = " · ".join(describe_in(e, lang) for e in evs if e.kind == "scheduled") or t(lang, "kv.nothing_ran")
        lines.append(t(lang, "kv.step_head", step=s, ran=ran))
        lines += [t(lang, "kv.plan_line", plan=plan_in(e, lang)) for e in evs if e.kind == "scheduled"]
        lines += [budget_line(e.fields["budget"], lang) for e in evs
                  if e.kind == "scheduled" and e.fields.get("budget") and e.step_kind != "decode"]
        lines += [f"    - {sentence}" for sentence in sentences(evs, lang)]
    older = len(steps) - max_steps
    tail = [t(lang, "kv.older", n=older)] if older > 0 else []
    return "\n".join(lines + tail)


def budget_line(b: dict, lang: str = EN) -> str:
    """Chunked prefill's adaptive budget for a step, and the measurements it came from."""
    if not b["decodes"] or b["decode_ms"] is None or b["token_ms"] is None:
        why = t(lang, "kv.budget_no_stream" if not b["decodes"] else "kv.budget_unmeasured")
    else:
        why = t(lang, "kv.budget_why", decode=f"{b['decode_ms']:.1f}", fixed=f"{b['fixed_ms']:.1f}",
                token=f"{b['token_ms']:.2f}", slowdown=b["slowdown"])
    return t(lang, "kv.budget_line", tokens=b["prompt_tokens"], why=why)


def run_counters(events) -> dict[str, int]:
    """Counts of this run's decisions (only the events given: one run's)."""
    count = {"arrived": 0, "finished": 0, "preempted": 0, "prefill steps": 0, "decode steps": 0, "mixed steps": 0,
             "blocks reused": 0, "false hits": 0, "blocks stored": 0, "blocks evicted": 0, "left the window": 0,
             "states saved": 0, "states evicted": 0}
    for ev in events:
        if ev.fields.get("group"):  # a hybrid model's other groups: the block counters are the full group's (the map's)
            if ev.kind == "freed" and ev.fields.get("window"):
                count["left the window"] += len(ev.block_ids)
            elif ev.kind in ("state_saved", "state_evicted"):
                count[f"states {ev.kind[6:]}"] += 1
        elif ev.kind in ("arrived", "finished", "preempted"):
            count[ev.kind] += 1
        elif ev.kind == "scheduled":
            count[f"{ev.step_kind} steps"] += 1
        elif ev.kind == "cache_lookup":
            count["blocks reused"] += len(ev.hits)
            count["false hits"] += sum(h.false_hit for h in ev.hits)
        elif ev.kind == "BlockStored":
            count["blocks stored"] += len(ev.block_ids)
        elif ev.kind == "BlockRemoved":
            count["blocks evicted"] += len(ev.block_ids)
    return count


def run_line(events, lang: str = EN) -> str:
    """This run's counters in one markdown line, said to be per run."""
    c = run_counters(events)
    line = t(lang, "kv.run_line", arrived=c["arrived"], finished=c["finished"], steps=len(by_step(events)),
             prefill=c["prefill steps"], decode=c["decode steps"],
             mixed=t(lang, "kv.run_mixed", n=c["mixed steps"]) if c["mixed steps"] else "",
             preempted=c["preempted"], reused=c["blocks reused"], false=c["false hits"], stored=c["blocks stored"],
             evicted=c["blocks evicted"])
    sliding = any(e.fields.get("group") and e.kind in ("allocated", "freed") for e in events)
    recurrent = any(e.kind in ("state_saved", "state_evicted") for e in events)
    parts = ([t(lang, "groups.run_sliding", n=c["left the window"], s="s" if c["left the window"] != 1 else "")]
             if sliding else []) + ([t(lang, "groups.run_recurrent", saved=c["states saved"],
                                       s="s" if c["states saved"] != 1 else "", evicted=c["states evicted"])]
                                    if recurrent else [])
    if parts:  # a hybrid model: what its other groups did
        line += "<br>" + t(lang, "groups.run_line", parts=t(lang, "plan.sep").join(parts))
    return line


def frame_line(snap, shows: str, lang: str = EN) -> str:
    """What one map shows: which step, live or replayed, its queues and pool occupancy."""
    used = sum(b.ref_count > 0 for b in snap.blocks)
    cached = sum(b.ref_count == 0 and b.cached for b in snap.blocks)
    return t(lang, "kv.frame_line", step=snap.step, shows=shows, running=len(snap.running),
             waiting=len(snap.waiting), used=used, cached=cached, free=snap.num_blocks - used - cached,
             total=snap.num_blocks)


def encoder_line(engine, lang: str = EN) -> str:
    """The engine's encoder cache: hits and misses since it started, the embeddings it holds (its public
    Engine.encoder_cache_stats)."""
    return t(lang, "kv.encoder_line", **engine.encoder_cache_stats())


def lifetime_line(snap, lang: str = EN) -> str:
    """The engine's own counters, which cover its whole life (every run and every chat since it started)."""
    st = snap.cache_stats or {}
    return t(lang, "kv.lifetime_line", step=snap.step, preempted=snap.num_preemptions, hits=st.get("hits", 0),
             true=st.get("true_hits", 0), false=st.get("false_hits", 0), lookups=st.get("lookups", 0))
