"""What a session holds on a shared deployment, and that it is given back once the session is idle (#40 item 7: RSS
grew from 0.5 to 1.23 GiB over 120 sessions and stayed there after 20 minutes idle).

The fast test counts the holders' objects in the served app (gradio's page state per session, the KV tab's runs and
their isolated engines) before and after a sweep. The slow one is the soak: `python app.py --shared` as a process,
120 gradio_client sessions coming and going (a chat with a picture each, a KV-tab launch every second one, an
anatomy every third, the cache inspector every tenth), its RSS read from /proc before, at the peak and after the
sessions went idle, and the sweeper's own counts from its log."""
import ast
import os
import re
import threading
import time

import pytest
from gradio_client import Client, handle_file

from panels.holder import EXAMPLES_DIR
from panels.sessions import SESSIONS_KEPT
from tests.app_server import app_in_process, running_app

PICTURES = ["red_circle.png", "blue_circle.png", "three_shapes.png", "two_shapes.png"]
SOAK_SESSIONS, AT_ONCE = 120, 4
WARM_UP = 40  # sessions before the level the soak is held to: the allocator's and the caches' first growth
IDLE_S = 4  # the soak's idle time (the app's default: 600 s), set through MINIVLM_SESSION_IDLE_S
# after the soak, RSS is back within this of the warm level. Measured (2 cores, tiny model): start 503 MiB, 585
# after the warm-up, peak 643, 608 once idle (+23); before the sweeper: 501, 778, then 955 and never down (+177)
MARGIN_MIB = 64  # two runs: +23 and +40 (a run beside other jobs); before the sweeper +177


def picture(i: int):
    return handle_file(os.path.join(EXAMPLES_DIR, PICTURES[i % len(PICTURES)]))


def visit(url: str, i: int, launch: bool = True, anatomy: bool = False, inspect: bool = False):
    """One visitor: a chat with a picture, and the tabs that hold something per session."""
    client = Client(url, verbose=False)
    try:
        client.predict({"text": "What color is the shape?", "files": [picture(i)]}, [], 8, 0.0, 1.0, 0, "", False,
                       api_name="/chat")
        if launch:
            client.predict(8, 32, False, api_name="/kv_launch")
        if anatomy:
            client.predict(picture(i), picture(i + 1), "What color is the shape?", 50176, 50176, api_name="/anatomy")
        if inspect:
            client.predict(picture(i), picture(i + 1), "What color is the shape?", "", "processor default",
                           "processor default", 4, api_name="/inspect")
    finally:
        client.close()


def visits(url: str, first: int, n: int):
    """n visitors, AT_ONCE at a time, with the soak's mix of tabs."""
    for wave in range(first, first + n, AT_ONCE):
        threads = [threading.Thread(target=visit, args=(url, i, i % 2 == 0, i % 3 == 0, i % 10 == 0))
                   for i in range(wave, min(wave + AT_ONCE, first + n))]
        [t.start() for t in threads]
        [t.join() for t in threads]


@pytest.mark.slow  # waits out a session's idle time: CI runs it with -m slow
def test_an_idle_session_gives_back_its_page_state_and_its_engine():
    """Three visitors chat and launch on the KV tab: gradio keeps each one's page state and each has an isolated
    engine; a sweep once they are idle drops the page states and closes the engines (their loops end), and a
    visitor who comes back afterwards is served as a new one."""
    with app_in_process(64, shared=True) as (holder, url):
        for i in range(3):
            visit(url, i)
        held = holder.sessions.held()
        assert held["page_states"] >= 3 and held["kv_runs"] == 3 and held["isolated_engines"] == 3, held
        loops = engine_loops()
        assert holder.sessions.sweep(idle_s=3600) == {"page_states": 0, "Runs": 0}  # not idle for an hour
        released = holder.sessions.sweep(idle_s=0)
        assert released["page_states"] >= 3 and released["Runs"] == 3, released
        assert holder.sessions.held() == {"page_states": 0, "kv_runs": 0, "isolated_engines": 0}
        assert engine_loops() == loops - 3  # the three engines are closed: their loop threads ended
        visit(url, 3)  # back: a new page state and a new engine
        assert holder.sessions.held()["isolated_engines"] == 1
        assert holder.sessions._state()[1].capacity == SESSIONS_KEPT  # gradio keeps 256 sessions, not 10,000


def engine_loops() -> int:
    """Engine loop threads alive now (one per open engine that has run a request)."""
    return sum(t.name == "minivlm-engine" and t.is_alive() for t in threading.enumerate())

def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def held_after_sweeps(log_path: str) -> dict:
    """The sweeper's last "held now" counts, from the app's log (--verbose)."""
    with open(log_path) as f:
        found = re.findall(r"held now: (\{[^}]*\})", f.read())
    return ast.literal_eval(found[-1]) if found else {}


def settle(pid: int, seconds: float) -> float:
    """RSS once the sessions have been idle for `seconds` (sweeps every second meanwhile)."""
    time.sleep(seconds)
    return rss_mib(pid)


@pytest.mark.slow  # 160 sessions on the tiny model: about five minutes on two cores
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc (Linux)")
def test_soak_memory_returns_after_many_sessions(tmp_path):
    """The figures (README's shared-deployment section): RSS after WARM_UP sessions, its peak over SOAK_SESSIONS
    more, and after they went idle; it must come back within MARGIN_MIB of the warm level, and the sweeper must say
    it holds no page state, run or isolated engine."""
    log = str(tmp_path / "app.log")
    env = {"MINIVLM_SESSION_IDLE_S": str(IDLE_S), "MINIVLM_SESSION_SWEEP_S": "1"}
    with running_app("--shared", "--num-blocks", "256", "--verbose", log_path=log, env=env) as url:
        start = rss_mib(url.pid)
        visits(url, 0, WARM_UP)
        warm = settle(url.pid, IDLE_S + 6)
        peak, done = warm, threading.Event()

        def watch():
            nonlocal peak
            while not done.is_set():
                peak = max(peak, rss_mib(url.pid))
                time.sleep(0.5)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t0 = time.monotonic()
        visits(url, WARM_UP, SOAK_SESSIONS)
        wall = time.monotonic() - t0
        done.set()
        watcher.join()
        after = settle(url.pid, IDLE_S + 6)
        held = held_after_sweeps(log)
        print(f"\nsoak: {SOAK_SESSIONS} sessions in {wall:.0f} s; RSS {start:.0f} MiB at start, {warm:.0f} after "
              f"{WARM_UP} warm-up sessions, peak {peak:.0f}, {after:.0f} once idle ({after - warm:+.0f}); "
              f"held: {held}")
        assert held == {"page_states": 0, "kv_runs": 0, "isolated_engines": 0}, held
        assert after - warm <= MARGIN_MIB, (start, warm, peak, after)
