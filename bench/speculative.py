"""11. Speculative decoding (n-gram prompt lookup), on vs off side by side: decode tok/s of one request on a
copy-heavy workload (an answer that repeats what came before: a random model's greedy answer falls into a loop
within a few dozen tokens, which is what lookup finds) and on one where lookup finds (almost) nothing (sampled at
temperature 1 from a random model, whose answer repeats no 3-gram: every step pays the search); acceptance rate and mean
accepted length; and HF transformers' own prompt-lookup decoding (generate(prompt_lookup_num_tokens=k)) on the same
checkpoint, its acceptance read from how many forwards it ran."""
import time

import torch

from minivlm import Request, SamplingParams

from bench.timing import Row, TokenClock, median, spread
from bench.workload import hf_inputs, scene

K = 4


def engine_run(engine, request: Request, new_tokens: int, temperature: float = 0.0) -> tuple[float, list[int], tuple]:
    """Decode tok/s, tokens, and the speculation counters this run added (drafts, draft tokens, accepted)."""
    engine.reset_prefix_cache()
    before = engine.spec_decode_stats()
    times, last = [], None
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=temperature, seed=0)
    for last in engine.stream(request, params, snapshots=False):
        times.extend([time.perf_counter()] * len(last.token_ids))  # a speculating step delivers several tokens
    after = engine.spec_decode_stats()
    added = (0, 0, 0) if after is None else (after.num_drafts - before.num_drafts, after.num_draft_tokens -
                                             before.num_draft_tokens, after.num_accepted_tokens - before.num_accepted_tokens)
    return (len(times) - 1) / (times[-1] - times[0]), last.output.token_ids, added


def hf_run(model, processor, request: Request, new_tokens: int, lookup: int | None) -> tuple[float, list[int], int]:
    """HF generate's decode tok/s (with prompt lookup when asked), tokens, and the decoder forwards it ran."""
    inputs = hf_inputs(processor, [request], model.device)
    calls = []
    hook = model.model.language_model.register_forward_hook(lambda *a: calls.append(1))
    clock = TokenClock()
    try:
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=processor.tokenizer.pad_token_id, streamer=clock,
                                 **({"prompt_lookup_num_tokens": lookup} if lookup else {}))
    finally:
        hook.remove()
    n = inputs["input_ids"].shape[1]
    gen = out[0, n:].tolist()
    return (len(gen) - 1) / (clock.times[-1] - clock.times[0]) if len(clock.times) > 1 else 0.0, gen, len(calls)


def measure(ctx, new_tokens: int = 96) -> list[Row]:
    request = Request(prompt="Describe the image in one sentence.", images=[scene(224, 224, 7)])
    rows = []
    spec_on = ctx.engine.isolated(speculative_config={"method": "ngram", "num_speculative_tokens": K,
                                                      "prompt_lookup_max": 4, "prompt_lookup_min": 1})
    spec_none = ctx.engine.isolated(speculative_config={"method": "ngram", "num_speculative_tokens": K,
                                                        "prompt_lookup_max": 4, "prompt_lookup_min": 3})
    try:
        for name, spec, temp in (("copy-heavy (its answer repeats)", spec_on, 0.0), ("no n-gram found", spec_none, 1.0)):
            rates, same, counts = {"on": [], "off": []}, True, (0, 0, 0)
            for _ in range(ctx.repeats):  # interleaved: off, on, off, on, ...
                off, ref, _ = engine_run(ctx.engine, request, new_tokens, temp)
                on, ids, added = engine_run(spec, request, new_tokens, temp)
                rates["off"].append(off)
                rates["on"].append(on)
                same &= ids == ref
                counts = tuple(a + b for a, b in zip(counts, added))
            drafts, drafted, accepted = counts
            on, off = median(rates["on"]), median(rates["off"])
            accept = f"acceptance {accepted / drafted:.0%}, mean accepted {accepted / drafts:.2f} of {drafted / drafts:.1f}" \
                if drafts else "no step found a guess"
            ctx.details[f"speculative {name}"] = {"rates": rates, "drafts": drafts, "draft_tokens": drafted,
                                                  "accepted": accepted}
            goal, ok = (">= 1.3x", on / off >= 1.3) if spec is spec_on else (">= 0.95x", on / off >= 0.95)
            rows.append(Row(f"speculative decode, {name}: on vs off", on, off, "tok/s", on / off, goal, ok,
                            f"{new_tokens} tokens, k={K}, {'greedy' if not temp else 'sampled'}; {accept}",
                            same=f"{int(same)}/1" if not temp else "",
                            spread=spread(rates["on"], rates["off"], "tok/s")))
        # HF's prompt lookup proposes the prompt's image placeholders as guesses and then fails ("Image features
        # and image tokens do not match"), so the comparison runs a text request on both sides
        text = Request(prompt="Describe a red circle and a blue square, then describe them again.")
        hf_on, hf_ids, forwards = hf_run(ctx.hf_model, ctx.hf_processor, text, new_tokens, K)
        hf_off, hf_ref, _ = hf_run(ctx.hf_model, ctx.hf_processor, text, new_tokens, None)
        hf_per_forward = (len(hf_ids) - 1) / max(1, forwards - 1)  # tokens per decode forward (the first is prefill)
        on, ids, (drafts, _, accepted) = engine_run(spec_on, text, new_tokens)
        steps = (new_tokens - 1 - accepted) if drafts else new_tokens - 1  # decode forwards the engine ran for it
        ctx.details["speculative hf"] = {"on": hf_on, "off": hf_off, "forwards": forwards, "engine_tok_s": on}
        rows.append(Row("HF prompt lookup, text request: on vs off", hf_on, hf_off, "tok/s", hf_on / hf_off, "", None,
                        f"tokens per decode forward: HF {hf_per_forward:.2f}, minivlm {(new_tokens - 1) / steps:.2f} "
                        f"(minivlm on: {on:.1f} tok/s)", same=f"{int(hf_ids == hf_ref == ids)}/1"))
    finally:
        spec_on.close()
        spec_none.close()
    return rows
