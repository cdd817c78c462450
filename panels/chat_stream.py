"""One answer on its way to the page: the request's RequestHandle (the engine's loop thread delivers into it) read
and coalesced, so a page that renders more slowly than the engine decodes gets the newest text (never a backlog of
stale frames), and a wait for the next token can say why (the engine is paused by step-through)."""
import time

FRAME_S = 0.05  # at most 20 page updates a second: each one re-renders the whole answer, so a long answer paces them
WAIT_S = 0.5    # while no token comes, check this often whether the engine is paused


class AnswerStream:
    """Streams one request; `updates()` yields the newest StreamEvent when there is news, None while the
    engine is paused (the caller says so); closing it before the end aborts the request. A refusal raises from
    the constructor, a failed step from updates()."""

    def __init__(self, engine, request, params):
        self.engine = engine
        self.handle = engine.submit(request, params)
        self.request_id = self.handle.request_id

    @property
    def finished(self) -> bool:
        return self.handle.finished

    def updates(self):
        shown_at = 0.0
        with self.handle:  # the page went away (or Stop) before the end: the engine ends the request
            while not self.finished:
                latest = self.handle.get(timeout=WAIT_S)
                if latest is None:
                    if not self.finished and self.engine.is_paused():
                        yield None
                    continue
                time.sleep(max(0.0, shown_at + FRAME_S - time.monotonic()))  # the page's pace, not the engine's
                while not self.finished:  # what arrived meanwhile: the text is cumulative, the newest suffices
                    newer = self.handle.get(timeout=0)
                    if newer is None:
                        break
                    latest = newer
                shown_at = time.monotonic()
                yield latest
