"""tools/gpu_check's chunked-prefill rows: on the device, two streams decode while a 448x448-image request is
prefilled in chunks sized by the adaptive token budget; its tokens must equal the unchunked engine's, and the
chunk sizes the budget chose (with the step times it measured) are reported."""
from statistics import median

from minivlm import Request, SamplingParams
from minivlm.config import DEFAULT_STEP_SLOWDOWN
from minivlm.experiments.mm_cache import BLUE, shape_image


def chunked_rows(engine, check) -> list:
    """`engine`: a loaded engine (not chunked); `check(name, status, detail)` makes a row of the table."""
    long = Request(prompt="Describe.", images=[shape_image(BLUE, size=(448, 448))], request_id="long")
    streams = [Request(prompt=f"Count from one to {n}.", request_id=f"s{n}") for n in (9, 20)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    want = engine.generate(long, params).token_ids
    with engine.isolated(enable_chunked_prefill=True, max_num_batched_tokens=512,
                         max_step_slowdown=DEFAULT_STEP_SLOWDOWN, event_log_size=50_000, num_blocks=512,
                         block_size=16) as eng, eng.loop.lock:
        core = eng.core
        core.step([eng.make_sequence(r, SamplingParams(max_tokens=400, ignore_eos=True)) for r in streams])
        for _ in range(8):  # decode-only steps: the budget measures them
            core.step([])
        seq, new = eng.make_sequence(long, params), None
        new = [seq]
        while seq.finish_reason is None:
            core.step(new)
            new = []
        mixed = [ev for ev in core.events.since(0) if ev.kind == "scheduled" and ev.step_kind == "mixed"]
        got = seq.output_ids
    chunks = [ev.num_scheduled_tokens["long"] for ev in mixed if "long" in ev.num_scheduled_tokens]
    last = mixed[-1].budget if mixed else {}
    return [check("chunked prefill, adaptive budget: tokens equal unchunked", "pass" if got == want else "FAIL",
                  f"{len(chunks)} mixed steps"),
            check("chunked prefill, adaptive budget: chunks chosen", "info",
                  f"median {median(chunks) if chunks else 0} tokens (first {chunks[:6]}); decode step "
                  f"{last.get('decode_ms')} ms, per prompt token {last.get('token_ms')} ms, fixed "
                  f"{last.get('fixed_ms')} ms")]
