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
from minivlm.api.constraints import check_tools, constraint as read_constraint, renamed
from minivlm.api.errors import ApiError, from_engine
from minivlm.api.media import engine_messages
from minivlm.api.metrics import ApiMetrics, now
from minivlm.api.protocol import ChatCompletionRequest, parse_request, sampling_params
from minivlm.api.streaming import finished_output, next_event, stream_events
from minivlm.config import DEFAULT_MODEL
from minivlm.engine.request import Request, SamplingParams
from minivlm.refusals import Refused

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


def engine_tools(req: ChatCompletionRequest) -> dict:
    """The request's tools for the chat template (a template that knows tools, e.g. Qwen's, lists them in the
    prompt and tells the model its <tool_call> format); none for tool_choice none, as vLLM's --exclude-tools-when-
    tool-choice-none would."""
    if not req.tools or req.tool_choice == "none":
        return {}
    return {"tools": [t.model_dump(exclude_none=True) for t in req.tools]}


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
        constraint = read_constraint(req)
        messages = await run_in_threadpool(engine_messages, req, settings.allowed_media_domains)
        await run_in_threadpool(check_tools, engine, req)  # a compile may take a while: off the event loop
        engine_request = Request(messages=messages, cache_salt=cache_salt(key, req), request_id=label(req),
                                 **engine_tools(req))
        try:
            limit = req.max_completion_tokens or req.max_tokens or \
                await run_in_threadpool(default_max_tokens, engine, engine_request)
            params = sampling_params(req, generation_defaults(engine), limit, constraint.structured)
        except ValueError as e:
            raise from_engine(e) from None
        arrival, created = now(), int(time.time())
        try:  # rendered, grammar compiled and checked off the event loop: a refusal raises here, before anything runs
            handle = await run_in_threadpool(engine.submit, engine_request, params)
        except Refused as e:
            raise renamed(e, constraint.field) from None
        except Exception as e:
            raise from_engine(e) from None
        try:
            first = await next_event(handle)  # a failed first step is still an HTTP error, not an SSE event
        except BaseException:
            handle.close()
            raise
        if req.stream:
            return StreamingResponse(stream_events(engine, req, model, created, arrival, handle, first, constraint,
                                                   metrics),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        watcher = asyncio.create_task(abort_on_disconnect(request, handle))
        try:
            outs, times, ev = [], {}, first
            while ev is not None:
                times.setdefault(ev.index, []).append(now())
                if ev.finished:
                    outs.append(finished_output(ev))
                    if len(outs) == req.n:
                        break
                ev = await next_event(handle)
        finally:
            handle.close()
            watcher.cancel()
        if len(outs) < req.n:
            finished_output(None)  # the handle ended before every choice did
        for out in outs:
            metrics.finished(engine, out, times[out.index], arrival)
        return JSONResponse(fmt.completion(outs, engine, model, created, req.top_logprobs or 0, constraint))

    async def abort_on_disconnect(request: HttpRequest, handle):
        """A non-streaming client that hangs up stops its request too (streams notice on their next write)."""
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        handle.close()

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
