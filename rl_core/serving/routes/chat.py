"""The OpenAI surface: POST /v1/chat/completions and GET /v1/models (design.md "Serving API").

Every completion is logged as an interaction row with what on-policy RL needs (prompt/completion token
ids, the sampled tokens' logprobs, model version, arm) and acknowledged only after it is durable: the
non-streaming response is sent after the fsync; a stream sends its last chunk and [DONE] after it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
import weakref
from dataclasses import dataclass
from datetime import datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool

from rl_core import toolcalls
from rl_core.ids import IdError, check_text_id
from rl_core.schema import INT32_MAX, InteractionEvent, TurnIndex, now_utc
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
from rl_core.serving.router import Lease, NotReady, UnknownModel
from rl_core.serving.routes.deps import GatewayParts, JsonBody, Org, Parts

api = APIRouter()


def _rendered(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """prompt_ids, a template that cannot render these messages being the request's fault (400)."""
    try:
        return toolcalls.prompt_ids(tokenizer, messages, tools)
    except Exception as exc:  # noqa: BLE001 - whatever the template raises
        raise ApiError(400, f"messages cannot be rendered with the chat template: {exc}", param="messages") from None


@dataclass(frozen=True)
class Turn:
    """One completion in flight: who asked what, and when. Everything its logged row needs but the output."""

    event_id: str
    org: str
    user: str
    session: str
    turn_index: int
    req: ChatRequest
    messages: list[dict]
    ids: list[int]
    sampling: Sampling
    ts_request: datetime
    t0: float


@api.get("/v1/models")
async def models(gw: Parts, _: Org) -> dict:
    """What `model` may name; `auto` only once a champion serves (else it would answer 503)."""
    router = gw.router
    ids = ["auto", *router.model_ids()] if router.ready else router.model_ids()
    return {"object": "list", "data": [{"id": i, "object": "model", "created": 0, "owned_by": "rtrl"} for i in ids]}


@api.post("/v1/chat/completions")
async def chat(request: Request, gw: Parts, org: Org, body: JsonBody):
    """Validate everything the turn's logged row takes from the request (body, x-rtrl-* headers, metadata), route
    to an engine (holding its lease), render the prompt, check the row-to-be, then answer or stream. A refused
    request costs no generation, and a generated turn cannot fail its row for anything the request sent."""
    req, max_tokens = _chat_request(body, gw.serving)
    messages = [msg.model_dump(exclude_none=True) for msg in req.messages]
    user, session, turn_index = _identity(req, request, messages)
    sampling = Sampling(max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
                        top_p=1.0 if req.top_p is None else req.top_p, stop=req.stop_list(), seed=req.seed)
    try:
        lease = gw.router.route(req.model, user, org)
    except UnknownModel as exc:
        raise ApiError(404, str(exc), param="model", code="model_not_found") from None
    except NotReady as exc:
        raise ApiError(503, str(exc), code="not_ready") from None
    ts_request, t0 = now_utc(), time.perf_counter()
    event_id = str(uuid.uuid4())
    try:
        ids = await run_in_threadpool(_rendered, lease.backend.tokenizer, messages, req.tools)
        turn = Turn(event_id=event_id, org=org, user=user, session=session, turn_index=turn_index, req=req,
                    messages=messages, ids=ids, sampling=sampling, ts_request=ts_request, t0=t0)
        _precheck(turn, lease)
    except Exception:
        lease.release()
        raise
    headers = {"x-rtrl-event-id": event_id, "x-rtrl-model-version": str(lease.version), "x-rtrl-arm": lease.arm}
    if lease.adapter_version:
        headers["x-rtrl-adapter-version"] = lease.adapter_version
    if req.stream:
        gen = _astream(gw, lease, turn) if hasattr(lease.backend, "astream") else _stream(gw, lease, turn)
        weakref.finalize(gen, lease.release)  # a stream never started (client gone) still frees its lease
        return StreamingResponse(gen, media_type="text/event-stream", headers=headers)
    return await _complete(gw, lease, turn, headers)


def _chat_request(body, serving) -> tuple[ChatRequest, int]:
    """The strictly validated request and its max_tokens (default and limit from [serving])."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    max_tokens = req.max_completion_tokens or req.max_tokens or serving.max_tokens_default
    if max_tokens > serving.max_tokens_limit:
        raise ApiError(400, f"max_tokens {max_tokens} exceeds the limit {serving.max_tokens_limit}", param="max_tokens")
    return req, max_tokens


_TURN_INDEX = TypeAdapter(TurnIndex)


def _identity(req: ChatRequest, request: Request, messages: list[dict]) -> tuple[str, str, int]:
    """user_id, session_id, turn_index from the OpenAI `user` field, x-rtrl-* headers or metadata.

    Every value given is checked (ids.check_text_id; turn_index an int32 >= 0), used or not, and a bad one is a
    400 naming where it came from. Without a session id, one is derived from the user and the conversation's
    first message, so turns of one conversation share it; turn_index defaults to the number of assistant turns
    before this one.
    """
    md, h = req.metadata or {}, request.headers
    given = {"user": req.user, "x-rtrl-user-id": h.get("x-rtrl-user-id"), "metadata.user_id": md.get("user_id"),
             "x-rtrl-session-id": h.get("x-rtrl-session-id"), "metadata.session_id": md.get("session_id")}
    for param, value in given.items():
        if value:  # "" counts as absent, as it always has
            try:
                check_text_id(param, value)
            except IdError as exc:
                raise ApiError(400, str(exc), param=param, code="invalid_value") from None
    user = given["user"] or given["x-rtrl-user-id"] or given["metadata.user_id"] or "anonymous"
    session = given["x-rtrl-session-id"] or given["metadata.session_id"]
    if not session:
        first = json.dumps(messages[0], sort_keys=True)
        session = "s-" + hashlib.sha256(f"{user}\n{first}".encode()).hexdigest()[:24]
    turns = {p: v for p, v in (("x-rtrl-turn-index", h.get("x-rtrl-turn-index")),
                               ("metadata.turn_index", md.get("turn_index"))) if v}
    for param, value in turns.items():
        try:
            turns[param] = _TURN_INDEX.validate_python(value)
        except ValidationError:
            raise ApiError(400, f"{param}: turn_index must be an integer in [0, {INT32_MAX}], got {value!r:.40}",
                           param=param, code="invalid_value") from None
    if not turns:
        return user, session, sum(1 for m in messages if m.get("role") == "assistant")
    return user, session, next(iter(turns.values()))  # the header wins over metadata


def _precheck(turn: Turn, lease: Lease) -> None:
    """The turn's row as it will be logged, less what generation adds, through the event contract: a value the
    lake cannot hold (a prompt over MAX_TOKENS, messages too long to store) is refused before generating."""
    try:
        _row(turn, lease, [], [], "", [], None, None)
    except ValidationError as exc:
        raise validation_error(exc, "interaction") from None


async def _complete(gw: GatewayParts, lease: Lease, turn: Turn, headers: dict[str, str]) -> JSONResponse:
    """Generate (on the loop for an AsyncBackend, else in the threadpool), make the interaction durable, then answer
    with an OpenAI chat.completion."""
    req, m = turn.req, gw.metrics
    try:
        if hasattr(lease.backend, "agenerate"):
            g = await lease.backend.agenerate(turn.ids, turn.sampling)
        else:
            g = await run_in_threadpool(lease.backend.generate, turn.ids, turn.sampling)
    finally:
        lease.release()
    content, calls = toolcalls.parse(g.text) if req.tools else (g.text, [])
    finish = "tool_calls" if calls and g.finish_reason == "stop" else g.finish_reason
    t_log = time.perf_counter()
    row = _engine_row(turn, lease, g.token_ids, g.logprobs, g.text, calls, finish, g.ttft_ms)
    await gw.durable(gw.collector.log_interaction(row), "interactions", 1)
    m.logging.observe(time.perf_counter() - t_log)
    _observe(m, lease, len(g.token_ids), turn.t0)
    out = completion_body(event_id=turn.event_id, model=req.model, created=now_s(),
                          content=content or (None if calls else ""), tool_calls=calls, finish_reason=finish,
                          prompt_tokens=len(turn.ids), completion_tokens=len(g.token_ids),
                          logprobs=logprobs_block(lease.backend.tokenizer, g.token_ids, g.logprobs) if req.logprobs else None)
    return JSONResponse(out, headers=headers)


class _Pieces:
    """A stream's output so far, as SSE chunks: text that may be the start of a tool call waits for the next step."""

    MARKER = "<tool_call>"

    def __init__(self, turn: Turn):
        self.turn, self.created = turn, now_s()
        self.hold = len(self.MARKER) - 1 if turn.req.tools else 0
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.text, self.sent, self.finish, self.ttft = "", 0, "length", None
        self.calls: list[dict] = []

    def chunk(self, delta: dict, finish: str | None = None, **kw) -> bytes:
        return chunk(self.turn.event_id, self.turn.req.model, self.created, delta, finish, **kw)

    def add(self, step) -> bytes | None:
        """One engine step in; the chunk to send now, if any."""
        if self.ttft is None and step.token_ids:
            self.ttft = (time.perf_counter() - self.turn.t0) * 1000
        self.token_ids += step.token_ids
        self.logprobs += step.logprobs
        self.text += step.text
        self.finish = step.finish_reason or self.finish
        tools = self.turn.req.tools
        visible = self.text.split(self.MARKER, 1)[0] if tools else self.text
        safe = len(visible) if self.MARKER in self.text or step.finish_reason else max(len(visible) - self.hold, 0)
        if safe <= self.sent:
            return None
        out, self.sent = self.chunk({"content": visible[self.sent:safe]}), safe
        return out

    def tool_calls(self) -> list[bytes]:
        """After the last step: the parsed tool calls' chunk, if any."""
        _, self.calls = toolcalls.parse(self.text) if self.turn.req.tools else (self.text, [])
        if not self.calls:
            return []
        self.finish = "tool_calls" if self.finish == "stop" else self.finish
        return [self.chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(self.calls)]})]

    def row(self, lease: Lease) -> dict:
        return _engine_row(self.turn, lease, self.token_ids, self.logprobs, self.text, self.calls, self.finish,
                           self.ttft)

    @staticmethod
    def not_logged(exc: Exception) -> bytes:
        """Not durable: no final chunk, no [DONE]; the client sees the error."""
        return f"data: {json.dumps({'error': {'message': f'event not logged: {exc}', 'type': 'api_error'}})}\n\n".encode()

    def last(self, m: Metrics, lease: Lease) -> list[bytes]:
        """Once the event is durable: the finish chunk, the usage chunk if asked, [DONE]."""
        _observe(m, lease, len(self.token_ids), self.turn.t0)
        out = [self.chunk({}, self.finish)]
        if (self.turn.req.stream_options or {}).get("include_usage"):
            n, k = len(self.turn.ids), len(self.token_ids)
            out.append(self.chunk({}, usage={"prompt_tokens": n, "completion_tokens": k, "total_tokens": n + k},
                                  choices=False))
        return [*out, b"data: [DONE]\n\n"]


def _stream(gw: GatewayParts, lease: Lease, turn: Turn):
    """SSE chunks from a threaded backend (runs in the threadpool). The event is made durable before the final chunk."""
    p, m = _Pieces(turn), gw.metrics
    try:
        yield p.chunk({"role": "assistant", "content": ""})
        for step in lease.backend.stream(turn.ids, turn.sampling):
            if (out := p.add(step)) is not None:
                yield out
    finally:
        lease.release()
    yield from p.tool_calls()
    t_log = time.perf_counter()
    try:
        row = p.row(lease)
        t0 = time.perf_counter()
        gw.collector.log_interaction(row).result(timeout=30)
        m.ack.observe(time.perf_counter() - t0)
        m.logging.observe(time.perf_counter() - t_log)
        m.events.labels("interactions").inc()
    except Exception as exc:
        yield p.not_logged(exc)
        return
    yield from p.last(m, lease)


async def _astream(gw: GatewayParts, lease: Lease, turn: Turn):
    """_stream for an AsyncBackend, on the event loop: no thread hop per streamed token."""
    p, m = _Pieces(turn), gw.metrics
    try:
        yield p.chunk({"role": "assistant", "content": ""})
        async for step in lease.backend.astream(turn.ids, turn.sampling):
            if (out := p.add(step)) is not None:
                yield out
    finally:
        lease.release()
    for out in p.tool_calls():
        yield out
    t_log = time.perf_counter()
    try:
        await asyncio.wait_for(gw.durable(gw.collector.log_interaction(p.row(lease)), "interactions", 1), 30)
        m.logging.observe(time.perf_counter() - t_log)
    except Exception as exc:
        yield p.not_logged(exc)
        return
    for out in p.last(m, lease):
        yield out


def _row(turn: Turn, lease: Lease, token_ids, logprobs, text, calls, finish, ttft_ms) -> dict:
    """The interaction row RL trains on: the logged prompt ids, the sampled ids and their logprobs."""
    ev = InteractionEvent(
        event_id=turn.event_id, org_id=turn.org, user_id=turn.user, session_id=turn.session,
        turn_index=turn.turn_index, ts_request=turn.ts_request, ts_response=now_utc(), requested_model=turn.req.model,
        model_version=lease.version, adapter_version=lease.adapter_version, arm=lease.arm,
        messages={"messages": turn.messages, "tools": turn.req.tools},
        prompt_token_ids=turn.ids, completion_token_ids=token_ids, completion_logprobs=logprobs,
        completion_text=text, tool_calls=calls or None, finish_reason=finish,
        latency_ms=(time.perf_counter() - turn.t0) * 1000, ttft_ms=ttft_ms,
        temperature=turn.sampling.temperature, top_p=turn.sampling.top_p)
    return ev.to_row()


def _engine_row(turn: Turn, lease: Lease, token_ids, logprobs, text, calls, finish, ttft_ms) -> dict:
    """_row after generation. Everything the request gave was checked before (_precheck), so a failure here is
    the engine's output breaking the contract (a NaN logprob, say): a 500 that says so, never a traceback."""
    try:
        return _row(turn, lease, token_ids, logprobs, text, calls, finish, ttft_ms)
    except ValidationError as exc:
        detail = validation_error(exc, "interaction").message.removeprefix("invalid request: ")
        raise ApiError(500, f"the engine's output breaks the event contract, so the turn was not logged: {detail}",
                       code="unloggable_output") from None


def _observe(m: Metrics, lease: Lease, n_tokens: int, t0: float) -> None:
    """Per-arm counters and latency: what the A/B dashboards compare."""
    m.completions.labels(lease.arm, str(lease.version)).inc()
    m.completion_tokens.labels(lease.arm, str(lease.version)).inc(n_tokens)
    m.latency.labels(lease.arm).observe(time.perf_counter() - t0)
