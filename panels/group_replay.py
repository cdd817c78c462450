"""A hybrid model's KV-cache groups at any step, rebuilt from the event log alone, as minivlm.events.replay rebuilds
the full-attention pool (engine/kv_cache/coordinator.py explains the groups): so the KV tab's group views, its block map and
its decision log all come from one source and agree at every replayed step.

    sliding window  a request's table, kept by its part of each plan (the `scheduled` event's `groups`, by group id:
                    the table at admission, the blocks taken, the indices out of the window, None from then on), as
                    the runner's batch keeps it; finished / preempted drop the table
    recurrent       a request's state slot (its part's `slot`) until it leaves; the checkpoints from
                    state_saved / state_evicted, a request's decode checkpoint replacing its previous one (the engine
                    frees that one without an event), reset_prefix_cache clearing them all
Pure functions of the events, a template of the groups (names, layers, window, sizes: engine.snapshot().groups) and
the replay base; unit-tested against the engine's own snapshots (tests/test_group_views.py)."""
import dataclasses

from minivlm.engine.outputs import GroupInfo, KVSnapshot


@dataclasses.dataclass
class GroupFrame:
    """The groups after one step, and what the views say beside the tables: where each checkpoint was saved (block
    key -> tokens before it, the request that saved it) and which checkpoint slot a request resumed from."""
    step: int
    groups: list[GroupInfo]
    saved_at: dict[str, tuple[int, str | None]] = dataclasses.field(default_factory=dict)
    resumed: dict[str, int] = dataclasses.field(default_factory=dict)
    counts_only: bool = False   # a shared deployment's visitor before their own run: how many, never who or which


def hybrid(groups: list[GroupInfo]) -> bool:
    """A model with more than one KV-cache group (Qwen3.5, Gemma 3): the tab draws its groups."""
    return any(g.kind != "full_attention" for g in groups)


class GroupReplay:
    """The non-full groups rebuilt event by event (see the module docstring); the full group is the replayed map's."""

    def __init__(self, template: list[GroupInfo], block_size: int, base: KVSnapshot | None = None):
        self.template, self.bs = template, block_size
        self.index = {i: g for i, g in enumerate(template)}  # events and plans name a group by its place in snap.groups
        self.tables: dict[int, dict[str, list[int | None]]] = {i: {} for i in self.index}  # group id -> request -> table
        self.slots: dict[int, dict[str, int]] = {i: {} for i in self.index}                # group id -> request -> slot
        self.resumed: dict[str, int] = {}
        self.prompt: dict[str, int] = {}
        self.latest: dict[str, str] = {}   # request -> key of its moving decode checkpoint
        self.step = base.step if base is not None else 0
        base_groups = base.groups if base is not None else []
        self.checkpoints: dict[str, int] = dict(next((g.checkpoints for g in base_groups if g.kind == "recurrent"), {}))
        self.saved_at: dict[str, tuple[int, str | None]] = {}

    def boundary(self, rid: str) -> int:
        """The prompt's last block boundary: a checkpoint past it is the request's moving decode checkpoint."""
        return (self.prompt.get(rid, 0) - 1) // self.bs * self.bs

    def apply(self, ev):
        rid, f, kind = ev.request_id, ev.fields, ev.kind
        self.step = ev.step
        if kind == "arrived":
            self.prompt[rid] = f["num_prompt_tokens"]
        elif kind == "scheduled":
            for r in f["plan"]:
                self._planned(r)
        elif kind == "state_saved":
            key = f["block_hash"]
            if f["token"] > self.boundary(rid):  # its decode checkpoint moved on: the previous one was freed
                old = self.latest.pop(rid, None)
                self.checkpoints.pop(old, None)
                self.latest[rid] = key
            self.checkpoints[key] = f["slot"]
            self.saved_at[key] = (f["token"], rid)
        elif kind == "state_evicted":
            self.checkpoints.pop(f["block_hash"], None)
        elif kind == "AllBlocksCleared":
            self.checkpoints.clear()
            self.latest.clear()
        elif kind in ("preempted", "finished") and rid is not None:
            for held in (*self.tables.values(), *self.slots.values(), self.latest, self.resumed):
                held.pop(rid, None)

    def _planned(self, r: dict):
        """A request's part of a plan in every group but the full one (the replayed map's): a state slot, or a table's
        delta applied as the runner applies it (engine/kv_cache/group_steps.py), None where a block left the window."""
        rid = r["request_id"]
        for g, part in enumerate(r.get("groups", ())):
            if g == 0 or g not in self.index:
                continue
            if "reads" in part:  # kv_shared (Gemma 4): no table of its own, its layers read their sources' blocks
                continue
            if "slot" in part:
                self.slots[g][rid] = part["slot"]
                if part["restore_from"] >= 0:
                    self.resumed[rid] = part["restore_from"]
                continue
            table = self.tables[g].setdefault(rid, [])
            if "shared" in part:
                table[:] = part["shared"]
            del table[part["num_blocks"] - len(part["new_blocks"]):]
            table += part["new_blocks"]
            for i in part["dropped"]:
                table[i] = None

    def frame(self, full: KVSnapshot) -> GroupFrame:
        """The groups now; `full` is the replayed full-attention pool of the same step."""
        holders = set(full.running) | set(full.waiting)
        out = []
        for i, g in enumerate(self.template):
            if i == 0:
                free = sum(b.ref_count == 0 for b in full.blocks)
                out.append(dataclasses.replace(g, free=free, block_tables={r: list(t) for r, t in
                                                                           full.block_tables.items()}))
            elif g.kind == "recurrent":
                slots = {r: [s] for r, s in self.slots[i].items() if r in holders}
                out.append(dataclasses.replace(g, free=g.size - len(slots) - len(self.checkpoints),
                                               block_tables=slots, checkpoints=dict(self.checkpoints)))
            else:
                tables = {r: list(t) for r, t in self.tables[i].items() if r in holders}
                held = {b for t in tables.values() for b in t if b is not None}
                out.append(dataclasses.replace(g, free=g.size - len(held), block_tables=tables, checkpoints={}))
        resumed = {r: s for r, s in self.resumed.items() if r in holders}
        return GroupFrame(full.step, out, dict(self.saved_at), resumed)


def group_frame(events, template: list[GroupInfo], full: KVSnapshot, block_size: int,
                base: KVSnapshot | None = None) -> GroupFrame:
    """The groups after `full.step` (the replayed full-attention pool of that step), from the events after `base`."""
    state = GroupReplay(template, block_size, base)
    for ev in events:
        if ev.step > full.step:
            break
        state.apply(ev)
    return state.frame(full)


def live_frame(snap: KVSnapshot, events=()) -> GroupFrame:
    """The engine's own groups now (engine.snapshot()), with what `events` (the run's) say of its checkpoints and of
    the checkpoint each running request resumed from."""
    saved = {e.fields["block_hash"]: (e.fields["token"], e.request_id) for e in events if e.kind == "state_saved"}
    resumed = {}
    for e in events:
        if e.kind == "scheduled":
            resumed.update({r["request_id"]: r["restore_from"] for r in e.fields["plan"] if "restore_from" in r})
    holders = set(snap.running) | set(snap.waiting)
    return GroupFrame(snap.step, list(snap.groups), saved, {r: s for r, s in resumed.items() if r in holders})
