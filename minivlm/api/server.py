"""The HTTP API as a FastAPI router over the serving engine: POST /v1/chat/completions (OpenAI format, SSE
streaming), GET /v1/models, GET /metrics. The router asks `get_engine()` for the engine on every request, so it
always uses the one currently serving (the app swaps engines on a rebuild)."""
import asyncio
import hashlib
import hmac
import itertools
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable

from fastapi import APIRouter, Request as HttpRequest
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from huggingface_hub import try_to_load_from_cache
from prometheus_client import CONTENT_TYPE_LATEST

from minivlm.api import responses as fmt
from minivlm.api.errors import ApiError, from_engine
from minivlm.api.media import engine_messages
from minivlm.api.metrics import ApiMetrics, now
from minivlm.api.protocol import ChatCompletionRequest, parse_request, sampling_params
from minivlm.config import DEFAULT_MODEL
from minivlm.engine.request import Request, SamplingParams

log = logging.getLogger("minivlm")
MAX_BODY_BYTES = 64 * 2**20
DISCONNECT_POLL_S = 0.25
_ids = itertools.count(1)


@dataclass
class ApiSettings:
    """Who may call the API and what it may fetch. On a shared deployment the API is off unless a key is set,
    and every key (and every `user` under it) gets its own cache salt."""
    api_keys: list[str] = field(default_factory=list)
    shared: bool = False
    allowed_media_domains: list[str] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys) or not self.shared


class OpenAIRoute(APIRoute):
    """Any ApiError raised while handling a request becomes its OpenAI-format error response."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def handle(request):
            try:
                return await handler(request)
            except ApiError as e:
                return e.response({"WWW-Authenticate": "Bearer"} if e.status == 401 else None)
            except Exception as e:
                log.exception("API request failed")
                return ApiError(500, f"internal error ({type(e).__name__}: {e})", "server_error").response()
        return handle


def model_id(engine) -> str:
    """The served model's id: the hub id or path the engine was built from, as given ("tiny-qwen-vl" for the
    shipped default, whose path is this server's business)."""
    return "tiny-qwen-vl" if engine.config.model == DEFAULT_MODEL else engine.config.model


def generation_defaults(engine) -> dict:
    """Sampling defaults the checkpoint ships (generation_config.json), as vLLM applies them; do_sample=false
    means greedy. Fields a request sets win; absent everywhere, OpenAI's defaults apply."""
    model = engine.config.model
    path = os.path.join(model, "generation_config.json") if os.path.isdir(model) else \
        try_to_load_from_cache(model, "generation_config.json")  # a hub id: the copy the loader downloaded
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, TypeError, ValueError):
        return {}
    out = {k: cfg[k] for k in ("temperature", "top_p", "top_k") if isinstance(cfg.get(k), (int, float))}
    if cfg.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


async def next_event(handle):
    """The request's next StreamEvent, awaited on the event loop (the engine's loop thread wakes it; the request
    has no thread of its own); None once it ended; its error as the API's."""
    try:
        return await anext(handle)
    except StopAsyncIteration:
        return None
    except Exception as e:  # a failed step, a stopped loop: only this request fails
        raise from_engine(e) from None


def default_max_tokens(engine, request: Request) -> int:
    """vLLM's default: the room the context leaves. The context is max_model_len, or the whole KV pool when a
    pinned pool is smaller; only then is the prompt rendered here to measure it."""
    pool = engine.num_blocks * engine.config.block_size
    if pool >= engine.config.max_model_len:
        return engine.config.max_model_len
    return max(1, pool - engine.make_sequence(request, SamplingParams(max_tokens=1)).num_prompt_tokens)


def create_router(get_engine: Callable, settings: ApiSettings | None = None) -> APIRouter:
    """The API's routes; mount with app.include_router(router). get_engine() returns the engine serving now."""
    settings = settings or ApiSettings()
    metrics = ApiMetrics(get_engine, model_id)
    router = APIRouter(route_class=OpenAIRoute)

    def authorize(request: HttpRequest) -> str | None:
        """The caller's API key (None when no key is configured); refuses the request otherwise."""
        if not settings.enabled:
            raise ApiError(403, "the HTTP API is off on this shared deployment; the operator turns it on by setting "
                                "an API key (--api-key or MINIVLM_API_KEY)", "permission_error", code="api_disabled")
        if not settings.api_keys:
            return None
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and any(hmac.compare_digest(token.encode(), k.encode())
                                              for k in settings.api_keys):
            return token
        raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                       code="invalid_api_key")

    def cache_salt(key: str | None, req: ChatCompletionRequest) -> str | None:
        """Shared deployment: a salt per key and `user`, so callers never share KV blocks (no timing side
        channel). Locally, API and UI requests share the cache unless the request sets cache_salt."""
        if not settings.shared:
            return req.cache_salt
        who = hashlib.sha256((key or "").encode()).hexdigest()[:16]
        return f"api:{who}:{req.user or ''}:{req.cache_salt or ''}"

    def label(req: ChatCompletionRequest) -> str:
        """The request's id in the KV map: api-N, or api-<user>-N locally, so a class sees whose request is whose
        (on a shared deployment user names stay private)."""
        user = re.sub(r"[^A-Za-z0-9_.]", "", req.user or "")[:16]
        return f"api-{user}-{next(_ids)}" if user and not settings.shared else f"api-{next(_ids)}"

    async def read_body(request: HttpRequest) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body over {MAX_BODY_BYTES // 2**20} MiB", code="request_too_large")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > MAX_BODY_BYTES:
                raise ApiError(413, f"request body over {MAX_BODY_BYTES // 2**20} MiB", code="request_too_large")
        return bytes(body)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: HttpRequest):
        key = authorize(request)
        req = parse_request(await read_body(request))
        engine = await run_in_threadpool(get_engine)  # waits while a rebuild runs, off the event loop
        model = model_id(engine)
        if req.model not in (model, os.path.basename(model.rstrip("/"))):
            raise ApiError(404, f"the model {req.model!r} does not exist; this server serves {model!r}",
                           param="model", code="model_not_found")
        messages = await run_in_threadpool(engine_messages, req, settings.allowed_media_domains)
        engine_request = Request(messages=messages, cache_salt=cache_salt(key, req), request_id=label(req))
        try:
            limit = req.max_completion_tokens or req.max_tokens or \
                await run_in_threadpool(default_max_tokens, engine, engine_request)
            params = sampling_params(req, generation_defaults(engine), limit)
        except ValueError as e:
            raise from_engine(e) from None
        arrival, created = now(), int(time.time())
        try:  # rendered and checked off the event loop: a refusal raises here, before anything is queued
            handle = await run_in_threadpool(engine.submit, engine_request, params)
        except Exception as e:
            raise from_engine(e) from None
        try:
            first = await next_event(handle)  # a failed first step is still an HTTP error, not an SSE event
        except BaseException:
            handle.close()
            raise
        if req.stream:
            return StreamingResponse(stream_events(engine, req, model, created, arrival, handle, first),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        watcher = asyncio.create_task(abort_on_disconnect(request, handle))
        try:
            ev, times = first, []
            while ev is not None and not ev.finished:
                times.append(now())
                ev = await next_event(handle)
        finally:
            handle.close()
            watcher.cancel()
        out = finished_output(ev)
        metrics.finished(engine, out, times + [now()], arrival)
        return JSONResponse(fmt.completion(out, engine, model, created, req.top_logprobs or 0))

    async def abort_on_disconnect(request: HttpRequest, handle):
        """A non-streaming client that hangs up stops its request too (streams notice on their next write)."""
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        handle.close()

    def finished_output(ev):
        if ev is None or ev.output is None or ev.output.finish_reason == "abort":
            raise ApiError(503, "the engine stopped this request (it was rebuilt or closed); send it again",
                           "service_unavailable_error", code="engine_rebuilt")
        return ev.output

    async def stream_events(engine, req, model, created, arrival, handle, ev):
        """SSE: a role chunk, one chunk per step with new text (and the logprobs of the tokens it completes), a
        finish chunk (the last text and logprobs, the minivlm field), the usage chunk if asked for, then [DONE].
        Errors after the start arrive as an error event."""
        rid, include_usage = ev.request_id, bool(req.stream_options and req.stream_options.include_usage)
        extra = {"usage": None} if include_usage else {}
        times, held = [], []  # held: (token, logprobs) of the tokens whose text has not been sent yet

        def hold(ev):
            held.extend(zip(ev.token_ids, ev.logprobs or [None] * len(ev.token_ids)))

        def text_chunk(ev, finish_reason=None, **more):
            """The step's new text with the logprobs of the tokens it completes (a stop string may hold text
            back for a few steps: those tokens' logprobs wait with it)."""
            hold(ev)
            lps = fmt.token_logprobs(held, engine.tokenizer, req.top_logprobs or 0) if req.logprobs else None
            held.clear()
            return fmt.chunk(rid, model, created, {"content": ev.delta} if ev.delta else {}, finish_reason,
                             logprobs=lps, **more, **extra)

        try:
            yield fmt.chunk(rid, model, created, {"role": "assistant", "content": ""}, **extra)
            while not ev.finished:
                times.append(now())
                if ev.delta:
                    yield text_chunk(ev)
                else:
                    hold(ev)
                ev = await next_event(handle)
                if ev is None:
                    break
            out = finished_output(ev)
            times.append(now())
            yield text_chunk(ev, out.finish_reason, **{fmt.EXTENSION: fmt.cache_report(out, engine)})
            if include_usage:
                yield fmt.chunk(rid, model, created, None, usage=fmt.usage(out))
            metrics.finished(engine, out, times, arrival)
            yield fmt.DONE
        except ApiError as e:
            yield fmt.sse_error(e)
            yield fmt.DONE
        finally:
            handle.close()  # also when the client went away: the engine aborts the request

    @router.get("/v1/models")
    async def list_models(request: HttpRequest):
        authorize(request)
        engine = await run_in_threadpool(get_engine)
        model = model_id(engine)
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "minivlm",
                                            "root": model, "max_model_len": engine.config.max_model_len}]}

    @router.get("/metrics")
    def scrape():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return router
