"""9. KV-event publishing: decode throughput with the engine publishing vLLM KV events against the same engine
with publishing off, side by side on the same weights; once with no subscriber, once with a subscriber process
draining the stream over loopback TCP. Also the step thread's own cost: microseconds in after_step per step."""
import socket
import subprocess
import sys
import time

from minivlm import Request, SamplingParams

from bench.timing import Row, interleaved, median
from bench.workload import scene

DRAIN = ("import sys, zmq; s = zmq.Context().socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b''); "
         "s.connect(sys.argv[1]); print('up', flush=True)\nwhile True: s.recv_multipart()")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_publisher(engine) -> dict:
    """Wrap the engine's after_step to add up the time the stepping thread spends in it."""
    pub, spent = engine.core.kv_publisher, {"s": 0.0, "steps": 0}
    inner = pub.after_step

    def after_step(core):
        t = time.perf_counter()
        inner(core)
        spent["s"] += time.perf_counter() - t
        spent["steps"] += 1
    pub.after_step = after_step
    return spent


def measure(ctx, new_tokens: int = 48, batch: int = 8) -> list[Row]:
    requests = [Request(prompt="What color is the shape?", images=[scene(160 + 16 * i, 160, i)]) for i in range(batch)]
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    lonely, watched = free_port(), free_port()
    off = ctx.engine.isolated()
    alone = ctx.engine.isolated(kv_events={"enable_kv_cache_events": True, "endpoint": f"tcp://*:{lonely}"})
    seen = ctx.engine.isolated(kv_events={"enable_kv_cache_events": True, "endpoint": f"tcp://*:{watched}"})
    sub = subprocess.Popen([sys.executable, "-c", DRAIN, f"tcp://127.0.0.1:{watched}"], stdout=subprocess.PIPE,
                           text=True)
    try:
        sub.stdout.readline()
        time.sleep(0.3)  # the subscription reaches the publisher before anything is timed
        spent = {"alone": timed_publisher(alone), "watched": timed_publisher(seen)}

        def run(engine):
            def once():
                engine.reset_prefix_cache()
                engine.generate(requests, params)
            return once
        times = interleaved({"off": run(off), "alone": run(alone), "watched": run(seen)}, 3 * ctx.repeats)
    finally:
        for e in (off, alone, seen):
            e.close()  # a publisher's close sends what is still queued
        sub.kill()
        sub.wait()
    stats = {"alone": alone.kv_events_stats(), "watched": seen.kv_events_stats()}
    t_off, tokens = median(times["off"]), batch * new_tokens
    per_step = {k: 1e6 * v["s"] / max(1, v["steps"]) for k, v in spent.items()}
    ctx.details["kv_events_overhead"] = {"times_s": times, "publisher": stats, "after_step_us": per_step}
    rows = []
    for name, label in (("alone", "no subscriber"), ("watched", "a subscriber over loopback")):
        t = median(times[name])
        slower = t / t_off - 1
        rows.append(Row(f"decode throughput, KV events published ({label}) vs off", tokens / t, tokens / t_off,
                        "tok/s", t_off / t, "<= 3% slower", slower <= 0.03,
                        f"{per_step[name]:.0f} µs/step in after_step; {stats[name]['batches']} batches sent, "
                        f"{stats[name].get('dropped_hwm', 0)} dropped; {slower:+.1%} wall time"))
    return rows
