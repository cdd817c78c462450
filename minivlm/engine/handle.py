"""RequestHandle: one submission's replies. The loop thread delivers each step's event (or the request's error) into
it; the caller reads them where it is, `for ev in handle` on a thread or `async for ev in handle` on an event loop
(woken with call_soon_threadsafe: no thread and no queue of its own). Closing it aborts what has not finished."""
import asyncio
import collections
import threading
import time

POLL_S = 0.5  # how often a waiting reader checks that the loop it waits on is still alive


class RequestHandle:
    """Iterate it for the StreamEvents of its requests in step order; the request's error (a failed step, a
    stopped loop) is raised where it is read. One reader at a time. close() (or leaving `with handle:`) aborts the
    unfinished requests: their blocks are freed at the next step."""

    def __init__(self, loop, seqs: list, snapshots: bool = False):
        self._loop, self.seqs, self.snapshots = loop, seqs, snapshots  # seqs: until the loop has queued them
        self._pending = {s.seq_id for s in seqs}
        self.request_ids: list[str] = []
        self._items: collections.deque = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._waker: tuple | None = None  # (event loop, future) of an async reader waiting for the next item
        self._closed = False

    @property
    def request_id(self) -> str:
        """The label its (first) request runs under (a Request submitted twice at once gets "#1", "#2", ...)."""
        return self.request_ids[0]

    def queued(self) -> "RequestHandle":
        """The loop queued (and labelled) its sequences: keep their labels, not them (each sequence points here
        until it ends; a handle that pointed back would keep the engine in a reference cycle)."""
        self.request_ids, self.seqs = [s.request_id for s in self.seqs], []
        return self

    @property
    def finished(self) -> bool:
        """Every request of it delivered its last event (or an error), or it was closed."""
        return self._closed or not self._pending

    # ---- the loop thread's side -------------------------------------------------------------------------
    def put(self, item: tuple | None):
        """(seq, StreamEvent or exception), from the thread that steps the core (so in step order); None only wakes
        the reader."""
        with self._ready:
            if item is not None and not self._closed:  # a closed handle has no reader: keep nothing
                self._items.append(item)
            self._ready.notify_all()
            waker, self._waker = self._waker, None
        if waker is not None:
            try:
                waker[0].call_soon_threadsafe(_wake, waker[1])
            except RuntimeError:  # that event loop is closed: nobody reads any more
                pass

    # ---- the reader's side ------------------------------------------------------------------------------
    def _take(self, item: tuple):
        seq, ev = item
        if isinstance(ev, BaseException):  # this request failed: the others of the handle end with it
            self._pending.discard(seq.seq_id)
            self.close()
            raise ev
        if ev.finished:
            self._pending.discard(seq.seq_id)
            if not self._pending:
                self._let_go()
        return seq, ev

    def _let_go(self):
        """Done with the loop: a finished sequence may still point here (the core's last step keeps it), and a
        handle that pointed on to the loop would hold the engine in a reference cycle."""
        self._loop = None

    def _heard_nothing(self):
        """A wait ended empty: an error, never a hang, if the loop died without delivering."""
        loop = self._loop
        if loop is None:  # closed meanwhile
            return
        try:
            loop.check_alive(self._pending)
        except BaseException:
            self._pending.clear()
            self._closed = True
            self._let_go()
            raise

    def next_pair(self, timeout: float | None = None):
        """(seq, StreamEvent) of the next item, waiting at most `timeout` s (None: until one comes, 0: not at all);
        None when none came in time or nothing is left. Raises the request's error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.finished:
            with self._ready:
                wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
                if not self._items and wait > 0:
                    self._ready.wait(wait)
                item = self._items.popleft() if self._items else None
            if item is not None:
                return self._take(item)
            if wait > 0:
                self._heard_nothing()
            if deadline is not None and time.monotonic() >= deadline:
                return None
        return None

    def get(self, timeout: float | None = None):
        """The next StreamEvent, or None when none came within `timeout` s (0: don't wait) or nothing is left."""
        pair = self.next_pair(timeout)
        return None if pair is None else pair[1]

    def __iter__(self):
        return self

    def __next__(self):
        pair = self.next_pair()
        if pair is None:
            raise StopIteration
        return pair[1]

    def pairs(self):
        """(seq, StreamEvent) of every item, for a caller that submitted several requests together."""
        while (pair := self.next_pair()) is not None:
            yield pair

    def __aiter__(self):
        return self

    async def __anext__(self):
        """The next StreamEvent, awaited on the event loop: the loop thread wakes it, no thread waits for it."""
        while not self.finished:
            with self._ready:
                item = self._items.popleft() if self._items else None
                if item is None:
                    future = asyncio.get_running_loop().create_future()
                    self._waker = (future.get_loop(), future)
            if item is not None:
                return self._take(item)[1]
            try:
                await asyncio.wait_for(future, POLL_S)
            except TimeoutError:
                self._heard_nothing()
        raise StopAsyncIteration

    # ---- ending -----------------------------------------------------------------------------------------
    def close(self):
        """Stop reading: the unfinished requests are aborted (their blocks freed at the next step)."""
        if not self._closed:
            self._closed = True
            if self._loop is not None:
                self._loop.abort_seqs(list(self._pending))  # a copy: the reader may be discarding from it
                self._let_go()
            with self._ready:
                self._items.clear()
            self.put(None)  # a reader waiting elsewhere (a disconnect watcher closed it) stops waiting

    abort = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _wake(future: asyncio.Future):
    if not future.done():
        future.set_result(None)
