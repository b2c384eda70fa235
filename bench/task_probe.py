"""How often the champion solves each task of the simulator's bank on a user's first turn.

    python bench/task_probe.py [--samples 8] [--low 0.1] [--high 0.9]   (RTRL_HOME / RTRL_PROFILE pick the stack)

Why: a policy-gradient update learns only where the reward varies between answers to the same kind of
request. A task the model never solves (or always solves) gives every answer the same reward, so its
advantages are noise. This probe serves the champion through the real gateway (the same engine, chat
template and sampling temperature as `rtrl simulate`), asks each task `--samples` times as a user's first
turn, and judges every answer as the simulated user would: the edit applied, the hidden tests run in the
sandbox. It prints a per-task table and the ids whose pass rate lies in [low, high], ready for
`simulate.tasks` (RTRL_SIMULATE__TASKS='[...]'). Nothing is trained; the gateway's own event log is left
in the probe's RTRL_HOME like any traffic.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def probe_task(task, user, chat, samples: int, seed: int) -> dict:
    from evals.tools import Workspace, openai_tools
    from lab.simulate.users import TEST_LIMITS, react, request_text
    from rl_core.schema import now_utc

    outcomes: dict[str, int] = {}
    for k in range(samples):
        rng = random.Random(seed * 1000 + k)
        messages = [{"role": "user", "content": request_text(user, task)}]
        reply = chat(user, f"probe-{task.id}-{k}", 0, messages, openai_tools(task.task.tools), rng.randrange(2**31))
        with tempfile.TemporaryDirectory(prefix="rtrl-probe-") as root:
            ws = Workspace(Path(root), dict(task.task.files), list(task.task.tools), TEST_LIMITS)
            _, outcome, _, _ = react(user, task, ws, reply, now_utc(), rng, 0)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    passed = outcomes.get("edit_passed", 0) + outcomes.get("edit_convention", 0)
    return {"task": task.id, "hard": task.hard, "org": task.org or "", "samples": samples,
            "tests_passed": passed, "pass_rate": passed / samples, "outcomes": outcomes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=8, help="first-turn answers per task")
    p.add_argument("--low", type=float, default=0.1, help="lowest pass rate to list as learnable")
    p.add_argument("--high", type=float, default=0.9, help="highest pass rate to list as learnable")
    p.add_argument("--concurrency", type=int, default=4, help="tasks probed at once")
    p.add_argument("--json", default=None, help="also write the per-task rows here")
    args = p.parse_args(argv)

    from lab.simulate.bank import load_bank
    from lab.simulate.runner import SimSpec, first_turns
    from rl_core.config import load_config
    from rl_core.init import init

    cfg = load_config()
    init(cfg, check_generation=False)
    spec = SimSpec.from_config(cfg)
    t0 = time.time()
    rows = first_turns(cfg, load_bank(), lambda task, user, chat, i: probe_task(task, user, chat, args.samples, i),
                       args.concurrency, "probe-gateway.log")
    print(f"\n{cfg.model.base}, temperature {spec.temperature}, max_tokens {spec.max_tokens}, {args.samples} "
          f"first-turn answers per task, {time.time() - t0:.0f} s\n")
    print("| task | hard | org | hidden tests passed | pass rate | outcomes |")
    print("|---|---|---|---:|---:|---|")
    for r in rows:
        oc = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
        print(f"| {r['task']} | {'yes' if r['hard'] else ''} | {r['org']} | {r['tests_passed']}/{r['samples']} | "
              f"{r['pass_rate']:.2f} | {oc} |")
    total = sum(r["tests_passed"] for r in rows) / max(sum(r["samples"] for r in rows), 1)
    band = [r["task"] for r in rows if args.low <= r["pass_rate"] <= args.high]
    print(f"\nall tasks: {total:.3f} pass rate; {len(band)} of {len(rows)} in [{args.low}, {args.high}]")
    print(f"RTRL_SIMULATE__TASKS='{json.dumps(band)}'")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
