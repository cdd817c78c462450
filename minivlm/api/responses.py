"""Engine outputs -> OpenAI response objects: chat.completion, chat.completion.chunk, usage, logprobs, and the
`minivlm` extension field (the request's prefix-cache hits, true and false)."""
import json
import math

EXTENSION = "minivlm"  # the documented name of our extra response field


def usage(out) -> dict:
    """Token counts; cached_tokens = prompt tokens served from the prefix cache."""
    n = len(out.token_ids)
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


def completion(out, engine, model: str, created: int, top_logprobs: int) -> dict:
    """The non-streaming response."""
    return {"id": f"chatcmpl-{out.request_id}", "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text, "refusal": None},
                         "logprobs": logprobs(out, engine.tokenizer, top_logprobs),
                         "finish_reason": out.finish_reason}],
            "usage": usage(out), "system_fingerprint": None, EXTENSION: cache_report(out, engine)}


def chunk(request_id: str, model: str, created: int, delta: dict | None, finish_reason: str | None = None,
          **extra) -> str:
    """One SSE event holding a chat.completion.chunk (delta None = a chunk with no choices, e.g. usage)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": extra.pop("logprobs", None),
                                         "finish_reason": finish_reason}]
    body = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices, **extra}
    return f"data: {json.dumps(body)}\n\n"


def sse_error(error) -> str:
    """An error after streaming began: an event carrying the error object (the stream then ends)."""
    return f"data: {json.dumps(error.body())}\n\n"


DONE = "data: [DONE]\n\n"
