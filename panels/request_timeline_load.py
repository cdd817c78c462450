"""The Timeline tab's load generator: N image requests arriving R per second, prompts of three lengths in turn, for
at most T seconds, on an engine of the session's own (isolated from the engine everyone else is served by, closed
when the run ends). A run is its event log: the timeline, the percentiles and the step histogram are read from it
afterwards. Two runs differ in one setting (SETTINGS); one run at a time per process, as the CPU is shared."""
import os
import threading
import time
from dataclasses import dataclass

from minivlm import Request, SamplingParams

from panels.holder import EXAMPLES_DIR
from panels.sessions import collect_before_an_engine

# shared deployment? -> (most requests, most requests a second, most seconds): the limits a refusal names
LIMITS = {False: (32, 20.0, 60.0), True: (12, 8.0, 20.0)}
LEAST = (1, 0.1, 1.0)
POOL_BLOCKS = 96          # each run's KV pool (the smaller pool of its setting: SMALL_POOL_BLOCKS)
SMALL_POOL_BLOCKS = 24    # one long request and a short one: the newest are preempted and recompute
CHUNK_TOKENS = 64         # chunked prefill's token budget per step, fixed (no adaptive budget): chunks are visible
MAX_TOKENS = 24
IMAGES = ("red_circle.png", "two_shapes.png", "blue_circle.png", "three_shapes.png")
PROMPTS = ("What color is the shape?",
           "Describe the picture in one sentence: the shapes, their colors and where they are.",
           "You are looking at a small synthetic picture made for a lesson about inference engines. List every "
           "shape you can see, give the color of each one, say whether any two of them touch or overlap, and end "
           "with a short sentence about what the picture would look like if every shape were twice as large.")
ADAPTIVE = {"enable_chunked_prefill": True, "max_num_batched_tokens": 512, "max_step_slowdown": 1.3}
# each setting: (the run without it, the run with it), as EngineConfig overrides of an isolated engine
SETTINGS = {
    "chunked": ({"enable_chunked_prefill": False},
                {"enable_chunked_prefill": True, "max_num_batched_tokens": CHUNK_TOKENS, "max_step_slowdown": None}),
    # both with the adaptive chunk budget, under which the tower runs only in the slices the steps lend it
    "async_vision": tuple({"async_vision": on, **ADAPTIVE} for on in (False, True)),
    "small_pool": ({}, {"num_blocks": SMALL_POOL_BLOCKS}),
    "speculation": ({"speculative_config": None},
                    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}),
}
_running = threading.Lock()  # one load run at a time in this process


class Busy(RuntimeError):
    """Another session's load run holds the machine."""


@dataclass
class LoadRun:
    setting: str
    enabled: bool
    events: list          # every event of the run, from its isolated engine's log
    submitted: int
    aborted: int          # still running when T ran out: aborted
    seconds: float        # wall time from the first arrival to the last answer (or T)


def check_limits(n, rate, seconds, shared: bool) -> str | None:
    """Why these inputs are refused (which one, and its limit), or None."""
    most = LIMITS[shared]
    for name, value, low, high in zip(("requests", "rate", "seconds"), (n, rate, seconds), LEAST, most):
        if not isinstance(value, (int, float)) or value != value or not low <= value <= high:
            return name
    return None


def requests(n: int, salt: str | None, images: bool) -> list[Request]:
    """n requests, the three prompt lengths in turn, the example images in turn (a text model: words instead)."""
    out = []
    for i in range(n):
        prompt, image = PROMPTS[i % len(PROMPTS)], IMAGES[i % len(IMAGES)]
        if images:
            out.append(Request(prompt=prompt, images=[os.path.join(EXAMPLES_DIR, image)], cache_salt=salt,
                               request_id=f"r{i}"))
        else:
            out.append(Request(prompt=f"Imagine {image[:-4].replace('_', ' ')}. {prompt}", cache_salt=salt,
                               request_id=f"r{i}"))
    return out


def run_load(parent, n: int, rate: float, seconds: float, setting: str, enabled: bool,
             salt: str | None = None) -> LoadRun:
    """One bounded run on a fresh isolated engine; raises Busy while another run holds the process."""
    if not _running.acquire(blocking=False):
        raise Busy("another load run is in progress")
    try:
        blocks = min(parent.num_blocks, POOL_BLOCKS)  # its encoder cache: at most its pool's tokens (as a KV run's)
        overrides = {"num_blocks": blocks, "encoder_cache_size": blocks * parent.config.block_size,
                     "vision_cache_bytes": None, **SETTINGS[setting][int(enabled)]}
        collect_before_an_engine()
        engine = parent.isolated(**overrides)
        try:
            return _drive(engine, requests(int(n), salt, engine.family.images != "none"), rate, seconds,
                          setting, enabled)
        finally:
            engine.close()
    finally:
        _running.release()


def _drive(engine, reqs: list[Request], rate: float, seconds: float, setting: str, enabled: bool) -> LoadRun:
    since = engine.snapshot().last_event_seq
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    handles, drains = [], []
    t0 = time.perf_counter()
    deadline = t0 + seconds
    for i, req in enumerate(reqs):
        at = t0 + i / rate  # arrivals paced at the rate; the engine's clock times what happens to them
        if at > deadline:
            break
        time.sleep(max(0.0, at - time.perf_counter()))
        h = engine.submit(req, params)
        handles.append(h)
        drains.append(threading.Thread(target=_drain, args=(h,), daemon=True))
        drains[-1].start()
    for d in drains:
        d.join(max(0.0, deadline - time.perf_counter()))
    aborted = sum(not h.finished for h in handles)
    for h in handles:
        h.close()  # past T: what still runs is aborted
    for d in drains:
        d.join(5)
    return LoadRun(setting, enabled, engine.events(since), len(handles), aborted,
                   min(time.perf_counter(), deadline) - t0)


def _drain(handle):
    try:
        for _ in handle:
            pass
    except Exception:  # an aborted or failed request: the log says how it ended
        pass
