"""Views of the event log (minivlm.engine.event_log): replay (the KV state at any step, from the plans and the block
events), plain-English sentences and the step plan in a line, events by step. The engine emits ids, kinds and
numbers; every sentence is said here (and in the page's language by panels/i18n/events.py, from the same fields)."""
from minivlm.engine.event_log import EngineEvent
from minivlm.engine.outputs import BlockInfo, KVSnapshot
from minivlm.engine.kv_cache.snapshot import block_fill
from minivlm.engine.spec_decode.ngram import NOT_ON_THIS_MODEL


class _Replay:
    """The KV state rebuilt from events alone (see replay)."""

    def __init__(self, num_blocks: int, block_size: int, base: KVSnapshot | None):
        self.num_blocks, self.bs = num_blocks, block_size
        self.keys: list[str | None] = [None] * num_blocks
        self.found: dict[str, int] = {}  # key (16 hex) -> the block a lookup finds: the first stored, as the engine's
        self.cached_kind = ["free"] * num_blocks
        self.tables: dict[str, list[int]] = {}
        self.types: dict[str, list[int]] = {}      # token types per request (1 = image placeholder)
        self.videos: dict[str, list] = {}          # (start, length) of each request's videos
        self.computed: dict[str, int] = {}
        self.running: list[str] = []
        self.waiting: list[str] = []
        self.step = self.preemptions = 0
        if base is not None:  # an idle pool: only cached blocks carry state
            if base.running or base.waiting or base.num_blocks != num_blocks:
                raise ValueError("a replay base must be a snapshot of this pool taken while no request was queued")
            self.keys = [b.block_hash if b.cached else None for b in base.blocks]
            self.found = {b.block_hash: b.block_id for b in base.blocks if b.cached}
            self.cached_kind = [b.kind for b in base.blocks]
            self.step, self.preemptions = base.step, base.num_preemptions

    def apply(self, ev: EngineEvent):
        rid, f = ev.request_id, ev.fields
        self.step = ev.step
        if f.get("group") or ev.kind in ("state_saved", "state_evicted"):
            return  # another KV-cache group's pool (a hybrid model's): the replayed map is the full-attention one
        if ev.kind == "arrived":
            types = [0] * f["num_prompt_tokens"]
            for start, n in f["image_spans"]:
                types[start:start + n] = [1] * n
            self.types[rid], self.computed[rid] = types, 0
            self.videos[rid] = f.get("video_spans", [])
            self.waiting.append(rid)
        elif ev.kind == "scheduled":  # the step's plan: who was admitted with which blocks, who computed what
            for r in f["plan"]:
                rid = r["request_id"]
                if r["admitted"]:
                    self.tables[rid] = r["hits"] + r["new_blocks"]
                    self.waiting.remove(rid)
                    self.running.append(rid)
                else:
                    self.tables[rid] += r["new_blocks"]
                self.computed[rid] = r["end"]
                if r["sample"]:
                    self.types[rid].append(0)  # the token it samples
        elif ev.kind == "BlockStored":
            for b, key in zip(f["block_ids"], f["block_hashes"]):
                self.keys[b] = key
                self.found.setdefault(key[:16], b)
                self.cached_kind[b] = f["block_kind"]
        elif ev.kind == "BlockRemoved":
            for b in f["block_ids"]:
                if self.keys[b] is not None and self.found.get(self.keys[b][:16]) == b:
                    del self.found[self.keys[b][:16]]
                self.keys[b] = None
        elif ev.kind == "AllBlocksCleared":
            held = {b for t in self.tables.values() for b in t}
            self.keys = [k if b in held else None for b, k in enumerate(self.keys)]
            self.found = {k: b for k, b in self.found.items() if b in held}
        elif ev.kind in ("preempted", "finished"):
            self.tables.pop(rid, None)
            for queue in (self.running, self.waiting):
                if rid in queue:
                    queue.remove(rid)
            if ev.kind == "preempted":
                self.waiting.insert(0, rid)
                self.computed[rid], self.preemptions = 0, self.preemptions + 1

    def snapshot(self) -> KVSnapshot:
        bs, owners, fill = self.bs, {}, {}
        for rid in self.running + self.waiting:
            for j, b in enumerate(self.tables.get(rid, [])):
                owners.setdefault(b, []).append(rid)
                n, kind = block_fill(self.computed[rid], j, bs, self.types[rid], self.videos[rid])
                if n >= fill.get(b, (-1, ""))[0]:
                    fill[b] = (n, kind)
        blocks = []
        for b in range(self.num_blocks):
            cached = b not in owners and self.keys[b] is not None and self.found.get(self.keys[b][:16]) == b
            n, kind = fill.get(b, (bs if cached else 0, self.cached_kind[b] if cached else "free"))
            key = self.keys[b]
            blocks.append(BlockInfo(b, len(owners.get(b, [])), n, key[:16] if key else None, owners.get(b, []),
                                    kind, cached))
        tables = {rid: list(self.tables[rid]) for rid in self.running + self.waiting if rid in self.tables}
        return KVSnapshot(bs, self.num_blocks, blocks, tables, self.step, list(self.running), list(self.waiting),
                          self.preemptions)


def _start(events: list[EngineEvent], num_blocks: int, block_size: int, base: KVSnapshot | None) -> _Replay:
    first = base.last_event_seq + 1 if base is not None else 1
    if events and events[0].seq != first:
        raise ValueError(f"replay needs the log from seq {first} on, but it starts at {events[0].seq} "
                         f"(events were dropped: raise event_log_size)")
    return _Replay(num_blocks, block_size, base)


def replay_steps(events: list[EngineEvent], num_blocks: int, block_size: int, base: KVSnapshot | None = None):
    """Yield (step, KVSnapshot after that step) for every step the events cover."""
    state = _start(events, num_blocks, block_size, base)
    for i, ev in enumerate(events):
        state.apply(ev)
        if i + 1 == len(events) or events[i + 1].step != ev.step:
            yield ev.step, state.snapshot()


def replay(events: list[EngineEvent], num_blocks: int, block_size: int, until_step: int | None = None,
           base: KVSnapshot | None = None) -> KVSnapshot:
    """The KV state (blocks, block tables, running, waiting, step) after `until_step` (default: the last event's
    step), rebuilt from events alone: the plans the `scheduled` events carry (admissions, blocks, computed tokens),
    the block events (keys) and the lifecycle events (arrived, preempted, finished): equal to what engine.snapshot() showed then. The events start at seq 1,
    or, given `base` (a snapshot of the idle pool), right after base.last_event_seq: events(since=base.last_event_seq)."""
    state = _start(events, num_blocks, block_size, base)
    for ev in events:
        if until_step is not None and ev.step > until_step:
            break
        state.apply(ev)
    return state.snapshot()


def _ids(ids) -> str:
    return ",".join(map(str, ids))


def slot_runs(slots: list[int]) -> str:
    """Slots as runs: "77–80", or "111, 128–130" where a guess crossed into a block elsewhere in the pool."""
    runs = []
    for s in slots:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a}–{b}" if b > a else f"{a}" for a, b in runs)


def describe_request(r: dict) -> str:
    """One request of a plan in words: "req-3 prefill tokens 48–73 into blocks 0,1,2 (hits) + 15,14 (new)"; a
    decode's new block is named after the slots it holds (its token's, or only its guesses')."""
    rid = r["request_id"]
    if r["kind"] == "decode":
        guess_blocks = r.get("draft_blocks", [])
        own = [b for b in r["new_blocks"] if b not in guess_blocks]
        line = f"{rid} decode 1 token" + (f" at slot {r['slots'][0]}" if r["slots"] else "")
        line += f" (new block {_ids(own)})" if own else ""
        if r.get("draft"):
            line += f" + {len(r['draft'])} guessed token(s) in slots {slot_runs(r['draft_slots'])}"
        return line + (f" (new block {_ids(guess_blocks)})" if guess_blocks else "")
    head = f"{rid} {'prefill chunk' if r['kind'] == 'chunk' else 'prefill'} tokens {r['start']}–{r['end'] - 1}"
    parts = [f"{_ids(r['hits'])} (hits)"] if r["hits"] else []
    parts += [f"{_ids(r['new_blocks'])} (new)"] if r["new_blocks"] else []
    into = f" into blocks {' + '.join(parts)}" if parts else ""
    tail = ("; encodes its images" if r["encode"] else "") + ("; samples a token" if r["sample"] else "")
    return head + into + tail


def describe_plan(ev: EngineEvent, step: bool = True) -> str:
    """A `scheduled` event's plan in one line, per request: "step 7: req-3 prefill tokens 48–73 into blocks 0,1,2
    (hits) + 15,14 (new); req-0 decode 1 token at slot 213" (step=False: without the "step 7: ")."""
    plan = ev.fields.get("plan", [])
    line = "; ".join(describe_request(r) for r in plan) if plan else "nothing ran"
    return f"step {ev.step}: {line}" if step else line


def _blocks(ids: list[int]) -> str:
    return f"block {ids[0]}" if len(ids) == 1 else f"blocks {', '.join(map(str, ids))}"


def _state_line(f: dict) -> str:
    """A speculating step of a model with recurrent state (state_after: the token whose state its slot keeps): the
    state put back after the last accepted token, over the rejected guesses; "" for a model without such state."""
    if f.get("state_after") is None:
        return ""
    rejected = len(f["draft"]) - f["accepted"]
    if not rejected:
        return f"; recurrent state after token {f['state_after']}: every guess kept, nothing rolled back"
    return f"; recurrent state kept after token {f['state_after']}, {rejected} rejected guess(es) rolled back"


def describe(ev: EngineEvent) -> str:
    """One event as a plain-English sentence, e.g. "req-3 filled block 41 (16/16) → stored under key 9f3a1c2b…"."""
    rid, f = ev.request_id, ev.fields
    if ev.kind == "arrived":
        return f"{rid} arrived: {f['num_prompt_tokens']} prompt tokens, {f['num_images']} image(s)"
    if ev.kind == "scheduled":
        head = f"{f['step_kind']} {len(f['request_ids'])} request(s), {f['num_tokens']} token(s)"
        if f["step_kind"] != "mixed":
            return head
        chunks = [f"{r} {n}" for r, n in f["num_scheduled_tokens"].items() if n > 1]
        return f"{head}: prefill chunk(s) {', '.join(chunks)}; the rest decode" if chunks else head
    if ev.kind == "cache_lookup":
        hits, false = f["hits"], [h.block_id for h in f["hits"] if h.false_hit]
        if not hits:
            return f"{rid} found no cached prefix"
        return (f"{rid} reused {len(hits)} cached block(s) ({f['num_cached_tokens']} tokens)"
                + (f", FALSE hits on {_blocks(false)}" if false else ""))
    sw = "sliding-window " if f.get("group") else ""  # a hybrid model's sliding-window group (engine/kv_cache/coordinator.py)
    if ev.kind == "allocated":
        return f"{rid} got {sw}{_blocks(f['block_ids'])}" if f["block_ids"] else f"{rid} needed no new block"
    if ev.kind == "BlockStored":
        n = len(f["token_ids"])
        return f"{rid} filled {sw}block {f['block_ids'][0]} ({n}/{n}) → stored under key {f['block_hashes'][0][:8]}…"
    if ev.kind == "freed" and f.get("window"):
        kept = f.get("cached", f["block_ids"])  # the blocks a later prefix lookup finds
        where = ("they stay cached until reused" if len(kept) == len(f["block_ids"]) else "not cached" if not kept
                 else f"{_blocks(kept)} stay cached until reused, the rest not")
        return (f"{rid} gave back {sw}{_blocks(f['block_ids'])}: no later token of it can see them (its "
                f"{f['window']}-token window moved on); {where}")
    if ev.kind == "freed" and f.get("rejected_draft"):
        return f"{rid} gave back {sw}{_blocks(f['block_ids'])}, which held only guesses it did not keep (never cached)"
    if ev.kind == "freed":
        kept = f.get("cached", f["block_ids"])  # the blocks a later prefix lookup finds
        rest = [b for b in f["block_ids"] if b not in kept]
        if not rest:
            return f"{rid} released {sw}{_blocks(f['block_ids'])} (content stays cached until reused)"
        if not kept:
            return f"{rid} released {sw}{_blocks(f['block_ids'])} (content not cached)"
        return (f"{rid} released {sw}{_blocks(f['block_ids'])} ({_blocks(kept)}: content stays cached until reused; "
                f"{_blocks(rest)}: not cached)")
    if ev.kind == "BlockRemoved":
        return f"{sw}{_blocks(f['block_ids'])} evicted: key {f['block_hashes'][0][:8]}… forgotten"
    if ev.kind == "state_saved":
        return (f"{rid}'s recurrent state after {f['token']} tokens saved in slot {f['slot']} (checkpoint under key "
                f"{f['block_hash'][:8]}…): a later request with this prefix resumes there")
    if ev.kind == "speculated":
        where = f"token {f['found_at']} ({'in the prompt' if f['in_prompt'] else 'in its answer'})"
        back = f"; slot{'s' * (len(f['given_back']) > 1)} {', '.join(map(str, f['given_back']))} given back" \
            if f["given_back"] else ""
        back += _state_line(f)
        if f.get("method") == "mtp":  # the model's own head drafted them from its newest token
            return f"{rid}'s MTP head drafted {len(f['draft'])} token(s) from token {f['found_at']}; accepted " \
                   f"{f['accepted']}{back}"
        return f"{rid} proposed {len(f['draft'])} token(s) found at {where}; accepted {f['accepted']}{back}"
    if ev.kind == "not_speculated":
        return f"{rid} does not speculate: {NOT_ON_THIS_MODEL.format(kind=f['reason'])}"
    if ev.kind == "constrained":
        return f"{rid}'s grammar allowed {f['allowed']} of {f['vocab']} tokens; it chose {f['text']!r} (token {f['token']})"
    if ev.kind == "state_evicted":
        return f"state checkpoint in slot {f['slot']} evicted: key {f['block_hash'][:8]}… forgotten"
    if ev.kind == "AllBlocksCleared":
        return "prefix cache reset: every free block's key forgotten"
    if ev.kind == "preempted":
        return f"{rid} preempted: {f['reason']}"
    if ev.kind == "tower_slice":
        return f"the vision tower ran {(ev.time - f['started']) * 1e3:.1f} ms in a slice lent after step {ev.step}"
    if ev.kind == "vision_encoded":
        waited = (f"steps {f['arrived_step']}-{ev.step - 1} ran without it" if ev.step > f["arrived_step"]
                  else "ready in the step it arrived") + \
            (f"; the tower ran in {f['slices']} slices lent between steps" if f.get("slices") else "")
        return (f"{rid}'s {f['num_images']} image(s) encoded on the vision thread in {f['seconds']:.2f} s "
                f"({waited}); its image tokens are computed now")
    if f.get("finish_reason") == "error":
        return f"{rid} failed during {f['stage']}: {f['error']}"
    return f"{rid} finished ({f['finish_reason']})"


def describe_step(events: list[EngineEvent]) -> str:
    """The decisions of one step in a line: "step 14 · decode 8 request(s), 8 token(s) · req-3 filled block …"."""
    if not events:
        return ""
    head = [describe(e) for e in events if e.kind == "scheduled"]
    rest = [describe(e) for e in events if e.kind != "scheduled"]
    return " · ".join([f"step {events[0].step}", *head, *(["; ".join(rest)] if rest else [])])


def by_step(events: list[EngineEvent]) -> dict[int, list[EngineEvent]]:
    """Events grouped by step, steps in order."""
    steps: dict[int, list[EngineEvent]] = {}
    for e in events:
        steps.setdefault(e.step, []).append(e)
    return steps
