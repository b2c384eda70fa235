"""The gateway's HTTP API (design.md "Serving API"): OpenAI chat completions, models, feedback,
interactions, health and metrics.

Every completion is logged as an interaction row with what on-policy RL needs (prompt/completion token
ids, the sampled tokens' logprobs, model version, arm) and acknowledged only after it is durable: the
non-streaming response is sent after the fsync; a stream sends its last chunk and [DONE] after it.
The org always comes from the bearer token. Bad input is a 4xx JSON error naming the problem and
changes nothing stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
import weakref
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from rl_core import toolcalls
from rl_core.collect.collector import Collector
from rl_core.schema import FeedbackEvent, InteractionEvent, now_utc
from rl_core.serving.backends.base import Sampling
from rl_core.serving.metrics import Metrics
from rl_core.serving.protocol import (
    ApiError,
    ChatRequest,
    chunk,
    completion_body,
    logprobs_block,
    now_s,
    validation_error,
)
from rl_core.serving.router import NotReady, Router, UnknownModel

MAX_BATCH = 5000


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    out = tokenizer.apply_chat_template(toolcalls.to_template_messages(messages, tools), add_generation_prompt=True,
                                        tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


def _identity(req: ChatRequest, request: Request, messages: list[dict]) -> tuple[str, str, int]:
    """user_id, session_id, turn_index from the OpenAI `user` field, x-rtrl-* headers or metadata.

    Without a session id, one is derived from the user and the conversation's first message, so turns of
    one conversation share it; turn_index defaults to the number of assistant turns before this one.
    """
    md = req.metadata or {}
    h = request.headers
    user = req.user or h.get("x-rtrl-user-id") or md.get("user_id") or "anonymous"
    session = h.get("x-rtrl-session-id") or md.get("session_id")
    if not session:
        first = json.dumps(messages[0], sort_keys=True)
        session = "s-" + hashlib.sha256(f"{user}\n{first}".encode()).hexdigest()[:24]
    turn = h.get("x-rtrl-turn-index") or md.get("turn_index")
    if turn is None:
        return user, session, sum(1 for m in messages if m.get("role") == "assistant")
    if not str(turn).isdigit():
        raise ApiError(400, f"turn_index must be a non-negative integer, got {turn!r}", param="turn_index")
    return user, session, int(turn)


class _CountRequests:
    """Pure ASGI middleware counting responses by route and status (BaseHTTPMiddleware costs ~1 ms each)."""

    ROUTES = ("/v1/chat/completions", "/v1/models", "/v1/feedback", "/v1/interactions", "/healthz", "/metrics")

    def __init__(self, app, metrics: Metrics):
        self.app, self.m = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope["path"] if scope["path"] in self.ROUTES else "other"
            self.m.requests.labels(route, str(status[0])).inc()


def create_app(cfg, router: Router, collector: Collector, metrics: Metrics | None = None) -> FastAPI:
    app = FastAPI(title="rtrl gateway", docs_url=None, redoc_url=None, openapi_url=None)
    m = metrics or Metrics()
    s = cfg.serving
    tokens = dict(s.tokens)
    app.state.router, app.state.collector, app.state.metrics = router, collector, m

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    app.add_middleware(_CountRequests, metrics=m)

    def org_of(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <token>'", code="missing_token")
        org = tokens.get(token.strip())
        if org is None:
            raise ApiError(401, "invalid bearer token", code="invalid_token")
        return org

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > s.max_body_bytes:
            raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {s.max_body_bytes}",
                           code="body_too_large")
        buf = bytearray()
        async for part in request.stream():
            buf += part
            if len(buf) > s.max_body_bytes:
                raise ApiError(413, f"request body exceeds the limit of {s.max_body_bytes} bytes", code="body_too_large")
        try:
            return json.loads(buf)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"malformed JSON body: {exc}", code="invalid_json") from None

    async def durable(fut, kind: str, n: int) -> None:
        t0 = time.perf_counter()
        await asyncio.wrap_future(fut)
        m.ack.observe(time.perf_counter() - t0)
        m.events.labels(kind).inc(n)

    # --- health, models, metrics ------------------------------------------------------------------
    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        body = {"ready": router.ready, "serving": router.versions(), "last_error": router.last_error}
        return JSONResponse(body, status_code=200 if router.ready else 503)

    @app.get("/metrics")
    async def metrics_text() -> Response:
        m.served.clear()  # an alias that was removed (rollback) must not linger
        for alias, v in router.versions().items():
            m.served.labels(alias).set(v)
        m.wal_fsyncs.set(collector.wal.stats.fsyncs)
        m.wal_segments.set(collector.wal.stats.segments_sealed)
        m.index_size.set(len(collector.index))
        return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        org_of(request)
        ids = ["auto", *router.model_ids()] if router.ready else router.model_ids()
        return {"object": "list", "data": [{"id": i, "object": "model", "created": 0, "owned_by": "rtrl"} for i in ids]}

    # --- chat completions -------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        org = org_of(request)
        body = await read_json(request)
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object", code="invalid_json")
        try:
            req = ChatRequest.model_validate(body)
        except ValidationError as exc:
            raise validation_error(exc) from None
        max_tokens = req.max_completion_tokens or req.max_tokens or s.max_tokens_default
        if max_tokens > s.max_tokens_limit:
            raise ApiError(400, f"max_tokens {max_tokens} exceeds the limit {s.max_tokens_limit}", param="max_tokens")
        messages = [msg.model_dump(exclude_none=True) for msg in req.messages]
        user, session, turn = _identity(req, request, messages)
        sampling = Sampling(max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
                            top_p=1.0 if req.top_p is None else req.top_p, stop=req.stop_list(), seed=req.seed)
        try:
            lease = router.route(req.model, user, org)
        except UnknownModel as exc:
            raise ApiError(404, str(exc), param="model", code="model_not_found") from None
        except NotReady as exc:
            raise ApiError(503, str(exc), code="not_ready") from None
        ts_request, t0 = now_utc(), time.perf_counter()
        event_id = str(uuid.uuid4())
        try:
            ids = await run_in_threadpool(prompt_ids, lease.backend.tokenizer, messages, req.tools)
        except Exception as exc:
            lease.release()
            raise ApiError(400, f"messages cannot be rendered with the chat template: {exc}", param="messages") from None
        ctx = dict(event_id=event_id, org=org, user=user, session=session, turn=turn, req=req, messages=messages,
                   ids=ids, sampling=sampling, ts_request=ts_request, t0=t0)
        headers = {"x-rtrl-event-id": event_id, "x-rtrl-model-version": str(lease.version), "x-rtrl-arm": lease.arm}
        if lease.adapter_version:
            headers["x-rtrl-adapter-version"] = lease.adapter_version
        if req.stream:
            gen = _stream(lease, ctx)
            weakref.finalize(gen, lease.release)  # a stream never started (client gone) still frees its lease
            return StreamingResponse(gen, media_type="text/event-stream", headers=headers)
        try:
            g = await run_in_threadpool(lease.backend.generate, ids, sampling)
        finally:
            lease.release()
        content, calls = toolcalls.parse(g.text) if req.tools else (g.text, [])
        finish = "tool_calls" if calls and g.finish_reason == "stop" else g.finish_reason
        t_log = time.perf_counter()
        row = _row(ctx, lease, g.token_ids, g.logprobs, g.text, calls, finish, g.ttft_ms)
        await durable(collector.log_interaction(row), "interactions", 1)
        m.logging.observe(time.perf_counter() - t_log)
        _observe(lease, len(g.token_ids), t0)
        out = completion_body(event_id=event_id, model=req.model, created=now_s(), content=content or (None if calls else ""),
                              tool_calls=calls, finish_reason=finish, prompt_tokens=len(ids),
                              completion_tokens=len(g.token_ids),
                              logprobs=logprobs_block(lease.backend.tokenizer, g.token_ids, g.logprobs) if req.logprobs else None)
        return JSONResponse(out, headers=headers)

    def _observe(lease, n_tokens: int, t0: float) -> None:
        m.completions.labels(lease.arm, str(lease.version)).inc()
        m.completion_tokens.labels(lease.arm, str(lease.version)).inc(n_tokens)
        m.latency.labels(lease.arm).observe(time.perf_counter() - t0)

    def _row(ctx, lease, token_ids, logprobs, text, calls, finish, ttft_ms) -> dict:
        req: ChatRequest = ctx["req"]
        ev = InteractionEvent(
            event_id=ctx["event_id"], org_id=ctx["org"], user_id=ctx["user"], session_id=ctx["session"],
            turn_index=ctx["turn"], ts_request=ctx["ts_request"], ts_response=now_utc(), requested_model=req.model,
            model_version=lease.version, adapter_version=lease.adapter_version, arm=lease.arm,
            messages={"messages": ctx["messages"], "tools": req.tools},
            prompt_token_ids=ctx["ids"], completion_token_ids=token_ids, completion_logprobs=logprobs,
            completion_text=text, tool_calls=calls or None, finish_reason=finish,
            latency_ms=(time.perf_counter() - ctx["t0"]) * 1000, ttft_ms=ttft_ms,
            temperature=ctx["sampling"].temperature, top_p=ctx["sampling"].top_p)
        return ev.to_row()

    def _stream(lease, ctx):
        """SSE chunks (runs in the threadpool). The event is made durable before the final chunk."""
        req: ChatRequest = ctx["req"]
        eid, model, created = ctx["event_id"], req.model, now_s()
        marker = "<tool_call>"
        hold = len(marker) - 1 if req.tools else 0
        token_ids: list[int] = []
        logprobs: list[float] = []
        text, sent, finish, ttft = "", 0, "length", None
        try:
            yield chunk(eid, model, created, {"role": "assistant", "content": ""})
            for step in lease.backend.stream(ctx["ids"], ctx["sampling"]):
                if ttft is None and step.token_ids:
                    ttft = (time.perf_counter() - ctx["t0"]) * 1000
                token_ids += step.token_ids
                logprobs += step.logprobs
                text += step.text
                finish = step.finish_reason or finish
                visible = text.split(marker, 1)[0] if req.tools else text
                safe = len(visible) if marker in text or step.finish_reason else max(len(visible) - hold, 0)
                if safe > sent:
                    yield chunk(eid, model, created, {"content": visible[sent:safe]})
                    sent = safe
        finally:
            lease.release()
        content, calls = toolcalls.parse(text) if req.tools else (text, [])
        if calls:
            yield chunk(eid, model, created, {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
            finish = "tool_calls" if finish == "stop" else finish
        t_log = time.perf_counter()
        row = _row(ctx, lease, token_ids, logprobs, text, calls, finish, ttft)
        try:
            t0 = time.perf_counter()
            collector.log_interaction(row).result(timeout=30)
            m.ack.observe(time.perf_counter() - t0)
            m.logging.observe(time.perf_counter() - t_log)
            m.events.labels("interactions").inc()
        except Exception as exc:  # not durable: no final chunk, no [DONE]; the client sees the error
            yield f"data: {json.dumps({'error': {'message': f'event not logged: {exc}', 'type': 'api_error'}})}\n\n".encode()
            return
        _observe(lease, len(token_ids), ctx["t0"])
        yield chunk(eid, model, created, {}, finish)
        if (req.stream_options or {}).get("include_usage"):
            n = len(ctx["ids"])
            yield chunk(eid, model, created, {}, usage={"prompt_tokens": n, "completion_tokens": len(token_ids),
                                                       "total_tokens": n + len(token_ids)}, choices=False)
        yield b"data: [DONE]\n\n"

    # --- events from elsewhere --------------------------------------------------------------------
    def _items(body: Any, key: str) -> list[Any]:
        items = body.get(key) if isinstance(body, dict) and set(body) == {key} else body
        items = items if isinstance(items, list) else [items]
        if not items or len(items) > MAX_BATCH:
            raise ApiError(400, f"send 1..{MAX_BATCH} events (an object, a list, or {{'{key}': [...]}})")
        for i, it in enumerate(items):
            if not isinstance(it, dict):
                raise ApiError(400, f"{key}[{i}] must be a JSON object", param=f"{key}[{i}]")
        return items

    def _org_field(item: dict, org: str, where: str) -> dict:
        given = item.get("org_id")
        if given not in (None, "", org):
            raise ApiError(400, f"{where}.org_id {given!r} differs from the token's org: the org comes from the token",
                           param=f"{where}.org_id")
        return {**item, "org_id": org}

    def _validated(body, model, single: str, org: str) -> list:
        """Validate each event of a body (one event, a list, or {"events": [...]}): [(where, event)], the
        first bad one raising a 4xx that names its place (`events[i]` in a batch, else `single`)."""
        items = _items(body, "events")
        out = []
        for i, it in enumerate(items):
            where = f"events[{i}]" if len(items) > 1 else single
            try:
                out.append((where, model.model_validate(_org_field(it, org, where))))
            except ValidationError as exc:
                raise validation_error(exc, where) from None
        return out

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> JSONResponse:
        org = org_of(request)
        rows = []
        for where, ev in _validated(await read_json(request), FeedbackEvent, "feedback", org):
            if not collector.index.known(ev.event_id, org):
                raise ApiError(404, f"{where}.event_id {ev.event_id}: no such interaction for this org",
                               param=f"{where}.event_id", code="unknown_event")
            rows.append(ev.to_row())
        await durable(collector.log_feedback(rows), "feedback", len(rows))
        return JSONResponse({"accepted": len(rows), "feedback_ids": [r["feedback_id"] for r in rows]})

    @app.post("/v1/interactions")
    async def interactions(request: Request) -> JSONResponse:
        org = org_of(request)
        rows, seen, dupes = [], set(), 0
        for where, ev in _validated(await read_json(request), InteractionEvent, "interaction", org):
            owner = collector.index.org_of(ev.event_id)
            if owner is not None and owner != org:
                raise ApiError(409, f"{where}.event_id {ev.event_id} is already used", param=f"{where}.event_id")
            if owner == org or ev.event_id in seen:
                dupes += 1  # idempotent retry: stored once
                continue
            seen.add(ev.event_id)
            rows.append(ev.to_row())
        if rows:
            await durable(collector.log_interactions(rows), "interactions", len(rows))
        return JSONResponse({"accepted": len(rows), "duplicates": dupes, "event_ids": [r["event_id"] for r in rows]})

    return app
