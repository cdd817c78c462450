"""A request's answer as server-sent events. The engine delivers every choice's steps through one handle (n > 1:
each event names its choice by index); each choice streams on its own: its role chunk, its text (or tool-call
deltas) with the logprobs of the tokens that text completes, its finish chunk with its `minivlm` field. Then the
usage chunk if asked for, then [DONE]. Errors after the start arrive as an error event."""
from minivlm.api import responses as fmt
from minivlm.api.errors import ApiError, from_engine
from minivlm.api.metrics import now
from minivlm.api.tool_calls import ToolCallStream


async def next_event(handle):
    """The request's next StreamEvent, awaited on the event loop (the engine's loop thread wakes it; the request
    has no thread of its own); None once it ended; its error as the API's."""
    try:
        return await anext(handle)
    except StopAsyncIteration:
        return None
    except Exception as e:  # a failed step, a stopped loop: only this request fails
        raise from_engine(e) from None


def finished_output(ev):
    if ev is None or ev.output is None or ev.output.finish_reason == "abort":
        raise ApiError(503, "the engine stopped this request (it was rebuilt or closed); send it again",
                       "service_unavailable_error", code="engine_rebuilt")
    return ev.output


class ChoiceStream:
    """One choice as it streams: step(ev) -> the chunk's choice object for this event, or None when the event
    brought nothing to send yet (its tokens' logprobs wait for the text they complete: a stop string may hold text
    back for a few steps, a tool call waits until it can be named)."""

    def __init__(self, index: int, constraint, tokenizer, top_logprobs: int | None):
        self.index, self.constraint, self.tokenizer, self.top = index, constraint, tokenizer, top_logprobs
        self.tools = None if constraint.tool_mode == "none" else \
            ToolCallStream(constraint.tool_mode, constraint.function, constraint.parallel, constraint.schemas)
        self.held, self.times = [], []

    def step(self, ev) -> dict | None:
        self.times.append(now())
        self.held.extend(zip(ev.token_ids, ev.logprobs or [None] * len(ev.token_ids)))
        if self.tools is None:
            delta = {"content": ev.delta} if ev.delta else {}
        else:
            delta = self.tools.update(ev.output.text if ev.finished else ev.text, final=ev.finished)
        if not delta and not ev.finished:
            return None
        lps = fmt.token_logprobs(self.held, self.tokenizer, self.top or 0) if self.top is not None else None
        self.held.clear()
        reason = fmt.finish_reason(ev.output.finish_reason, self.constraint.tool_mode,
                                   self.tools is not None and self.tools.called) if ev.finished else None
        return {"index": self.index, "delta": delta, "logprobs": lps, "finish_reason": reason}


async def stream_events(engine, req, model: str, created: int, arrival: float, handle, ev, constraint, metrics):
    """The SSE body of a request whose first event `ev` has arrived."""
    rid, include_usage = handle.request_id, bool(req.stream_options and req.stream_options.include_usage)
    extra = {"usage": None} if include_usage else {}
    choices = {i: ChoiceStream(i, constraint, engine.tokenizer, (req.top_logprobs or 0) if req.logprobs else None)
               for i in range(req.n)}
    outs = []

    def sse(choice: dict, **more) -> str:
        return fmt.chunk(rid, model, created, choice["delta"], choice["finish_reason"], choice["index"],
                         logprobs=choice["logprobs"], **more, **extra)

    try:
        for i in choices:
            yield fmt.chunk(rid, model, created, {"role": "assistant", "content": ""}, index=i, **extra)
        while ev is not None:
            out = finished_output(ev) if ev.finished else None
            piece = choices[ev.index].step(ev)
            if out is not None:
                outs.append(out)
                yield sse(piece, **{fmt.EXTENSION: fmt.cache_report(out, engine)})
                metrics.finished(engine, out, choices[ev.index].times, arrival)
            elif piece is not None:
                yield sse(piece)
            if len(outs) == req.n:
                break
            ev = await next_event(handle)
        if len(outs) < req.n:
            finished_output(None)  # the handle ended before every choice did
        if include_usage:
            yield fmt.chunk(rid, model, created, None, usage=fmt.usage(sorted(outs, key=lambda o: o.index)))
        yield fmt.DONE
    except ApiError as e:
        yield fmt.sse_error(e)
        yield fmt.DONE
    finally:
        handle.close()  # also when the client went away: the engine aborts the request
