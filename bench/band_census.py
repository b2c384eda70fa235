"""The calibrated eval band: which candidate tasks does the base model pass sometimes? (issue 43)

    RTRL_EVAL__TEMPERATURE=0.4 python bench/band_census.py [--samples 8] [--seed 1000] [--low 0.1] [--high 0.9] \
        [--json docs/results/band-census-smollm2.json] [--write evals/band]

Why: a paired eval sees a change only where a task's outcome varies. A task the model never passes (or always
passes) gives candidate and baseline the same score whatever the update did, so a suite of such tasks is blind:
the old suite passed 0 of its tasks for SmolLM2-135M, and its gate could not refuse anything on coding quality.
The most information per episode comes from tasks passed about half the time (binomial variance p(1-p) peaks
at 0.5). This census runs the base checkpoint on every candidate of bench/band/candidates.jsonl (written by
bench/band_tasks.py) `--samples` times under the eval's own sampling ([eval] temperature, max_tokens, max_turns;
the engine the gateway serves with, seeded per sample), judges every episode by its hidden tests, and keeps
the tasks whose pass rate lies in [low, high] as the calibrated suite, one file per kind under --write. The
default keeps every task passed in 1 to 7 of 8 samples: on 8 draws a task's rate is known to about +-0.17, so a
narrower rule mostly selects on noise. Measured 2026-12-07 (T 0.4, 96 tokens): 60 of 176 candidates, suite pass rate
0.396 (at T 0.8 the same candidates passed 1.9%, and 4 were in [0.2, 0.8]).

It prints a per-kind table and writes every episode's outcome to --json, so the band can be checked and
re-derived. Seeds differ from the eval's (`--seed`), so the suite's later measurements are fresh draws.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HERE = Path(__file__).resolve().parent


def census(cfg, tasks, samples: int, seed: int, workers: int) -> list:
    """Every candidate `samples` times on the base checkpoint: the TaskResults in (task, sample) order, and the
    engine kind that generated them."""
    from evals.harness import Budget
    from evals.policies import EnginePolicy
    from evals.runner import run_suite
    from rl_core.models import base_checkpoint

    budget = dataclasses.replace(Budget.from_config(cfg.eval), samples=samples, seed=seed)
    policy = EnginePolicy(base_checkpoint(cfg), cfg, name=f"base:{cfg.model.base}")
    try:
        return run_suite(tasks, policy, budget, workers, progress=True), policy.kind
    finally:
        policy.close()


def per_task(tasks, results) -> list[dict]:
    by: dict[str, list] = {}
    for r in results:
        by.setdefault(r.task_id, []).append(r)
    rows = []
    for t in tasks:
        rs = by[t.id]
        rows.append({"task": t.id, "kind": t.kind, "tags": t.tags, "samples": len(rs),
                     "passed": sum(r.passed for r in rs), "pass_rate": sum(r.passed for r in rs) / len(rs),
                     "wrote_code": sum(r.wrote_code for r in rs), "outcomes": [int(r.passed) for r in rs]})
    return rows


def write_band(tasks, rows: list[dict], low: float, high: float, folder: Path) -> list[str]:
    """The tasks in [low, high], one <kind>.jsonl per kind (sorted by id); returns their ids."""
    keep = {r["task"] for r in rows if low <= r["pass_rate"] <= high}
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.jsonl"):
        old.unlink()
    for kind in sorted({t.kind for t in tasks if t.id in keep}):
        lines = [json.dumps(t.model_dump(mode="json"), sort_keys=True) for t in sorted(tasks, key=lambda t: t.id)
                 if t.id in keep and t.kind == kind]
        (folder / f"{kind}.jsonl").write_text("\n".join(lines) + "\n")
    return sorted(keep)


def table(rows: list[dict], low: float, high: float) -> str:
    out = ["| kind | candidates | pass rate 0 | in band | pass rate 1 | above/below band | mean pass rate |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for kind in sorted({r["kind"] for r in rows} | {"all"}):
        rs = [r for r in rows if kind in ("all", r["kind"])]
        band = sum(low <= r["pass_rate"] <= high for r in rs)
        zero, one = sum(r["pass_rate"] == 0 for r in rs), sum(r["pass_rate"] == 1 for r in rs)
        mean = sum(r["pass_rate"] for r in rs) / len(rs)
        out.append(f"| {kind} | {len(rs)} | {zero} | {band} | {one} | {len(rs) - band - zero - one} | {mean:.3f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--candidates", default=str(HERE / "band"), help="folder of candidate *.jsonl")
    p.add_argument("--samples", type=int, default=8, help="episodes per candidate")
    p.add_argument("--seed", type=int, default=1000, help="sampling seed base (the eval's own is [eval] seed)")
    p.add_argument("--low", type=float, default=0.1)
    p.add_argument("--high", type=float, default=0.9)
    p.add_argument("--workers", type=int, default=16, help="episodes in flight (vLLM batches them)")
    p.add_argument("--limit", type=int, default=0, help="only this many candidates (kind-balanced), for a smoke run")
    p.add_argument("--json", default=None, help="write every episode's outcome here")
    p.add_argument("--write", default=None, help="write the band's tasks here as <kind>.jsonl")
    args = p.parse_args(argv)

    from evals.tasks import load_tasks
    from rl_core.config import load_config
    from rl_core.init import init

    cfg = load_config()
    init(cfg, check_generation=False)
    tasks = load_tasks(args.candidates, limit=args.limit)
    t0 = time.time()
    results, engine = census(cfg, tasks, args.samples, args.seed, args.workers)
    rows = per_task(tasks, results)
    ec = cfg.eval
    print(f"\n{cfg.model.base}: {len(tasks)} candidates x {args.samples} samples, temperature {ec.temperature}, "
          f"max_tokens {ec.max_tokens}, max_turns {ec.max_turns}, seed {args.seed}, {time.time() - t0:.0f} s\n")
    print(table(rows, args.low, args.high))
    statuses = Counter(r.test_status for r in results)
    print(f"\nhidden-test statuses: {dict(statuses)}; policy errors: {sum(bool(r.error) for r in results)}")
    if args.json:
        meta = {"model": cfg.model.base, "samples": args.samples, "seed": args.seed, "temperature": ec.temperature,
                "max_tokens": ec.max_tokens, "max_turns": ec.max_turns, "low": args.low, "high": args.high,
                "engine": engine, "seconds": round(time.time() - t0)}
        Path(args.json).write_text(json.dumps({"meta": meta, "tasks": rows}, indent=1) + "\n")
    if args.write:
        band = write_band(tasks, rows, args.low, args.high, Path(args.write))
        print(f"\n{len(band)} tasks in [{args.low}, {args.high}] written to {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
