"""What every route needs, as FastAPI dependencies rather than closures over create_app's locals.

The gateway's shared parts (router, collector, metrics, serving config, tokens) live in one typed
`GatewayParts` on `app.state.rtrl`; a route asks for them with a `Parts` parameter. `Org` is the org of the
bearer token (never the body) and `JsonBody` the size-capped JSON body, read only once the token is
known to be good, so a request with bad auth and a bad body is always answered 401.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from rl_core.collect.collector import Collector
from rl_core.serving.metrics import Metrics
from rl_core.serving.protocol import ApiError
from rl_core.serving.router import Router


@dataclass(frozen=True)
class GatewayParts:
    """One app's shared parts. `serving` is cfg.serving; `tokens` maps bearer token -> org_id."""

    serving: Any
    router: Router
    collector: Collector
    metrics: Metrics
    tokens: dict[str, str]

    async def durable(self, fut: Future, kind: str, n: int) -> None:
        """Wait for the WAL's fsync of `n` events of `kind`: nothing is acknowledged before it."""
        t0 = time.perf_counter()
        await asyncio.wrap_future(fut)
        self.metrics.ack.observe(time.perf_counter() - t0)
        self.metrics.events.labels(kind).inc(n)


# The dependencies are `async def` so they run on the event loop (FastAPI sends a sync one to the threadpool).
async def parts(request: Request) -> GatewayParts:
    """The parts create_app put on this app (two apps in one process each see their own)."""
    return request.app.state.rtrl


Parts = Annotated[GatewayParts, Depends(parts)]


async def org_of(request: Request, gw: Parts) -> str:
    """The org of `Authorization: Bearer <token>` ([serving] tokens): 401 if missing or unknown."""
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <token>'", code="missing_token")
    org = gw.tokens.get(token.strip())
    if org is None:
        raise ApiError(401, "invalid bearer token", code="invalid_token")
    return org


Org = Annotated[str, Depends(org_of)]


async def json_body(request: Request, gw: Parts, _: Org) -> Any:
    """The parsed JSON body, refused past serving.max_body_bytes (declared or streamed) with a 413, and with a 400
    when it is not JSON, nests past the parser's limit, or holds a lone UTF-16 surrogate (valid JSON, but text
    that UTF-8, the WAL and Parquet cannot carry), naming the field where it is."""
    limit = gw.serving.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit}", code="body_too_large")
    buf = bytearray()
    async for part in request.stream():
        buf += part
        if len(buf) > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
    try:
        body = json.loads(buf)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON body: {exc}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply", code="invalid_json") from None
    where = _unencodable(body)
    if where is not None:
        raise ApiError(400, f"{where or 'body'}: holds a lone UTF-16 surrogate (\\ud800 to \\udfff), which is not "
                       "text UTF-8 can carry", param=where or None, code="invalid_value")
    return body


def _unencodable(body: Any) -> str | None:
    """The dotted place of a string (key or value) UTF-8 cannot encode, else None. Iterative: a body nests as
    deep as json.loads allowed. A bad key is shown escaped, since the 400's own JSON must encode."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            if not _utf8(v):
                return where
        elif isinstance(v, dict):
            for k, x in v.items():
                key = k.encode("utf-8", "backslashreplace").decode("utf-8")
                place = f"{where}.{key}" if where else key
                if not _utf8(k):
                    return place
                stack.append((place, x))
        elif isinstance(v, list):
            stack.extend((f"{where}.{i}" if where else str(i), x) for i, x in enumerate(v))
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


JsonBody = Annotated[Any, Depends(json_body)]
