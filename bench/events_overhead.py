"""6. Event-log overhead: decode throughput with the engine's event log on against the same engine with it off
(event_log_size=0), on the same weights, run side by side. The overhead is the median of the on/off ratios of
neighbouring runs (each pair ran within a second, so the machine's drift cancels): on a 2-core VM single runs of
this 1 s workload spread by 20-40 %, several times the 3 % the row looks for."""
from minivlm import Request, SamplingParams

from bench.timing import Row, interleaved, median
from bench.workload import scene


def measure(ctx, new_tokens: int = 48, batch: int = 8) -> list[Row]:
    requests = [Request(prompt="What color is the shape?", images=[scene(160 + 16 * i, 160, i)]) for i in range(batch)]
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    logged = ctx.engine.isolated()  # the default ring log
    silent = ctx.engine.isolated(event_log_size=0)
    counts = []

    def run(engine):
        def once():
            engine.reset_prefix_cache()
            engine.generate(requests, params)
        return once

    times = interleaved({"on": run(logged), "off": run(silent)}, 7 * ctx.repeats)
    counts.append(len(logged.events()))
    logged.close(), silent.close()
    on, off = median(times["on"]), median(times["off"])
    ctx.details["events_overhead"] = {"times_s": times, "events_logged": counts}
    slower = median([a / b for a, b in zip(times["on"], times["off"])]) - 1
    tokens = batch * new_tokens
    return [Row("decode throughput, event log on vs off", tokens / on, tokens / off, "tok/s", 1 / (1 + slower),
                "<= 3% slower", slower <= 0.03, f"{counts[-1]} events kept; {slower:+.1%} wall time (median of "
                f"{len(times['on'])} neighbouring pairs)")]
