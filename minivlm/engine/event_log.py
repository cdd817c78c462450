"""The event log: every decision the engine makes, in order, tagged with its scheduler step. It is the one
source for replay (the KV state at any step), step-through, timelines and per-run counters. Block events use
vLLM's KV-event names (BlockStored, BlockRemoved, AllBlocksCleared) and fields."""
import dataclasses
import json
import marshal
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

KINDS = ("arrived", "scheduled", "cache_lookup", "allocated", "BlockStored", "freed", "BlockRemoved",
         "AllBlocksCleared", "preempted", "finished", "vision_encoded", "state_saved", "state_evicted",
         "constrained", "speculated")


@dataclass
class EngineEvent:
    """One decision. Kind-specific fields (see KINDS and docs/API.md) read as attributes: ev.block_ids, ev.reason."""
    seq: int                      # position in the log, monotonic from 1
    step: int                     # the scheduler step it happened in
    kind: str
    request_id: str | None        # None for block-only events
    fields: dict = field(default_factory=dict)

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
                **{k: plain(v) for k, v in self.fields.items()}}


class EventLog:
    """A ring of the last `capacity` events (0 = logging off); `dropped` counts the ones pushed out.

    The ring holds each event as a tuple of (seq, step, kind, request_id, fields marshalled to bytes): objects the
    cycle collector never walks. Kept as EngineEvents (a dict and lists per request of each plan), a full ring of
    8-stream decode steps is ~900k tracked objects and a 282 ms full collection, a stall in every stream. An
    event is rebuilt when read: `marshal` keeps lists lists and tuples tuples, so readers see what was emitted."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.ring: deque[tuple] = deque(maxlen=max(capacity, 1))
        self.next_seq, self.dropped, self.step = 1, 0, 0

    def emit(self, kind: str, request_id: str | None = None, **fields):
        if not self.capacity:
            return
        if len(self.ring) == self.capacity:
            self.dropped += 1
        try:
            packed = marshal.dumps(fields)
        except ValueError:  # a value marshal cannot write (CacheHit): kept as it is, the rare event that has one
            packed = fields
        self.ring.append((self.next_seq, self.step, kind, request_id, packed))
        self.next_seq += 1

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
    return [EngineEvent(seq, step, kind, request_id, marshal.loads(packed) if type(packed) is bytes else dict(packed))
            for seq, step, kind, request_id, packed in records]


def to_jsonl(events: list[EngineEvent]) -> str:
    return "".join(json.dumps(e.to_dict()) + "\n" for e in events)
