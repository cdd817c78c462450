"""What the app holds for each browser (or API) session, each part with its budget, and the sweeper that gives back
what an idle session holds (#40 item 7: on a shared deployment RSS grew from 0.5 to 1.23 GiB over 120 sessions and
stayed there).

Measured per session on the tiny model (tests/test_session_memory.py; the figures in README's shared-deployment
section: 160 sessions took RSS from 501 to 955 MiB for good before, from 503 to 608 MiB once idle now):

- **gradio's page state** (`demo.state_holder`): gradio keeps, per session, the page's whole configuration and the
  last value of every component the session used (for its deep links): ~0.3 MB for a session that only loaded the
  page, ~1.2 MB after a chat, a KV launch and an anatomy. gradio drops a session only past 10,000 of them. Budget:
  SESSIONS_KEPT sessions (the least recently used go first), and a session idle for SESSION_IDLE_S is dropped.
- **a KV-tab run** (panels/kv_run.py): on a shared deployment an isolated engine per session (its own KV pool of
  96 blocks, its encoder cache, its event ring, a loop thread). Budget: KEPT_RUNS runs; a run idle for
  SESSION_IDLE_S is closed.
- **the shared engine's caches**: the prefix cache lives in the fixed KV pool and the encoder cache (each session
  salted) is bounded by its size in embeddings: neither grows with the number of sessions.
- **small books** (the session's language, its streaming answer): bounded or dropped when the answer ends.

After a sweep that released something, the C allocator is asked to give freed pages back to the system
(glibc's malloc_trim): without it, the freed memory of a few hundred sessions stays in the process's heap."""
import ctypes
import ctypes.util
import gc
import logging
import os
import threading
import time
import weakref

SESSION_IDLE_S = float(os.environ.get("MINIVLM_SESSION_IDLE_S", 600))  # no event for this long: the session is idle
SESSIONS_KEPT = 256  # gradio keeps the page state of at most this many sessions (gradio's own default: 10,000)
SWEEP_S = float(os.environ.get("MINIVLM_SESSION_SWEEP_S", 30))  # how often the sweeper looks
log = logging.getLogger("minivlm.sessions")


def _libc():
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
        return lib if lib is not None and hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


LIBC = _libc()  # glibc only (Linux); elsewhere the allocator keeps its own policy
M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = 2):
    """glibc gives each thread that contends for the heap an arena of its own (up to 8 per core), and a freed block
    stays in its arena: gradio's worker threads, the engines' loops and the vision work spread a session's
    temporaries over 16 arenas on 2 cores. Two arenas hold the same work in less memory (measured: 935 -> 821 MiB
    after 80 sessions); called once at start, before the serving threads exist."""
    if LIBC is not None:
        LIBC.mallopt(M_ARENA_MAX, arenas)


def collect_before_an_engine():
    """Call before building an isolated engine: an engine freezes what is alive when it starts (gc.freeze,
    docs/API.md), and the cyclic garbage the sessions left that the young-generation collection it runs first does
    not reach is then never collected (measured: +30,000 frozen objects and +18 MiB per 40 sessions that each
    launched on the KV tab; with this full collection first, +1,200 and +2 MiB)."""
    gc.collect()


def give_back_freed_memory():
    """Return the heap's free pages to the system (glibc); a no-op elsewhere."""
    if LIBC is not None:
        LIBC.malloc_trim(0)


class Sessions:
    """The parts that hold something per session, and the sweeper over them. A part is an object with
    release_idle(idle_s) -> int (what it released) and held() -> dict (what it holds now, by name)."""

    def __init__(self, idle_s: float = SESSION_IDLE_S, every_s: float = SWEEP_S):
        self.idle_s, self.every_s = idle_s, every_s
        self.parts: list = []
        self.released: dict[str, int] = {}  # totals, by what
        self._demo = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add(self, part):
        """Sweep `part` too (a tab's books of its sessions)."""
        self.parts.append(part)
        return part

    # ---- gradio's page state ---------------------------------------------------------------------------------
    def _state(self):
        demo = self._demo() if self._demo is not None else None
        return demo, getattr(demo, "state_holder", None)

    def _release_pages(self, idle_s: float) -> int:
        """Drop gradio's state of the sessions without an event for idle_s and with none pending."""
        demo, holder = self._state()
        if holder is None:
            return 0
        pending = getattr(getattr(demo, "_queue", None), "pending_event_ids_session", {})
        now = time.time()
        idle = [s for s, used in list(holder.time_last_used.items())
                if now - used.timestamp() > idle_s and not pending.get(s)]
        for session in idle:
            try:
                holder.delete_state(session)  # gr.State values: their delete callbacks run
            except Exception:  # a callback's error must not keep the rest
                log.exception("deleting the state of a session")
            with holder.lock:
                holder.session_data.pop(session, None)
                holder.time_last_used.pop(session, None)
        return len(idle)

    def held(self) -> dict[str, int]:
        """What is held now: gradio sessions, and each part's counts."""
        _, holder = self._state()
        out = {"page_states": len(holder.session_data) if holder is not None else 0}
        for part in self.parts:
            out.update(part.held())
        return out

    def sweep(self, idle_s: float | None = None) -> dict[str, int]:
        """Release what the sessions idle for idle_s (default: the configured time) hold; {what: how many}."""
        idle_s = self.idle_s if idle_s is None else idle_s
        with self._lock:
            released = {"page_states": self._release_pages(idle_s)}
            for part in self.parts:
                released[type(part).__name__] = part.release_idle(idle_s)
            if any(released.values()):
                gc.collect()  # what they held in reference cycles, now rather than at the next full collection
                give_back_freed_memory()
                for k, v in released.items():
                    self.released[k] = self.released.get(k, 0) + v
                log.info("idle sessions released: %s; held now: %s", released, self.held())
        return released

    def watch(self, demo):
        """Sweep every every_s seconds while `demo` serves (a daemon thread; it ends once the demo is closed)."""
        self._demo = weakref.ref(demo)
        if self._thread is not None:
            return

        def run():
            started = False
            while True:
                time.sleep(self.every_s)
                demo = self._demo()
                running = demo is not None and getattr(demo, "is_running", False)
                if started and not running or demo is None:
                    return
                started = started or running
                del demo
                try:
                    self.sweep()
                except Exception:  # never let the sweeper die on one bad sweep
                    log.exception("sweeping idle sessions")
        self._thread = threading.Thread(target=run, name="minivlm-sessions", daemon=True)
        self._thread.start()
