"""3. Prefix cache: time to first token of a repeated 448x448 image + prompt under strategy C, against the
same request on a cold cache; and with the text after the image changed (only the image prefix can hit)."""
import time

from minivlm import Request, SamplingParams

from bench.timing import Row, median
from bench.workload import scene

FIRST_TOKEN = SamplingParams(max_tokens=1, ignore_eos=True)


def ttft(engine, request: Request) -> tuple[float, int]:
    """Seconds from submitting the request (processor included) to its first token, and its cached tokens."""
    t = time.perf_counter()
    out = engine.generate(request, FIRST_TOKEN)
    return time.perf_counter() - t, out.num_cached_tokens


def measure(ctx) -> list[Row]:
    engine = ctx.engine
    if engine.config.cache_strategy != "C":
        raise ValueError("the prefix-cache benchmark needs an engine with cache_strategy='C'")
    image = scene(448, 448, 11)
    prompt = "Describe everything you can see in this picture."
    times = {"cold": [], "same": [], "text": []}
    cached = {}
    for k in range(ctx.repeats):
        engine.reset_prefix_cache()  # cold: no cached blocks, no cached vision embeddings
        for name, text in (("cold", prompt), ("same", prompt), ("text", f"Question {k}: which shape is largest?")):
            seconds, cached[name] = ttft(engine, Request(prompt=text, images=[image]))
            times[name].append(seconds)
    cold, same, text = (median(times[n]) for n in ("cold", "same", "text"))
    ctx.details["prefix_cache"] = {"ttft_s": times, "cached_tokens": cached}
    return [
        Row("TTFT repeated image+prompt (C) vs cold", same, cold, "s", cold / same, ">= 5x faster", cold / same >= 5,
            f"448x448 image; {cached['same']} prompt tokens served from cache"),
        Row("TTFT same image, new text (C) vs cold", text, cold, "s", cold / text, ">= 5x faster", cold / text >= 5,
            f"{cached['text']} prompt tokens served from cache"),
    ]
