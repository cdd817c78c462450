"""EngineLoop: the one thread that steps the core, the inbox callers submit into, each caller's handle, and
what happens when something breaks: a caller always gets its events or an error, never a hang."""
import logging
import threading
import time

from minivlm.engine.core import EngineCore
from minivlm.engine.handle import RequestHandle
from minivlm.engine.outputs import StreamEvent
from minivlm.engine.sequence import Sequence
from minivlm.refusals import EngineClosed

log = logging.getLogger("minivlm")

# Locks: lock and _inbox_lock are always taken in this order (never _inbox_lock, then lock).
#   lock         the core (scheduler, block manager, KV pool, snapshots, event log). Held for a whole step by
#                whoever steps (the loop thread, or step() while paused) and briefly by the engine's views.
#   _inbox_lock  what callers touch: _inbox, _aborts, _live, _busy, _paused, _closed, _thread. Held only briefly, so a
#                submission never waits for a step; _wake, its condition, wakes the loop.
#   _lending     the sliced vision tower's turn after a step (taken without the other two, or after lock);
#                pausing waits for it, so a paused engine's tower is parked.
# A submitted Sequence belongs to the core, except `sink` (the caller's
# RequestHandle, thread-safe; only the stepping thread, holding lock, puts into it, so a caller's events arrive in step order).


class EngineLoop:
    def __init__(self, core: EngineCore):
        self.core = core
        self.lock = threading.RLock()
        self._inbox_lock = threading.Lock()
        self._wake = threading.Condition(self._inbox_lock)
        self._inbox: list[Sequence] = []
        self._aborts: set[int] = set()  # seq_ids a caller cancelled: the next step finishes them
        self._live: dict[int, Sequence] = {}  # seq_id -> every submitted, unfinished sequence
        self._busy = self._paused = self._closed = False
        self._thread: threading.Thread | None = None
        self._lending = threading.Lock()  # held while the sliced vision tower has the slice a step left it

    def submit(self, handle: RequestHandle) -> RequestHandle:
        """Queue the handle's sequences together; the stepping thread delivers their events into the handle."""
        with self._inbox_lock:
            if self._closed:
                raise EngineClosed()
            labels = {s.request_id for s in self._live.values()}
            for seq in handle.seqs:
                base, k = seq.request_id, 1
                while seq.request_id in labels:  # the same Request submitted twice at once: tell them apart
                    seq.request_id, k = f"{base}#{k}", k + 1
                labels.add(seq.request_id)
                seq.sink, seq.wants_snapshot = handle, handle.snapshots
                seq.submitted_at = self.core.clock()  # its arrival, on the engine's clock (views/timeline.py)
                self._live[seq.seq_id] = seq
                self._inbox.append(seq)  # the core admits it at its next step
            self._start_thread()
            self._wake.notify_all()
        return handle.queued()

    def check_alive(self, pending: set[int]):
        """For a caller that heard nothing for a while: an error, never a hang, if the loop died before delivering
        (the caller's requests are then dropped here; a later loop ends any the core still holds)."""
        with self._inbox_lock:
            if self._closed or self._paused or (self._thread is not None and self._thread.is_alive()):
                return
            for seq in [self._live.pop(i) for i in pending if i in self._live]:
                self._aborts.add(seq.seq_id)
                if seq in self._inbox:
                    self._inbox.remove(seq)
            self._busy = True
        raise RuntimeError("the engine loop is not running; the request was not finished")

    def abort_seqs(self, seq_ids):
        """A handle closed before its end: abort its unfinished sequences."""
        with self._inbox_lock:
            self._abort([self._live[i] for i in seq_ids if i in self._live])

    def abort(self, request_id: str):
        with self._inbox_lock:
            self._abort([s for s in self._live.values() if s.request_id == request_id])

    def _abort(self, seqs: list[Sequence]):  # holding _inbox_lock
        self._aborts.update(seq.seq_id for seq in seqs)
        if seqs:
            self._busy = True  # the next step ends them
            self._wake.notify_all()

    def has_unfinished(self) -> bool:
        with self._inbox_lock:
            return bool(self._live)

    def is_paused(self) -> bool:
        with self._inbox_lock:
            return self._paused

    # ---- stepping ---------------------------------------------------------------------------------------
    def _start_thread(self):
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="minivlm-engine", daemon=True)
            self._thread.start()

    def _run(self):
        try:
            while True:
                with self._inbox_lock:
                    while not self._closed and (self._paused or not (self._inbox or self._busy)):
                        self._wake.wait()
                    if self._closed:
                        return
                self.step(by_loop=True)
                time.sleep(0)  # let a caller waiting for the lock (a snapshot, a view) in between steps
        except BaseException as e:
            self._died(e)

    def step(self, by_loop: bool = False) -> list[StreamEvent]:
        """One core step; delivers its events and errors to their callers and returns the events."""
        with self.lock:
            with self._inbox_lock:
                if by_loop and self._paused:
                    return []  # paused between the loop's check and this step
                new, aborts, self._inbox, self._aborts = self._inbox, self._aborts, [], set()
            result = self.core.step(new, aborts)
            done = [seq for seq, _ in result.failed] + [seq for seq, ev in result.events if ev.finished]
            with self._inbox_lock:
                self._busy = self.core.has_work()
                for seq in done:
                    self._live.pop(seq.seq_id, None)
            for seq, item in result.failed + result.events:  # an error or a StreamEvent
                seq.sink.put((seq, item))
            lend = self.core.tower_slice()
        if lend:  # outside the lock: views may look at the engine while the tower has its slice
            with self._lending:
                started = self.core.clock()
                self.core.vision_worker.lend(lend)
            with self.lock:  # the slice into the log (after _lending: pause() takes lock, then _lending)
                self.core.events.emit("tower_slice", None, started=started, lent=round(lend, 6))
        return [ev for _, ev in result.events]

    def _died(self, error: BaseException):
        """Every waiting caller gets an error at once; the next submission starts a fresh loop."""
        log.error("minivlm: the engine loop died", exc_info=error)
        with self.lock:
            with self._inbox_lock:
                victims, self._inbox, self._live, self._thread = list(self._live.values()), [], {}, None
            for seq in victims:
                try:
                    self.core.fail(seq, "loop", error)
                except Exception:  # the state that killed the loop may refuse; the callers still hear now
                    log.exception("could not release request %s", seq.request_id)
            with self._inbox_lock:
                self._busy = self.core.has_work()
            for seq in victims:
                seq.sink.put((seq, RuntimeError(f"the engine loop stopped ({type(error).__name__}: {error}); "
                                                f"request {seq.request_id} was not finished")))

    # ---- pausing and closing ----------------------------------------------------------------------------
    def set_paused(self, paused: bool):
        with self._inbox_lock:
            self._paused = paused
            self._wake.notify_all()
        with self.lock, self._lending:
            pass  # pause() returns only once a step in flight, and the tower's slice after it, have ended

    def join(self, timeout: float = 5.0):
        """After close(): wait for the thread to end, so that nothing of the engine stays referenced by it (its
        frame holds the loop until it returns). Not from the loop thread itself."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def close(self):
        """Abort everything pending and stop the thread."""
        with self.lock:
            with self._inbox_lock:
                self._closed = True
                self._wake.notify_all()
                pending, self._inbox, self._live = list(self._live.values()), [], {}
            for seq in pending:
                seq.sink.put((seq, self.core.abort(seq)))
