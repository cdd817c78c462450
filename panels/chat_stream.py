"""One answer on its way to the page: the engine's events are read on a thread of their own and coalesced, so a
page that renders more slowly than the engine decodes gets the newest text (never a backlog of stale frames), and
a wait for the next token can say why (the engine is paused by step-through)."""
import queue
import threading
import time

FRAME_S = 0.05  # at most 20 page updates a second: each one re-renders the whole answer, so a long answer paces them
WAIT_S = 0.5    # while no token comes, check this often whether the engine is paused
_DONE = object()


class AnswerStream:
    """Streams one request; `updates()` yields the newest StreamEvent when there is news, None while the
    engine is paused (the caller says so); closing it before the end aborts the request."""

    def __init__(self, engine, request, params):
        self.engine, self.request_id = engine, request.request_id
        self.finished = False
        self._items: queue.Queue = queue.Queue()
        self._events = engine.stream(request, params, snapshots=False)
        threading.Thread(target=self._read, name="chat-answer", daemon=True).start()

    def _read(self):
        try:
            for ev in self._events:
                self._items.put(ev)
        except BaseException as e:  # refused input, a failed step, a closed engine: the page says which
            self._items.put(e)
        finally:
            self._items.put(_DONE)

    def _take(self, block: bool):
        item = self._items.get(timeout=WAIT_S) if block else self._items.get_nowait()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item is _DONE or item.finished:
            self.finished = True
        return item

    def updates(self):
        shown_at = 0.0
        try:
            while not self.finished:
                try:
                    latest = self._take(block=True)
                except queue.Empty:
                    if self.engine.is_paused():
                        yield None
                    continue
                time.sleep(max(0.0, shown_at + FRAME_S - time.monotonic()))  # the page's pace, not the engine's
                while not self.finished:  # what arrived meanwhile: the text is cumulative, the newest suffices
                    try:
                        item = self._take(block=False)
                    except queue.Empty:
                        break
                    latest = latest if item is _DONE else item
                if latest is not _DONE:
                    shown_at = time.monotonic()
                    yield latest
        finally:
            if not self.finished:  # the page went away (or Stop): end the request in the engine
                self.engine.abort(self.request_id)
