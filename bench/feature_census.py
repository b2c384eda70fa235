"""Feature census: how often the served model's answers show each answer feature, with 95% CIs.

    python bench/feature_census.py [--samples 6] [--json out.json]   (RTRL_HOME / RTRL_PROFILE pick the stack)

Why: a policy gradient makes likelier what the policy already samples. A preference the base model never
shows gives an update nothing to push (0 type-hinted functions in 137 SmolLM2 answers), one it always shows
leaves nothing to learn. So before a simulated user is given a preference, this measures every feature of
rl_core/features.py on the champion's answers to the simulator's own requests: served through the
real gateway (engine, chat template, tools and sampling temperature of `rtrl simulate`), each bank task asked
--samples times as a user's first turn by the simulator's seeded users. A feature with a base rate in
[--low, --high] is a candidate preference. Prints a markdown table; --json keeps every answer's features.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def ask(task, user, chat, samples: int, seed: int) -> list[dict]:
    """samples first-turn answers of user to task, each with its features."""
    from evals.tools import openai_tools
    from lab.simulate.users import request_text
    from rl_core.features import features_of

    rows = []
    for k in range(samples):
        rng = random.Random(seed * 1000 + k)
        messages = [{"role": "user", "content": request_text(user, task)}]
        reply = chat(user, f"census-{task.id}-{k}", 0, messages, openai_tools(task.task.tools), rng.randrange(2**31))
        rows.append({"task": task.id, "user": user.user_id, "org": user.org.org_id, "sample": k,
                     "text": reply.text, "tool_calls": reply.tool_calls,
                     "features": features_of(reply.text, reply.tool_calls)})
    return rows


def table(rows: list[dict], low: float, high: float) -> list[dict]:
    """Per feature: answers showing it, rate, Wilson CI, and whether the rate lies in [low, high]."""
    from rl_core.features import FEATURES, feature_rates_of

    out = []
    for name, r in feature_rates_of([row["features"] for row in rows]).items():
        f = FEATURES[name]
        out.append({"feature": name, "describe": f.describe, "on_code": f.on_code, "answers": r.n, "with": r.k,
                    "rate": r.rate, "ci_low": r.ci_low, "ci_high": r.ci_high, "candidate": low <= r.rate <= high})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=6, help="first-turn answers per bank task")
    p.add_argument("--low", type=float, default=0.15, help="lowest base rate of a candidate preference")
    p.add_argument("--high", type=float, default=0.60, help="highest base rate of a candidate preference")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (the engine batches them)")
    p.add_argument("--json", default=None, help="write the table and every answer's features here")
    args = p.parse_args(argv)

    from lab.simulate.bank import load_bank
    from lab.simulate.runner import SimSpec, first_turns
    from rl_core.config import load_config
    from rl_core.init import init

    cfg = load_config()
    init(cfg, check_generation=False)
    spec = SimSpec.from_config(cfg)
    bank = [t for t in load_bank() if not cfg.simulate.tasks or t.id in cfg.simulate.tasks]
    t0 = time.time()
    rows = [r for rs in first_turns(cfg, bank, lambda task, user, chat, i: ask(task, user, chat, args.samples, i),
                                    args.concurrency, "census-gateway.log") for r in rs]
    tab = table(rows, args.low, args.high)
    print(f"\n{cfg.model.base}, temperature {spec.temperature}, max_tokens {spec.max_tokens}, {len(bank)} tasks x "
          f"{args.samples} first-turn answers = {len(rows)} answers, {time.time() - t0:.0f} s\n")
    print("| feature | what a user asks for | judged on | answers | with it | rate | 95% CI | candidate |")
    print("|---|---|---|---:|---:|---:|---|---|")
    for r in sorted(tab, key=lambda r: -r["rate"]):
        print(f"| {r['feature']} | {r['describe']} | {'code' if r['on_code'] else 'answer'} | {r['answers']} | "
              f"{r['with']} | {r['rate']:.3f} | [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | "
              f"{'yes' if r['candidate'] else ''} |")
    if args.json:
        meta = {"model": cfg.model.base, "temperature": spec.temperature, "max_tokens": spec.max_tokens,
                "samples": args.samples, "tasks": len(bank), "seconds": round(time.time() - t0, 1)}
        Path(args.json).write_text(json.dumps({"meta": meta, "table": tab, "answers": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
