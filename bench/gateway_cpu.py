"""Benchmark: the gateway's own CPU per request and per streamed token, against a paced stand-in engine (issue 40).

    .venv/bin/python bench/gateway_cpu.py [--requests 64] [--concurrency 4] [--tokens 64] [--token-ms 20]
                                          [--modes plain,stream] [--profile 25] [--json out.json]

Why a stand-in: on a 2-core machine vLLM's own threads take every cycle the gateway leaves, so the latency bench
(bench/gateway_overhead.py) sees the gateway's CPU only through noise of +-5%. Here the engine is a small uvicorn
app in its own process that answers /v1/completions exactly as vLLM's server does for the gateway's request (the same
SSE lines with token ids and logprobs, one per token, `--token-ms` apart), so what the gateway process spends is the
gateway's alone: routing, the chat template, the upstream HTTP client, our chunks, the WAL row fsynced before the
answer, compaction. The gateway runs in this process (rl_core.serving.server.serve_in_thread with the real
VLLMBackend, its engine command swapped for the stand-in).
The clients are bench/gateway_overhead.py's (the official `openai` client, in their own process).
`--profile N` prints the N costliest functions of the gateway's event loop (cProfile, cumulative and own time).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]
KEY = "rtrl-dev-token"  # [serving] tokens' default: org-dev


def engine_app(token_ms: float, n_tokens: int):
    """The stand-in for vLLM's OpenAI server: /health and /v1/completions (streamed or not), paced per token."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def choice(i: int, finish: str | None) -> dict:
        tok = f" t{i}"
        return {"index": 0, "text": tok, "finish_reason": finish, "stop_reason": None, "token_ids": [1000 + i],
                "prompt_token_ids": None, "logprobs": {"text_offset": [0], "token_logprobs": [-0.5 - i / 1000],
                                                       "tokens": [tok], "top_logprobs": [{tok: -0.5}]}}

    def body(choices: list[dict]) -> dict:
        return {"id": "cmpl-bench", "object": "text_completion", "created": int(time.time()), "model": "policy",
                "choices": choices, "usage": None}

    async def completions(request):
        req = await request.json()
        n = min(int(req.get("max_tokens") or n_tokens), n_tokens)
        if not req.get("stream"):
            await asyncio.sleep(n * token_ms / 1000)
            pieces = [choice(i, None) for i in range(n)]
            c = {**pieces[-1], "text": "".join(p["text"] for p in pieces), "finish_reason": "length",
                 "token_ids": [p["token_ids"][0] for p in pieces],
                 "logprobs": {"token_logprobs": [p["logprobs"]["token_logprobs"][0] for p in pieces]}}
            return JSONResponse(body([c]))

        async def sse():
            for i in range(n):
                await asyncio.sleep(token_ms / 1000)
                yield f"data: {json.dumps(body([choice(i, 'length' if i == n - 1 else None)]))}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(sse(), media_type="text/event-stream")

    async def health(_request):
        return JSONResponse({})

    return Starlette(routes=[Route("/health", health), Route("/v1/completions", completions, methods=["POST"])])


def serve_engine(port: int, token_ms: float, n_tokens: int) -> None:
    import uvicorn

    uvicorn.run(engine_app(token_ms, n_tokens), host="127.0.0.1", port=port, log_level="warning")


class _Profiled:
    """ASGI wrapper: a cProfile of the gateway's event-loop thread (every route, stream and await runs there)."""

    def __init__(self, app, prof: cProfile.Profile):
        self.app, self.prof, self.on = app, prof, False

    async def __call__(self, scope, receive, send):
        if not self.on and scope["type"] == "http":
            self.on = True
            self.prof.enable()
        await self.app(scope, receive, send)


def gateway(home: Path, token_ms: float, n_tokens: int):
    """The real gateway over the real VLLMBackend, its engine process the stand-in; the tiny model's tokenizer."""
    from rl_core.collect.collector import Collector
    from rl_core.config import load_config
    from rl_core.models import build_tiny
    from rl_core.serving.app import create_app
    from rl_core.serving.backends.vllm import VLLMBackend
    from rl_core.serving.router import Router
    from rl_core.serving.server import Gateway

    os.environ.update({"RTRL_HOME": str(home), "RTRL_PROFILE": "tiny", "RTRL_SERVING__BACKEND": "vllm"})
    cfg = load_config()
    ckpt = build_tiny(home / "models" / "tiny", cfg.model)

    class StandIn(VLLMBackend):
        def _command(self) -> list[str]:
            return [sys.executable, __file__, "--engine", json.dumps([self.port, token_ms, n_tokens])]

    router = Router(factory=lambda c, v: StandIn(c, cfg, v), checkpoint_for=lambda v: str(ckpt),
                    alias_source=lambda: {"champion": 1}, challenger_share=0.0, model_name="bench", poll_s=3600)
    collector = Collector.from_config(cfg)
    router.start(background=False)
    return cfg, Gateway(create_app(cfg, router, collector), router, collector)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--engine":
        serve_engine(*json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--token-ms", type=float, default=20.0)
    ap.add_argument("--modes", default="plain,stream")
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    from gateway_overhead import run_client  # the same clients, in their own process

    from rl_core.serving.server import serve_in_thread

    cfg, gw = gateway(Path(tempfile.mkdtemp(prefix="rtrl-bench-gwcpu-")), a.token_ms, a.tokens)
    prof = cProfile.Profile()
    if a.profile:
        gw.app = _Profiled(gw.app, prof)
    rows = []
    with serve_in_thread(cfg, gateway=gw) as base:
        run_client(f"{base}/v1", "auto", KEY, 4, 4, a.tokens, 0, False, False)  # warm: first-request imports, connections
        for mode in a.modes.split(","):
            c0, t0 = time.process_time(), time.perf_counter()
            got = run_client(f"{base}/v1", "auto", KEY, a.requests, a.concurrency, a.tokens, 0, mode == "stream", False)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            rows.append({"mode": mode, "requests": a.requests, "tokens": got["tokens"], "cpu_s": cpu, "wall_s": wall,
                         "mean_latency_s": sum(got["lat"]) / len(got["lat"])})
    print(f"| mode ({a.concurrency} concurrent, {a.tokens} tokens, engine {a.token_ms:g} ms/token) | requests | "
          "gateway CPU ms per request | gateway CPU ms per token | mean latency ms | engine-only latency ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['requests']} | {1000 * r['cpu_s'] / r['requests']:.2f} | "
              f"{1000 * r['cpu_s'] / max(r['tokens'], 1):.3f} | {1000 * r['mean_latency_s']:.0f} | "
              f"{a.tokens * a.token_ms:.0f} |")
    if a.json:
        a.json.write_text(json.dumps({"args": vars(a) | {"json": str(a.json)}, "rows": rows}, indent=1))
    if a.profile:
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(a.profile)
        st.sort_stats("cumulative").print_stats(a.profile)


if __name__ == "__main__":
    main()
