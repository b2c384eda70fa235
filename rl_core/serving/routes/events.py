"""Events from elsewhere: POST /v1/feedback (later reactions to a completion) and POST /v1/interactions
(completions logged by another serving stack, e.g. a vLLM fleet).

A body is one event, a list, or {"events": [...]}. It is validated whole before anything is stored,
so a bad event answers a 4xx naming its place (`events[i]` in a batch) and changes nothing. The event models
(rl_core/schema.py) hold every field to what its Parquet column can store, so what is acknowledged here can
always be compacted. The org
comes from the token: an event naming another org is refused. Interactions are idempotent by event_id.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from rl_core.schema import FeedbackEvent, InteractionEvent
from rl_core.serving.protocol import ApiError, validation_error
from rl_core.serving.routes.deps import JsonBody, Org, Parts

MAX_BATCH = 5000

api = APIRouter()


@api.post("/v1/feedback")
async def feedback(gw: Parts, org: Org, body: JsonBody) -> JSONResponse:
    """Feedback only for this org's own interactions (404 otherwise), acknowledged once durable."""
    rows = []
    for where, ev in _validated(body, FeedbackEvent, "feedback", org):
        if not gw.collector.index.known(ev.event_id, org):
            raise ApiError(404, f"{where}.event_id {ev.event_id}: no such interaction for this org",
                           param=f"{where}.event_id", code="unknown_event")
        rows.append(ev.to_row())
    await gw.durable(gw.collector.log_feedback(rows), "feedback", len(rows))
    return JSONResponse({"accepted": len(rows), "feedback_ids": [r["feedback_id"] for r in rows]})


@api.post("/v1/interactions")
async def interactions(gw: Parts, org: Org, body: JsonBody) -> JSONResponse:
    """Store each new event_id once (a retry counts as a duplicate); 409 if another org already used it."""
    rows, seen, dupes = [], set(), 0
    for where, ev in _validated(body, InteractionEvent, "interaction", org):
        owner = gw.collector.index.org_of(ev.event_id)
        if owner is not None and owner != org:
            raise ApiError(409, f"{where}.event_id {ev.event_id} is already used", param=f"{where}.event_id")
        if owner == org or ev.event_id in seen:
            dupes += 1  # idempotent retry: stored once
            continue
        seen.add(ev.event_id)
        rows.append(ev.to_row())
    if rows:
        await gw.durable(gw.collector.log_interactions(rows), "interactions", len(rows))
    return JSONResponse({"accepted": len(rows), "duplicates": dupes, "event_ids": [r["event_id"] for r in rows]})


def _validated(body: Any, model: type[BaseModel], single: str, org: str) -> list:
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


def _items(body: Any, key: str) -> list[Any]:
    """The body's events as a list of objects, 1..MAX_BATCH of them."""
    items = body.get(key) if isinstance(body, dict) and set(body) == {key} else body
    items = items if isinstance(items, list) else [items]
    if not items or len(items) > MAX_BATCH:
        raise ApiError(400, f"send 1..{MAX_BATCH} events (an object, a list, or {{'{key}': [...]}})")
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise ApiError(400, f"{key}[{i}] must be a JSON object", param=f"{key}[{i}]")
    return items


def _org_field(item: dict, org: str, where: str) -> dict:
    """The event with the token's org: a body may repeat it or leave it out, never name another."""
    given = item.get("org_id")
    if given not in (None, "", org):
        raise ApiError(400, f"{where}.org_id {given!r:.80} differs from the token's org: the org comes from the token",
                       param=f"{where}.org_id")
    return {**item, "org_id": org}
