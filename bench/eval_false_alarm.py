"""How often does the eval gate refuse the base model against itself? (issue 43)

    python bench/eval_false_alarm.py [--samples 16] [--seed 5000] [--splits 2000]

Why: a gate that refuses a model for being itself blocks good updates by chance. Identical weights evaluated
with different sampling seeds differ only by sampling noise, so the share of such comparisons the gate refuses
is its false-alarm rate, which must not exceed the nominal rate of its test.

How: the base runs the configured suite once with `--samples` seeded samples per task (seeds from `--seed`, not
the eval's). Each comparison splits every task's samples at random into two disjoint halves of `eval.samples`
(k) each, one as "candidate", one as "baseline", renumbered 0..k-1 so they pair by sample as the gate pairs
them, and applies the gate's own test (evals.compare.compare with the configured tolerance, z, power and
max_mde). Every split is an evaluation of the base against itself with seeds drawn from the pool: the refusal
share over many splits estimates the false-alarm rate (splits share episodes, so its interval is wider than a
binomial one; the --samples / 2k fully disjoint comparisons are also printed). The pass rate of this fresh run
is also the band's out-of-sample pass rate (the census selected on its own draws).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path
from statistics import NormalDist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def split(results, k: int, rng: random.Random, disjoint: int | None = None):
    """Two disjoint sets of k samples per task, renumbered 0..k-1: (candidate, baseline)."""
    by: dict[str, list] = {}
    for r in results:
        by.setdefault(r.task_id, []).append(r)
    cand, base = [], []
    for rs in by.values():
        rs = sorted(rs, key=lambda r: r.sample)
        if disjoint is None:
            rs = rng.sample(rs, 2 * k)
        else:
            rs = rs[disjoint * 2 * k:(disjoint + 1) * 2 * k]
        cand += [dataclasses.replace(r, sample=i) for i, r in enumerate(rs[:k])]
        base += [dataclasses.replace(r, sample=i) for i, r in enumerate(rs[k:])]
    return cand, base


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=16, help="samples per task in the pool (>= 2 x eval.samples)")
    p.add_argument("--seed", type=int, default=5000)
    p.add_argument("--splits", type=int, default=2000)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--json", default=None, help="write the pool's per-task outcomes here")
    args = p.parse_args(argv)

    from evals.compare import compare
    from evals.harness import Budget
    from evals.policies import EnginePolicy
    from evals.runner import run_suite
    from evals.tasks import load_tasks
    from rl_core.config import load_config
    from rl_core.features import Rate
    from rl_core.init import init
    from rl_core.models import base_checkpoint

    cfg = load_config()
    init(cfg, check_generation=False)
    ec = cfg.eval
    k = ec.samples
    if args.samples < 2 * k:
        p.error(f"--samples must be at least 2 x eval.samples = {2 * k}")
    tasks = load_tasks(cfg.path(ec.tasks_dir), limit=ec.task_limit)
    budget = dataclasses.replace(Budget.from_config(ec), samples=args.samples, seed=args.seed)
    t0 = time.time()
    policy = EnginePolicy(base_checkpoint(cfg), cfg, name=f"base:{cfg.model.base}")
    try:
        pool = run_suite(tasks, policy, budget, args.workers, progress=True)
    finally:
        policy.close()
    run_s = time.time() - t0
    rng = random.Random(args.seed)
    verdicts = [compare("base-vs-base", *split(pool, k, rng), ec.tolerance, ec.z, ec.power, ec.max_mde)
                for _ in range(args.splits)]
    disjoint = [compare("base-vs-base", *split(pool, k, rng, d), ec.tolerance, ec.z, ec.power, ec.max_mde)
                for d in range(args.samples // (2 * k))]
    pass_rate = sum(r.passed for r in pool) / len(pool)
    print(f"\n{cfg.model.base} on {Path(cfg.path(ec.tasks_dir)).name}: {len(tasks)} tasks x {args.samples} samples (seed {args.seed}), "
          f"T {budget.temperature}, {budget.max_tokens} tokens, {policy.kind}, {run_s:.0f} s; pass rate "
          f"{pass_rate:.3f}; each comparison k = {k} against k = {k}, tolerance {ec.tolerance}, z {ec.z}, "
          f"max_mde {ec.max_mde}\n")
    print("| comparisons | refused (any reason) | rate | 95% CI (Wilson) | refused for pass rate | "
          "underpowered | mean detectable change | nominal (one-sided, per metric) |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    nominal = 1 - NormalDist().cdf(ec.z)
    summary = {}
    for name, vs in ((f"{args.splits} random splits", verdicts), (f"{len(disjoint)} disjoint", disjoint)):
        refused = sum(not v.passed for v in vs)
        by_pass = sum(any(m.regression for m in v.metrics if m.metric == "passed") for v in vs)
        under = sum(v.verdict == "underpowered" for v in vs)
        mde = sum(next(m.mde for m in v.metrics if m.metric == "passed") for v in vs) / len(vs)
        r = Rate.of(refused, len(vs))
        lo, hi = r.ci_low, r.ci_high
        summary[name] = {"comparisons": len(vs), "refused": refused, "rate": refused / len(vs), "wilson": [lo, hi],
                         "refused_for_pass_rate": by_pass, "underpowered": under, "mean_mde": mde}
        print(f"| {name} | {refused} | {refused / len(vs):.3f} | [{lo:.3f}, {hi:.3f}] | {by_pass} | {under} | "
              f"{mde:.3f} | {nominal:.3f} |")
    by_metric = {m.metric: sum(any(x.regression for x in v.metrics if x.metric == m.metric) for v in verdicts)
                 for m in verdicts[0].metrics}
    print(f"\nrefusals by metric over the random splits: {by_metric}")
    if args.json:
        rows: dict[str, list[int]] = {}
        for r in pool:
            rows.setdefault(r.task_id, []).append(int(r.passed))
        meta = {"model": cfg.model.base, "tasks": len(tasks), "samples": args.samples, "seed": args.seed, "k": k,
                "temperature": budget.temperature, "max_tokens": budget.max_tokens, "tolerance": ec.tolerance,
                "z": ec.z, "power": ec.power, "max_mde": ec.max_mde, "nominal": nominal, "seconds": round(run_s)}
        Path(args.json).write_text(json.dumps({"meta": meta, "pass_rate": pass_rate, "comparisons": summary,
                                               "refusals_by_metric": by_metric, "tasks": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
