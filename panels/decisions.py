"""What the KV tab says in words: the decision log (one line per scheduler step, in the engine's own sentences),
this run's counters (from the events) and the engine's lifetime counters (from a snapshot), labelled as such so
the two never read as the same number (pure functions, unit-tested)."""
from minivlm.events import by_step, describe

MAX_LOG_STEPS = 40  # the log shows the newest steps; the JSONL download has all of them


def sentences(events) -> list[str]:
    """The step's decisions other than what it ran, one sentence each; a request's run of stored blocks is one."""
    out, i = [], 0
    while i < len(events):
        ev, j = events[i], i + 1
        if ev.kind == "BlockStored":
            while j < len(events) and events[j].kind == "BlockStored" and events[j].request_id == ev.request_id:
                j += 1
            if j - i > 1:
                ids = [b for e in events[i:j] for b in e.block_ids]
                out.append(f"{ev.request_id} filled blocks {', '.join(map(str, ids))} → each stored under its key "
                           f"({', '.join(e.block_hashes[0][:8] + '…' for e in events[i:j])})")
                i = j
                continue
        if ev.kind != "scheduled":
            out.append(describe(ev))
        i = j
    return out


def decision_log(events, until_step: int | None = None, max_steps: int = MAX_LOG_STEPS) -> str:
    """Markdown, newest step first: "- **step 14** · decode 8 request(s), 8 token(s)" and under it every other
    decision of that step as a sentence ("req-3 filled block 41 (16/16) → stored under key 9f3a1c2b…")."""
    steps = [(s, evs) for s, evs in by_step(events).items() if until_step is None or s <= until_step]
    if not steps:
        return "_No decisions yet: launch requests (or send a chat), then Step or Run._"
    lines = []
    for s, evs in reversed(steps[-max_steps:]):
        ran = " · ".join(describe(e) for e in evs if e.kind == "scheduled") or "nothing ran"
        lines.append(f"- **step {s}** · {ran}")
        lines += [f"    - {sentence}" for sentence in sentences(evs)]
    older = len(steps) - max_steps
    tail = [f"- _… {older} earlier step(s): download the events for all of them_"] if older > 0 else []
    return "\n".join(lines + tail)


def run_counters(events) -> dict[str, int]:
    """Counts of this run's decisions (only the events given: one run's)."""
    count = {"arrived": 0, "finished": 0, "preempted": 0, "prefill steps": 0, "decode steps": 0, "mixed steps": 0,
             "blocks reused": 0, "false hits": 0, "blocks stored": 0, "blocks evicted": 0}
    for ev in events:
        if ev.kind in ("arrived", "finished", "preempted"):
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


def run_line(events) -> str:
    """This run's counters in one markdown line, said to be per run."""
    c = run_counters(events)
    steps = len(by_step(events))
    return (f"**This run** (from its first arrival): {c['arrived']} requests arrived, {c['finished']} finished · "
            f"{steps} steps ({c['prefill steps']} prefill, {c['decode steps']} decode"
            f"{f', {m} mixed' if (m := c['mixed steps']) else ''}) · "
            f"**{c['preempted']} preemptions** · {c['blocks reused']} blocks reused from the prefix cache "
            f"({c['false hits']} false) · {c['blocks stored']} stored, {c['blocks evicted']} evicted")


def frame_line(snap, shows: str) -> str:
    """What one map shows: which step, live or replayed, its queues and pool occupancy."""
    used = sum(b.ref_count > 0 for b in snap.blocks)
    cached = sum(b.ref_count == 0 and b.cached for b in snap.blocks)
    return (f"**step {snap.step}** · {shows} · running {len(snap.running)} · waiting {len(snap.waiting)} · "
            f"blocks used {used} / cached {cached} / free {snap.num_blocks - used - cached} of {snap.num_blocks}")


def lifetime_line(snap) -> str:
    """The engine's own counters, which cover its whole life (every run and every chat since it started)."""
    st = snap.cache_stats or {}
    return (f"Engine lifetime (all runs and chats since it started): step {snap.step} · "
            f"preemptions {snap.num_preemptions} · prefix-cache hits {st.get('hits', 0)} "
            f"(true {st.get('true_hits', 0)}, false {st.get('false_hits', 0)}) in {st.get('lookups', 0)} lookups")
