"""Engine outputs -> OpenAI response objects: chat.completion (one choice per Output of the request's n),
chat.completion.chunk, usage, logprobs, and the `minivlm` extension field (the request's prefix-cache hits, true and
false)."""
import json
import math

from minivlm.api.tool_calls import message

EXTENSION = "minivlm"  # the documented name of our extra response field


def usage(outs: list) -> dict:
    """Token counts of a request's choices (the prompt once: choice 0 computed it, the others shared its blocks);
    cached_tokens = prompt tokens served from the prefix cache."""
    out, n = outs[0], sum(len(o.token_ids) for o in outs)
    return {"prompt_tokens": out.num_prompt_tokens, "completion_tokens": n, "total_tokens": out.num_prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens}}


def cache_report(out, engine) -> dict:
    """What the prefix cache did for this request (the `minivlm` field)."""
    hits = [{"block_id": h.block_id, "logical_index": h.logical_index, "false_hit": h.false_hit}
            for h in out.cache_hits]
    return {"request_id": out.request_id, "cache_strategy": engine.config.cache_strategy,
            "block_size": engine.config.block_size, "cached_tokens": out.num_cached_tokens,
            "cache_hit_blocks": len(hits), "false_hit_blocks": sum(h["false_hit"] for h in hits),
            "cache_hits": hits, "notes": list(out.notes)}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0  # JSON has no -inf (a token masked out)


def _entry(tokenizer, token_id: int, logprob: float) -> dict:
    text = tokenizer.decode([token_id])
    return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}


def token_logprobs(tokens, tokenizer, top: int) -> dict:
    """OpenAI's logprobs.content for (token id, {token: logprob}) pairs: each token's logprob and the `top` most
    likely alternatives."""
    content = []
    for token_id, dist in tokens:
        best = sorted(dist.items(), key=lambda kv: -kv[1])[:top]
        content.append({**_entry(tokenizer, token_id, dist[token_id]),
                        "top_logprobs": [_entry(tokenizer, t, lp) for t, lp in best]})
    return {"content": content, "refusal": None}


def logprobs(out, tokenizer, top: int) -> dict | None:
    """The logprobs of a whole answer (None unless the request asked for them)."""
    return None if out.logprobs is None else token_logprobs(zip(out.token_ids, out.logprobs), tokenizer, top)


def finish_reason(reason: str, mode: str, called: bool) -> str:
    """OpenAI's: "tool_calls" when the model chose to call tools (auto, required), the engine's reason otherwise (a
    named function is the answer OpenAI asked for: "stop")."""
    return "tool_calls" if called and reason == "stop" and mode in ("auto", "required") else reason


def choice(out, constraint, tokenizer, top_logprobs: int) -> dict:
    msg = message(out.text, constraint.tool_mode, constraint.function, constraint.parallel, constraint.schemas)
    return {"index": out.index, "message": msg, "logprobs": logprobs(out, tokenizer, top_logprobs),
            "finish_reason": finish_reason(out.finish_reason, constraint.tool_mode, "tool_calls" in msg)}


def cache_reports(outs: list, engine) -> dict:
    """The `minivlm` field: choice 0's prefix-cache report (it computed the prompt); with n > 1 also every choice's
    label in the KV map."""
    report = cache_report(outs[0], engine)
    return report if len(outs) == 1 else {**report, "request_ids": [o.request_id for o in outs]}


def completion(outs: list, engine, model: str, created: int, top_logprobs: int, constraint) -> dict:
    """The non-streaming response: one choice per Output (in index order)."""
    outs = sorted(outs, key=lambda o: o.index)
    return {"id": f"chatcmpl-{outs[0].request_id}", "object": "chat.completion", "created": created, "model": model,
            "choices": [choice(o, constraint, engine.tokenizer, top_logprobs) for o in outs],
            "usage": usage(outs), "system_fingerprint": None, EXTENSION: cache_reports(outs, engine)}


def chunk(request_id: str, model: str, created: int, delta: dict | None, finish_reason: str | None = None,
          index: int = 0, **extra) -> str:
    """One SSE event holding a chat.completion.chunk for choice `index` (delta None = a chunk with no choices,
    e.g. usage)."""
    choices = [] if delta is None else [{"index": index, "delta": delta, "logprobs": extra.pop("logprobs", None),
                                         "finish_reason": finish_reason}]
    body = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices, **extra}
    return f"data: {json.dumps(body)}\n\n"


def sse_error(error) -> str:
    """An error after streaming began: an event carrying the error object (the stream then ends)."""
    return f"data: {json.dumps(error.body())}\n\n"


DONE = "data: [DONE]\n\n"
