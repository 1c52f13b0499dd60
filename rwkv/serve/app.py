"""The OpenAI-compatible HTTP API on FastAPI (``build_app``).

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (``stream: true`` answers
server-sent events, one chunk per text piece, then ``data: [DONE]``), ``GET /v1/models``,
``GET /health`` and ``GET /metrics`` (Prometheus). Every error is OpenAI's JSON error body with
its status: 400 for a bad request (malformed JSON, wrong types, values out of range, empty or too
long prompts), 404 for an unknown model or path, 413 for an oversized body, 429 with
``Retry-After`` when the queue is full. A client that disconnects (streaming or not) has its
request dropped from the batch at the next step.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .protocol import ApiError, ChatRequest, CompletionRequest, validation_message
from .server import EventStream, Server, completion_body, request_id

#: How often a non-streaming request checks whether its client is still connected.
DISCONNECT_POLL_S = 0.25


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class _Guard:
    """ASGI middleware (not Starlette's BaseHTTPMiddleware, which hides client disconnects from
    the endpoints): refuses bodies over ``limit`` bytes with 413, declared or streamed, and
    counts every answer in the requests metric by endpoint and status."""

    def __init__(self, app, server: Server, limit: int):
        self.app, self.server, self.limit = app, server, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path.startswith("/v1/") else "other"
        status = [500]

        async def counted_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        too_big = ApiError(413, f"the request body is larger than this server's limit of {self.limit} bytes")
        size = dict(scope.get("headers") or []).get(b"content-length")
        try:
            if size is not None and (not size.isdigit() or int(size) > self.limit):
                return await _error(too_big)(scope, receive, counted_send)
            seen = [0]

            async def limited_receive():
                message = await receive()
                if message["type"] == "http.request":
                    seen[0] += len(message.get("body", b""))
                    if seen[0] > self.limit:
                        raise too_big
                return message

            await self.app(scope, limited_receive, counted_send)
        finally:
            self.server.metrics.requests.labels(endpoint, str(status[0])).inc()


def build_app(server: Server, *, max_body_bytes: int | None = None) -> FastAPI:
    """The FastAPI app serving ``server``. ``max_body_bytes``: larger bodies get 413 (default:
    room for the prompt limit in any encoding)."""
    app = FastAPI(title="rwkv", description="OpenAI-compatible API for RWKV models")
    app.state.server = server
    limit = max_body_bytes or 64 * server.config.max_prompt_tokens + (1 << 20)

    app.add_middleware(_Guard, server=server, limit=limit)

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return _error(e)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, e: RequestValidationError):
        message, param = validation_message(e.errors())
        return _error(ApiError(400, message, param=param))

    @app.exception_handler(Exception)
    async def internal(request, e: Exception):  # a bug: answered, never fatal to the server
        return _error(ApiError(500, f"internal error: {type(e).__name__}", type="server_error"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, e: StarletteHTTPException):
        kind = "not_found" if e.status_code == 404 else "invalid_request_error"
        return _error(ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", type=kind))

    @app.get("/health")
    async def health():
        s = server.scheduler
        if not s.alive:
            return _error(ApiError(503, "the engine thread has stopped", type="service_unavailable"))
        return {"status": "ok", "model": server.config.model_name, **s.stats()}

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.config.model_name, "object": "model",
                                            "created": server.created, "owned_by": "rwkv"}]}

    @app.get("/v1/models/{name}")
    async def model(name: str):
        server.check_model(name)
        return {"id": name, "object": "model", "created": server.created, "owned_by": "rwkv"}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await _answer(server, request, req, "completion", server.completion_job)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        return await _answer(server, request, req, "chat", server.chat_job)

    return app


async def _answer(server: Server, request: Request, req, kind: str, make_job):
    events = EventStream()
    job = make_job(req, events.emit)  # ApiError for a bad request: nothing scheduled
    server.submit(job)  # QueueFull: 429
    rid = request_id("cmpl" if kind == "completion" else "chatcmpl")
    model, created = server.config.model_name, server.created
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventSourceResponse(_stream(events, job, kind, rid, model, created, include_usage),
                                   ping=15, sep="\n")
    try:
        text = []
        checked = time.monotonic()
        while True:
            try:
                event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                event = None
            if time.monotonic() - checked >= DISCONNECT_POLL_S:  # (events may never pause)
                checked = time.monotonic()
                if await request.is_disconnected():
                    job.cancel()
                    server.scheduler.wake()
                    return Response(status_code=499)
            if event is None:
                continue
            if event[0] == "text":
                text.append(event[1])
            elif event[0] == "error":
                raise event[1]
            else:
                _, reason, usage = event
                return completion_body(kind, rid, model, created, "".join(text), reason, usage)
    except asyncio.CancelledError:
        job.cancel()
        server.scheduler.wake()
        raise


async def _stream(events: EventStream, job, kind: str, rid: str, model: str, created: int, include_usage: bool):
    chunk_kind = "completion" if kind == "completion" else "chunk"
    try:
        if kind == "chat":  # the first chunk carries the role, as OpenAI's do
            first = completion_body(chunk_kind, rid, model, created, "", None)
            first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            yield {"data": json.dumps(first)}
        while True:
            event = await events.get()
            if event[0] == "text":
                yield {"data": json.dumps(completion_body(chunk_kind, rid, model, created, event[1], None))}
            elif event[0] == "error":
                yield {"data": json.dumps(event[1].body())}
                break
            else:
                _, reason, usage = event
                last = completion_body(chunk_kind, rid, model, created, None if kind == "chat" else "", reason,
                                       None if include_usage else usage)
                yield {"data": json.dumps(last)}
                if include_usage:
                    tail = completion_body(chunk_kind, rid, model, created, None, None, usage)
                    tail["choices"] = []
                    yield {"data": json.dumps(tail)}
                break
        yield {"data": "[DONE]"}
    finally:  # also when the client went away and the response was cancelled: the engine drops
        job.cancel()  # the job at its next step (a finished job is no longer there)
