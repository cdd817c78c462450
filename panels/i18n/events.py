"""The decision log's sentences in the page's language, rendered from an event's fields (ids, numbers) through the
catalogue; in English they are exactly minivlm.views.events.describe / describe_plan (tests/test_i18n.py). Only the
fields are read, never the engine's English."""
from minivlm.views.events import slot_runs

from panels.i18n import t, word as _word


def _blocks(lang: str, ids: list[int]) -> str:
    return t(lang, "ev.block", ids=ids[0]) if len(ids) == 1 else t(lang, "ev.blocks", ids=", ".join(map(str, ids)))


def preemption_reason(lang: str, ev) -> str:
    """Why a request was preempted, in `lang`, from the event's fields: who needed a block, what it released."""
    f = ev.fields
    key = "ev.preempt_itself" if f["needed_by"] == ev.request_id else "ev.preempt_newest"
    return t(lang, key, needer=f["needed_by"], victim=ev.request_id, n=len(f["block_ids"]), free=f["num_freed"],
             tokens=f["num_tokens"])


def describe_in(ev, lang: str) -> str:
    """One event as a sentence in `lang` (as minivlm.views.events.describe, which is its English)."""
    rid, f = ev.request_id, ev.fields
    if ev.kind == "arrived":
        return t(lang, "ev.arrived", rid=rid, tokens=f["num_prompt_tokens"], images=f["num_images"])
    if ev.kind == "scheduled":
        head = t(lang, "ev.scheduled", kind=_word(lang, "step", f["step_kind"]), n=len(f["request_ids"]),
                 tokens=f["num_tokens"])
        chunks = [f"{r} {n}" for r, n in f["num_scheduled_tokens"].items() if n > 1]
        if f["step_kind"] != "mixed" or not chunks:
            return head
        return t(lang, "ev.mixed_chunks", head=head, chunks=", ".join(chunks))
    if ev.kind == "cache_lookup":
        hits, false = f["hits"], [h.block_id for h in f["hits"] if h.false_hit]
        if not hits:
            return t(lang, "ev.no_prefix", rid=rid)
        return t(lang, "ev.reused", rid=rid, n=len(hits), tokens=f["num_cached_tokens"],
                 false=t(lang, "ev.false_hits", blocks=_blocks(lang, false)) if false else "")
    sw = t(lang, "ev.sw") if f.get("group") else ""
    if ev.kind == "allocated":
        return t(lang, "ev.got", rid=rid, sw=sw, blocks=_blocks(lang, f["block_ids"])) if f["block_ids"] else \
            t(lang, "ev.no_new_block", rid=rid)
    if ev.kind == "BlockStored":
        return t(lang, "ev.stored", rid=rid, sw=sw, block=f["block_ids"][0], n=len(f["token_ids"]),
                 key=f["block_hashes"][0][:8])
    if ev.kind == "freed" and f.get("window"):
        kept = f.get("cached", f["block_ids"])
        where = t(lang, "ev.window_kept") if len(kept) == len(f["block_ids"]) else \
            t(lang, "ev.window_not_kept") if not kept else t(lang, "ev.window_some_kept", kept=_blocks(lang, kept))
        return t(lang, "ev.left_window", rid=rid, sw=sw, blocks=_blocks(lang, f["block_ids"]), window=f["window"],
                 where=where)
    if ev.kind == "freed" and f.get("rejected_draft"):
        return t(lang, "ev.freed_guesses", rid=rid, sw=sw, blocks=_blocks(lang, f["block_ids"]))
    if ev.kind == "freed":
        kept = f.get("cached", f["block_ids"])
        rest = [b for b in f["block_ids"] if b not in kept]
        blocks = _blocks(lang, f["block_ids"])
        if not rest or not kept:
            return t(lang, "ev.freed_uncached" if rest else "ev.freed", rid=rid, sw=sw, blocks=blocks)
        return t(lang, "ev.freed_some", rid=rid, sw=sw, blocks=blocks, kept=_blocks(lang, kept),
                 rest=_blocks(lang, rest))
    if ev.kind == "BlockRemoved":
        return t(lang, "ev.evicted", sw=sw, blocks=_blocks(lang, f["block_ids"]), key=f["block_hashes"][0][:8])
    if ev.kind == "state_saved":
        return t(lang, "ev.state_saved", rid=rid, tokens=f["token"], slot=f["slot"], key=f["block_hash"][:8])
    if ev.kind == "speculated":
        where = t(lang, "ev.spec_prompt" if f["in_prompt"] else "ev.spec_answer", at=f["found_at"])
        back = t(lang, "ev.spec_back", s="s" * (len(f["given_back"]) > 1),
                 slots=", ".join(map(str, f["given_back"]))) if f["given_back"] else ""
        if f.get("state_after") is not None:  # recurrent state: put back after the last accepted token
            rejected = len(f["draft"]) - f["accepted"]
            back += t(lang, "ev.spec_rolled_back" if rejected else "ev.spec_state_kept", at=f["state_after"],
                      n=rejected)
        if f.get("method") == "mtp":  # the model's own head drafted them from its newest token
            return t(lang, "ev.speculated_mtp", rid=rid, n=len(f["draft"]), at=f["found_at"], accepted=f["accepted"],
                     back=back)
        return t(lang, "ev.speculated", rid=rid, n=len(f["draft"]), where=where, accepted=f["accepted"], back=back)
    if ev.kind == "not_speculated":
        return t(lang, "ev.not_speculated", rid=rid, kind=f["reason"])
    if ev.kind == "constrained":
        return t(lang, "ev.constrained", rid=rid, allowed=f["allowed"], vocab=f["vocab"], text=repr(f["text"]),
                 token=f["token"])
    if ev.kind == "state_evicted":
        return t(lang, "ev.state_evicted", slot=f["slot"], key=f["block_hash"][:8])
    if ev.kind == "AllBlocksCleared":
        return t(lang, "ev.cleared")
    if ev.kind == "preempted":
        return t(lang, "ev.preempted", rid=rid, reason=preemption_reason(lang, ev))
    if ev.kind == "tower_slice":
        return t(lang, "ev.tower_slice", ms=f"{(ev.time - f['started']) * 1e3:.1f}", step=ev.step)
    if ev.kind == "vision_encoded":
        waited = (t(lang, "ev.waited", first=f["arrived_step"], last=ev.step - 1) if ev.step > f["arrived_step"]
                  else t(lang, "ev.ready")) + (t(lang, "ev.sliced", n=f["slices"]) if f.get("slices") else "")
        return t(lang, "ev.encoded", rid=rid, n=f["num_images"], secs=f"{f['seconds']:.2f}", waited=waited)
    if f.get("finish_reason") == "error":
        return t(lang, "ev.failed", rid=rid, stage=f["stage"], error=f["error"])
    return t(lang, "ev.finished", rid=rid, reason=_word(lang, "reason", f["finish_reason"]))


def stored_run(events, lang: str) -> str:
    """A request's run of stored blocks in one sentence (the decision log's grouping)."""
    ids = [b for e in events for b in e.block_ids]
    return t(lang, "ev.stored_run", rid=events[0].request_id, blocks=", ".join(map(str, ids)),
             keys=", ".join(e.block_hashes[0][:8] + "…" for e in events))


def _ids(ids) -> str:
    return ",".join(map(str, ids))


def plan_request(r: dict, lang: str) -> str:
    """One request of a step's plan (as minivlm.views.events.describe_request, which is its English)."""
    rid = r["request_id"]
    if r["kind"] == "decode":
        guess_blocks = r.get("draft_blocks", [])
        own = [b for b in r["new_blocks"] if b not in guess_blocks]
        where = t(lang, "plan.at_slot", slot=r["slots"][0]) if r["slots"] else ""
        new = t(lang, "plan.new_block", ids=_ids(own)) if own else ""
        new += t(lang, "plan.draft", n=len(r["draft"]), slots=slot_runs(r["draft_slots"])) if r.get("draft") else ""
        new += t(lang, "plan.new_block", ids=_ids(guess_blocks)) if guess_blocks else ""
        return t(lang, "plan.decode", rid=rid, where=where, new=new).rstrip()
    parts = [t(lang, "plan.hits", ids=_ids(r["hits"]))] if r["hits"] else []
    parts += [t(lang, "plan.new", ids=_ids(r["new_blocks"]))] if r["new_blocks"] else []
    into = t(lang, "plan.into", parts=" + ".join(parts)) if parts else ""
    tail = (t(lang, "plan.encodes") if r["encode"] else "") + (t(lang, "plan.samples") if r["sample"] else "")
    return t(lang, "plan.chunk" if r["kind"] == "chunk" else "plan.prefill", rid=rid, first=r["start"],
             last=r["end"] - 1, into=into, tail=tail)


def plan_in(ev, lang: str) -> str:
    """A `scheduled` event's plan in one line without its step (as describe_plan(ev, step=False))."""
    plan = ev.fields.get("plan", [])
    return t(lang, "plan.sep").join(plan_request(r, lang) for r in plan) if plan else t(lang, "plan.nothing")
