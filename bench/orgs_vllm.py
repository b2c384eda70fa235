"""Benchmark: org traffic served with each org's live LoRA adapter, vLLM multi-LoRA against the transformers backend.

    .venv/bin/python bench/orgs_vllm.py [--model smollm2|tiny] [--orgs 4] [--requests 16] [--rounds 2]
                                        [--concurrency 4,8] [--max-tokens 64] [--paths vllm,vllm-base,hf,vllm-nolora]

One registry, N orgs, each with a live adapter on version 1 (random peft LoRAs, r=8 on q/k/v/o as the org trainer
makes them, small non-zero B). Gateways (`rtrl serve`, each its own process, WAL and lake, the one registry):
- vllm:        vLLM backend, serving.vllm_lora on: every org's adapter loaded into the one engine (multi-LoRA);
- vllm-base:   the same gateway and engine, traffic from an org without an adapter (the base weights);
- hf:          transformers backend with the same adapters (a peft-merged copy of the base per org);
- vllm-nolora: a vLLM engine started without --enable-lora, base traffic (what enabling LoRA costs the base).
The client runs in its own process (it must not share a gateway's GIL); requests cycle over the orgs' tokens and
prompts, with the same seeds on every path; the paths alternate within each round so drift hits all of them.
Reported per path and concurrency: completion tokens/s (tokens / wall), p50 and mean latency, and how many answers
carried x-rtrl-adapter-version (every answer on an adapter path must). Then the adapter swap on the vLLM gateway
(`--swaps` times): a new adapter registered for an org, its `live` alias moved, and the seconds until the org's
first answer from it (x-rtrl-adapter-version), polling one-token requests; the gateways poll the aliases every
`--poll-s` seconds, so that much of the swap is the poll's wait.
"""

from __future__ import annotations

import argparse
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
PATHS = {"vllm": "vLLM multi-LoRA, org adapters", "vllm-base": "vLLM (LoRA on), base: org without adapter",
         "hf": "transformers, org adapters (peft merged)", "vllm-nolora": "vLLM (LoRA off), base"}


def client(base: str, keys: list[str], n: int, concurrency: int, max_tokens: int, seed0: int) -> dict:
    """n chat completions, `concurrency` at once, over the org tokens; latencies, tokens, adapter answers."""
    import openai

    clients = {k: openai.OpenAI(base_url=base, api_key=k, max_retries=0, timeout=1200) for k in keys}

    def one(i: int) -> tuple[float, int, bool]:
        t0 = time.perf_counter()
        raw = clients[keys[i % len(keys)]].chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], max_tokens=max_tokens,
            temperature=0.7, seed=seed0 + i)
        r = raw.parse()
        return time.perf_counter() - t0, r.usage.completion_tokens, "x-rtrl-adapter-version" in raw.headers

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        got = list(pool.map(one, range(n)))
    return {"wall": time.perf_counter() - t0, "lat": [g[0] for g in got], "tokens": sum(g[1] for g in got),
            "adapter": sum(g[2] for g in got)}


def run_client(*args) -> dict:
    done = subprocess.run([sys.executable, __file__, "--client", json.dumps(args)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the client against {args[0]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def make_adapter(base: Path, out: Path, seed: int) -> Path:
    """A LoRA as the org trainer shapes it (train.lora_* defaults), with small random B so it changes the model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                      task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    model.save_pretrained(out)
    return out


def setup(home: Path, env: dict[str, str], orgs: list[str]):
    """Version 1 (champion) and a live adapter per org in one registry; returns the config."""
    from rl_core.config import load_config
    from rl_core.init import init
    from rl_core.models import cache_dir, convert_smollm2
    from rl_core.orgs.registry import LIVE_ALIAS, adapter_registry, register_adapter_folder
    from rl_core.registry import store

    os.environ.update(env)
    cfg = load_config()
    if cfg.model.base == "smollm2-135m":  # convert once into the cache, then copy (init skips a complete folder)
        shutil.copytree(convert_smollm2(cache_dir() / "smollm2-135m-hf"), cfg.models_dir / "smollm2-135m")
    init(cfg, check_generation=False)
    base = store.checkpoint_path(cfg, 1)
    for i, org in enumerate(orgs):
        av = register_adapter_folder(cfg, org, make_adapter(base, home / "adapters" / org, i),
                                     {"parent_version": 1, "run_id": f"bench-{org}"})
        store.set_alias(adapter_registry(cfg, org), LIVE_ALIAS, av.version, reason="bench")
    return cfg


def swap_times(cfg, url: str, org: str, key: str, home: Path, n: int) -> list[float]:
    """Seconds from each `live` move (to a newly registered adapter of `org`) to the first answer by that adapter."""
    import openai

    from rl_core.orgs.registry import LIVE_ALIAS, adapter_registry, register_adapter_folder
    from rl_core.registry import store

    c = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=600)
    out = []
    for k in range(n):
        folder = make_adapter(store.checkpoint_path(cfg, 1), home / "adapters" / f"{org}-swap{k}", 100 + k)
        av = register_adapter_folder(cfg, org, folder, {"parent_version": 1, "run_id": f"bench-swap-{k}"})
        t0 = time.perf_counter()
        store.set_alias(adapter_registry(cfg, org), LIVE_ALIAS, av.version, reason="bench: swap")
        while time.perf_counter() - t0 < 300:
            raw = c.chat.completions.with_raw_response.create(model="auto", max_tokens=1,
                                                               messages=[{"role": "user", "content": PROMPTS[0]}])
            if raw.headers.get("x-rtrl-adapter-version") == av.adapter_version:
                break
        else:
            raise RuntimeError(f"{org}'s adapter {av.adapter_version} answered nothing 300 s after its `live` move")
        out.append(time.perf_counter() - t0)
        print(f"  swap {k}: {out[-1]:.2f} s", file=sys.stderr)
    return out


def gateway_env(env: dict[str, str], name: str, backend: str, lora: bool) -> dict[str, str]:
    return {**env, "RTRL_SERVING__BACKEND": backend, "RTRL_SERVING__VLLM_LORA": json.dumps(lora),
            "RTRL_SERVING__WAL_DIR": f"wal-{name}", "RTRL_LAKE__ROOT": f"lake-{name}"}


def measure(a, gateways: dict[str, tuple[str, list[str]]]) -> dict[tuple[str, int], dict]:
    """Alternate the paths within each round, per concurrency; sums per (path, concurrency)."""
    res: dict[tuple[str, int], dict] = {}
    for conc in a.concurrency:
        for url, keys in gateways.values():  # warm-up
            run_client(url, keys, conc, conc, a.max_tokens, 10_000)
        for r in range(a.rounds):
            for path, (url, keys) in gateways.items():
                got = run_client(url, keys, a.requests, conc, a.max_tokens, 1000 * r)
                acc = res.setdefault((path, conc), {"wall": 0.0, "lat": [], "tokens": 0, "adapter": 0})
                acc["wall"] += got["wall"]
                acc["lat"] += got["lat"]
                acc["tokens"] += got["tokens"]
                acc["adapter"] += got["adapter"]
                print(f"  {path} x{conc} round {r}: {got['tokens'] / got['wall']:.1f} tok/s", file=sys.stderr)
    return res


def report(a, res: dict[tuple[str, int], dict]) -> None:
    rate = {k: r["tokens"] / r["wall"] for k, r in res.items()}
    print(f"| path ({a.model}, {a.orgs} orgs, {a.max_tokens} max tokens) | concurrent | requests | completion tokens "
          "| tokens/s | p50 latency ms | mean latency ms | adapter answers |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (path, conc), r in res.items():
        print(f"| {PATHS[path]} | {conc} | {len(r['lat'])} | {r['tokens']} | {rate[path, conc]:.1f} | "
              f"{1000 * statistics.median(r['lat']):.0f} | {1000 * statistics.mean(r['lat']):.0f} | "
              f"{r['adapter']}/{len(r['lat'])} |")
    print()
    for conc in a.concurrency:
        if ("vllm", conc) in rate and ("hf", conc) in rate:
            print(f"- {conc} concurrent: vLLM multi-LoRA / transformers = {rate['vllm', conc] / rate['hf', conc]:.1f}x "
                  "completion tokens/s (target >= 5x)")
        for ref in ("vllm-base", "vllm-nolora"):
            if ("vllm", conc) in rate and (ref, conc) in rate:
                print(f"- {conc} concurrent: org adapters on vLLM reach {100 * rate['vllm', conc] / rate[ref, conc]:.0f}% "
                      f"of the tokens/s of {PATHS[ref]}")


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    ap.add_argument("--orgs", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[4, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--paths", default="vllm,vllm-base,hf,vllm-nolora")
    ap.add_argument("--swaps", type=int, default=3, help="adapter swaps timed on the vLLM gateway (0: none)")
    ap.add_argument("--poll-s", type=float, default=1.0, help="the gateways' alias poll (serving.alias_poll_s)")
    return ap.parse_args()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        print(json.dumps(client(*json.loads(sys.argv[2]))))
        return
    a = parse_args()
    from rl_core.runtime.procs import stop
    from rl_core.serving import gateway as gw

    home = Path(tempfile.mkdtemp(prefix="rtrl-bench-orgs-"))
    orgs = [f"org-b{i}" for i in range(a.orgs)]
    tokens = {f"tok-{o}": o for o in [*orgs, "org-plain"]}
    env = {**os.environ, "RTRL_HOME": str(home), "RTRL_PROFILE": "tiny" if a.model == "tiny" else "default",
           "RTRL_SERVING__TOKENS": json.dumps(tokens), "RTRL_SERVING__PREWARM_SPARE": "false",
           "RTRL_SERVING__CHALLENGER_SHARE": "0", "RTRL_SERVING__VLLM_MAX_LORAS": str(a.orgs),
           "RTRL_SERVING__VLLM_STARTUP_TIMEOUT_S": "900", "RTRL_SERVING__ALIAS_POLL_S": str(a.poll_s)}
    if a.model == "tiny":  # vLLM's CPU attention needs head size 32+
        env |= {"RTRL_MODEL__TINY_HEADS": "2", "RTRL_MODEL__TINY_KV_HEADS": "1"}
    paths = a.paths.split(",")
    procs = []
    try:
        cfg = setup(home, env, orgs)
        specs = {"vllm": ("vllm", True), "hf": ("transformers", True), "vllm-nolora": ("vllm", False)}
        urls = {}
        for name, (backend, lora) in specs.items():
            if name in paths or (name == "vllm" and "vllm-base" in paths):
                t0 = time.time()
                proc, urls[name] = gw.start_gateway(cfg, gateway_env(env, name, backend, lora), home / f"{name}.log")
                procs.append(proc)
                print(f"gateway {name} up in {time.time() - t0:.0f}s", file=sys.stderr)
        adapter_keys, plain = [f"tok-{o}" for o in orgs], ["tok-org-plain"]
        gateways = {"vllm": (urls.get("vllm"), adapter_keys), "vllm-base": (urls.get("vllm"), plain),
                    "hf": (urls.get("hf"), adapter_keys), "vllm-nolora": (urls.get("vllm-nolora"), plain)}
        res = measure(a, {p: (f"{gateways[p][0]}/v1", gateways[p][1]) for p in PATHS if p in paths})
        swaps = swap_times(cfg, f"{urls['vllm']}/v1", orgs[0], adapter_keys[0], home, a.swaps) if "vllm" in urls else []
    except BaseException:
        for name in ("vllm", "hf", "vllm-nolora"):
            log = home / f"{name}.log"
            if log.exists():
                print(f"--- {log} (last lines)\n{log.read_text()[-2000:]}", file=sys.stderr)
        raise
    finally:
        for proc in procs:
            stop(proc)
        shutil.rmtree(home, ignore_errors=True)  # the models, the adapters, the engines' logs
    report(a, res)
    if swaps:
        print(f"- adapter swap on vLLM (alias poll {a.poll_s:g} s): `live` moved -> first answer by the new adapter in "
              f"{', '.join(f'{t:.2f}' for t in swaps)} s (median {statistics.median(swaps):.2f})")


if __name__ == "__main__":
    main()
