"""5. Panel overhead: a request streamed with a KV snapshot at every step (what the app's panels consume)
against the same request through generate()."""
from minivlm import Request, SamplingParams

from bench.timing import Row, interleaved, median
from bench.workload import scene


def measure(ctx, new_tokens: int = 64) -> list[Row]:
    engine = ctx.engine
    request = Request(prompt="What color is the shape?", images=[scene(224, 224, 3)])
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    steps = []

    def run_generate():
        engine.reset_prefix_cache()
        engine.generate(request, params)

    def run_stream():
        engine.reset_prefix_cache()
        steps.append(sum(ev.snapshot is not None for ev in engine.stream(request, params, snapshots=True)))

    # each run is short, so take three times the usual repeats: a single scheduler hiccup is a large share of it
    times = interleaved({"generate": run_generate, "stream": run_stream}, 3 * ctx.repeats)
    gen, stream = median(times["generate"]), median(times["stream"])
    ctx.details["panel_overhead"] = {"times_s": times, "snapshots_per_run": steps}
    slower = stream / gen - 1
    return [Row("stream() + snapshot every step vs generate()", stream, gen, "s", stream / gen, "<= 10% slower",
                slower <= 0.10, f"{steps[-1]} snapshots of a {engine.num_blocks}-block pool; {slower:+.1%}")]
