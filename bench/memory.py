"""4. Memory: KV bytes holding real tokens vs KV bytes allocated, through a mixed workload, for the paged pool
and for a contiguous cache that preallocates max_model_len tokens per request (what a static cache does)."""
import threading

from minivlm import Request, SamplingParams

from bench.timing import Row
from bench.workload import PROMPTS, scene

# (image size or None for text only, new tokens): short and long prompts, short and long answers.
MIX = [((224, 224), 16), (None, 40), ((448, 448), 8), ((112, 224), 60), (None, 5), ((336, 252), 24),
       ((168, 224), 33), (None, 70), ((112, 112), 12), ((280, 196), 50)]


def mixed_workload() -> list[tuple[Request, SamplingParams]]:
    jobs = []
    for i, (size, new_tokens) in enumerate(MIX):
        images = [scene(*size, 500 + i)] if size else []
        jobs.append((Request(prompt=PROMPTS[i % len(PROMPTS)], images=images),
                     SamplingParams(max_tokens=new_tokens, ignore_eos=True)))
    return jobs


def pool_usage(snap) -> tuple[int, int, int]:
    """(requests holding blocks, blocks in use, tokens whose K/V those blocks hold)."""
    in_use = [b for b in snap.blocks if b.ref_count > 0]
    return len(snap.block_tables), len(in_use), sum(b.num_tokens for b in in_use)


def run_collecting_snapshots(engine, jobs) -> dict:
    """Stream every job from its own thread (they share the running batch); keep one snapshot per step."""
    snaps, lock = {}, threading.Lock()

    def consume(request, params):
        for ev in engine.stream(request, params, snapshots=True):
            with lock:
                snaps[ev.snapshot.step] = ev.snapshot

    threads = [threading.Thread(target=consume, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return snaps


def measure(ctx) -> list[Row]:
    engine = ctx.engine
    engine.reset_prefix_cache()
    snaps = run_collecting_snapshots(engine, mixed_workload())
    bs, max_len = engine.config.block_size, engine.config.max_model_len
    per_token = engine.memory_report().kv_bytes_per_token
    steps = [pool_usage(s) for s in snaps.values()]
    steps = [s for s in steps if s[0] > 0]
    n, blocks, tokens = max(steps, key=lambda s: s[1])  # the step with the most KV memory allocated
    worst_waste = max((b * bs - t) / r / bs for r, b, t in steps)  # paged waste per request, over every step
    paged_alloc, contiguous_alloc, used = blocks * bs * per_token, n * max_len * per_token, tokens * per_token
    block_bytes = bs * per_token
    paged_waste, contiguous_waste = (paged_alloc - used) / n / block_bytes, (contiguous_alloc - used) / n / block_bytes
    ctx.details["memory"] = {"peak_requests": n, "peak_blocks": blocks, "peak_tokens": tokens, "steps": len(steps),
                             "paged_bytes": paged_alloc, "contiguous_bytes": contiguous_alloc, "used_bytes": used,
                             "worst_paged_waste_blocks_per_request": worst_waste}
    return [
        Row("KV used / allocated at peak (paged vs contiguous)", used / paged_alloc, used / contiguous_alloc, "",
            (used / paged_alloc) / (used / contiguous_alloc), "(context)", None,
            f"{n} requests; {paged_alloc / 2**20:.1f} MiB paged vs {contiguous_alloc / 2**20:.1f} MiB at "
            f"max_model_len={max_len}"),
        Row("KV waste per request", paged_waste, contiguous_waste, "blocks",
            contiguous_waste / max(paged_waste, 1e-9), "< 1 block", worst_waste < 1,
            f"block_size {bs}; worst over all {len(steps)} steps: {worst_waste:.2f} blocks"),
    ]
