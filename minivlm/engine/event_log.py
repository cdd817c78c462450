"""The event log: every decision the engine makes, in order, tagged with its scheduler step. It is the one
source for replay (the KV state at any step), step-through, timelines and per-run counters. Block events use
vLLM's KV-event names (BlockStored, BlockRemoved, AllBlocksCleared) and fields. Every event carries the time it was
emitted, read from the engine's clock (EngineCore.clock, which a test may replace); a step's `scheduled` event also
learns when its step started and ended (the wall-clock timeline, minivlm/views/timeline.py)."""
import dataclasses
import json
import marshal
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

KINDS = ("arrived", "scheduled", "cache_lookup", "allocated", "BlockStored", "freed", "BlockRemoved",
         "AllBlocksCleared", "preempted", "finished", "vision_encoded", "state_saved", "state_evicted",
         "constrained", "speculated", "not_speculated", "tower_slice")


@dataclass
class EngineEvent:
    """One decision. Kind-specific fields (see KINDS and docs/API.md) read as attributes: ev.block_ids, ev.reason."""
    seq: int                      # position in the log, monotonic from 1
    step: int                     # the scheduler step it happened in
    kind: str
    request_id: str | None        # None for block-only events
    fields: dict = field(default_factory=dict)
    time: float | None = None     # the engine's clock when it was emitted (None: a log without a clock)

    def __getattr__(self, name):
        try:
            return self.__dict__["fields"][name]
        except KeyError:
            raise AttributeError(f"{self.kind} event has no field {name!r}") from None

    def to_dict(self) -> dict:
        """Plain JSON-ready data (CacheHits become dicts, tuples lists)."""
        def plain(v):
            if dataclasses.is_dataclass(v):
                return dataclasses.asdict(v)
            return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v
        return {"seq": self.seq, "step": self.step, "kind": self.kind, "request_id": self.request_id,
                "time": self.time, **{k: plain(v) for k, v in self.fields.items()}}


class EventLog:
    """A ring of the last `capacity` events (0 = logging off); `dropped` counts the ones pushed out.

    The ring holds each event as a tuple of (seq, step, kind, request_id, fields marshalled to bytes): objects the
    cycle collector never walks. Kept as EngineEvents (a dict and lists per request of each plan), a full ring of
    8-stream decode steps is ~900k tracked objects and a 282 ms full collection, a stall in every stream. An
    event is rebuilt when read: `marshal` keeps lists lists and tuples tuples, so readers see what was emitted.

    `clock` (a function of no arguments, seconds) stamps each record; None leaves events untimed. A `scheduled`
    record is extended once, by end_step, with (when its step started, when it ended): readers see them as the
    event's `started` and `ended` fields."""

    def __init__(self, capacity: int, clock=None):
        self.capacity, self.clock = capacity, clock
        self.ring: deque[tuple] = deque(maxlen=max(capacity, 1))
        self.next_seq, self.dropped, self._step, self.started = 1, 0, 0, None

    @property
    def step(self) -> int:
        return self._step

    @step.setter
    def step(self, step: int):
        """A new step begins: its number tags the events that follow, and the clock says when it began."""
        self._step, clock = step, self.clock
        self.started = clock() if clock is not None else None

    def emit(self, kind: str, request_id: str | None = None, **fields):
        if not self.capacity:
            return
        if len(self.ring) == self.capacity:
            self.dropped += 1
        try:
            packed = marshal.dumps(fields)
        except ValueError:  # a value marshal cannot write (CacheHit): kept as it is, the rare event that has one
            packed = fields
        clock = self.clock
        self.ring.append((self.next_seq, self._step, kind, request_id, packed, clock() if clock is not None else None))
        self.next_seq += 1

    def end_step(self):
        """The step's work is done (its tokens go to their callers now): its `scheduled` record, a few records from
        the newest end, gets (started, ended). A step that scheduled nothing has none to extend."""
        clock, ring = self.clock, self.ring
        if clock is None or not self.capacity:
            return
        for i in range(len(ring) - 1, -1, -1):  # newest first: the plan was emitted before this step's other events
            record = ring[i]
            if record[1] != self._step:
                return
            if record[2] == "scheduled":
                ring[i] = record[:6] + (self.started, clock())  # flat: a tuple of atoms stays untracked
                return

    def since(self, seq: int = 0) -> list[EngineEvent]:
        """Events with .seq > seq, in order (seq numbers in the ring are consecutive)."""
        return unpack(self.records_since(seq))

    def records_since(self, seq: int = 0) -> list[tuple]:
        """The packed records behind since(seq): immutable, so a reader can copy them under the engine's lock and
        rebuild the events (about 5 µs for a plan of 8 requests) after releasing it."""
        return list(islice(self.ring, max(0, seq + 1 - self.ring[0][0]), None)) if self.ring else []

    def newer_than(self, seq: int, kinds: tuple[str, ...] | None = None) -> list[EngineEvent]:
        """Like since(seq), read from the newest end: cheap when few events are newer (once per step); `kinds`
        keeps only those kinds (the others are not rebuilt)."""
        n = min(self.last_seq - seq, len(self.ring))
        if n <= 0:
            return []
        return unpack([r for r in list(islice(reversed(self.ring), n))[::-1] if kinds is None or r[2] in kinds])

    @property
    def last_seq(self) -> int:
        return self.next_seq - 1


def unpack(records: list[tuple]) -> list[EngineEvent]:
    """EngineEvents from the ring's records; each call builds fresh objects (a reader may keep or change them)."""
    return [_event(*r) for r in records]


def _event(seq, step, kind, request_id, packed, time, *span) -> EngineEvent:
    fields = marshal.loads(packed) if type(packed) is bytes else dict(packed)
    if span:  # a scheduled record its step's end extended
        fields["started"], fields["ended"] = span
    return EngineEvent(seq, step, kind, request_id, fields, time)


def to_jsonl(events: list[EngineEvent]) -> str:
    return "".join(json.dumps(e.to_dict()) + "\n" for e in events)
