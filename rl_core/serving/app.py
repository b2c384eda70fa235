"""The gateway's HTTP API (design.md "Serving API"): OpenAI chat completions, models, feedback,
interactions, health and metrics.

create_app wires the parts; the routes live in rl_core/serving/routes/, one module per concern, and reach
the router, collector and metrics through FastAPI dependencies (routes/deps.py). Every completion is
logged durably before it is acknowledged, the org always comes from the bearer token, and bad input is
a 4xx JSON error naming the problem that changes nothing stored.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rl_core.collect.collector import Collector
from rl_core.config import Config
from rl_core.serving.metrics import Metrics
from rl_core.serving.protocol import ApiError
from rl_core.serving.router import Router
from rl_core.serving.routes import chat, events, ops
from rl_core.serving.routes.deps import GatewayParts
from rl_core.toolcalls import prompt_ids

__all__ = ["create_app", "prompt_ids"]  # prompt_ids: bench/ and tests render prompts exactly as the gateway does


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


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    """Raised anywhere in a route or dependency, an ApiError becomes OpenAI's error JSON with its status."""
    return exc.response()


def create_app(cfg: Config, router: Router, collector: Collector, metrics: Metrics | None = None) -> FastAPI:
    """One gateway app over these parts (the caller owns and closes them); its own Metrics unless given."""
    app = FastAPI(title="rtrl gateway", docs_url=None, redoc_url=None, openapi_url=None)
    m = metrics or Metrics()
    app.state.rtrl = GatewayParts(serving=cfg.serving, router=router, collector=collector, metrics=m,
                                  tokens=dict(cfg.serving.tokens))
    app.add_exception_handler(ApiError, _api_error)
    app.add_middleware(_CountRequests, metrics=m)
    for module in (ops, chat, events):
        app.include_router(module.api)
    return app
