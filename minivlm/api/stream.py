"""Bridge from the engine's blocking event stream to asyncio: one thread per request drives engine.stream and
hands each step's event to the event loop, which never blocks on the engine."""
import asyncio
import threading

from minivlm.api.errors import from_engine


class EventPump:
    """engine.stream(request, params) on its own thread; `await pump.next()` returns the next StreamEvent (None when
    the stream ended) or raises the request's ApiError. close() stops reading: closing the engine's generator
    aborts the request at its next step, so a client that went away frees its blocks."""

    def __init__(self, engine, request, params):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.stopped = threading.Event()
        threading.Thread(target=self._run, args=(engine, request, params), daemon=True,
                         name=f"minivlm-{request.request_id}").start()

    def _put(self, item):
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shutting down)
            self.stopped.set()

    def _run(self, engine, request, params):
        try:
            events = engine.stream(request, params, snapshots=False)
            try:
                for ev in events:
                    self._put(ev)
                    if self.stopped.is_set():
                        break
            finally:
                events.close()
        except Exception as e:  # refused input (ValueError) or a failed step: only this request fails
            self._put(e)
        self._put(None)

    async def next(self):
        item = await self.queue.get()
        if isinstance(item, Exception):
            raise from_engine(item)
        return item

    def close(self):
        self.stopped.set()
