"""Does the eval gate refuse a worse checkpoint? The base model with its weights perturbed, against itself (issue 43).

    python bench/eval_degraded.py [--sigma 0.05 ...] [--seed 0]

Why: a gate that has never refused anything proves nothing. This makes a checkpoint that is worse at coding by
construction: every weight matrix of the base gets Gaussian noise of `sigma` times its own standard deviation
(seeded; norms and biases untouched), so its pass rate on the calibrated band drops. It then runs the cycle's
eval exactly as the gate sees it (evals.compare.compare_policies: the configured suite, samples, seeds and
engine, candidate and baseline paired by task and sample, the "eval" verdict written to the lake) with the
perturbed copy as candidate and the base as baseline, and prints one row per sigma: both pass rates, the
paired difference with its interval, the minimum detectable change at the configured power, and the verdict.
The baseline's suite run is cached (evals/cache.py), so it runs once for all sigmas.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def perturb(base: Path, out: Path, sigma: float, seed: int, dtype: str) -> Path:
    """A copy of `base` whose weight matrices carry N(0, (sigma * std(W))^2) noise; reused if already made."""
    import torch

    from rl_core.models import load_model

    if (out / "config.json").is_file():
        return out
    model, tok = load_model(base, dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.ndim >= 2:
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (sigma * float(p.std())))
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sigma", type=float, nargs="+", default=[0.05], help="noise scale(s), relative to each matrix")
    p.add_argument("--seed", type=int, default=0, help="noise seed")
    p.add_argument("--limit", type=int, default=0, help="only this many tasks (a smoke run)")
    p.add_argument("--json", default=None, help="write the rows (and each side's per-task outcomes) here")
    args = p.parse_args(argv)

    from evals.compare import compare_policies, from_checkpoint
    from evals.harness import Budget
    from evals.tasks import load_tasks
    from rl_core.config import load_config
    from rl_core.init import init
    from rl_core.lake import lake_from_config
    from rl_core.models import base_checkpoint

    cfg = load_config()
    init(cfg, check_generation=False)
    ec, lake = cfg.eval, lake_from_config(cfg)
    tasks = load_tasks(cfg.path(ec.tasks_dir), limit=args.limit or ec.task_limit)
    budget, base = Budget.from_config(ec), base_checkpoint(cfg)
    rows = []
    for sigma in args.sigma:
        t0 = time.time()
        folder = perturb(base, Path(cfg.path("models")) / f"degraded-s{sigma:g}-seed{args.seed}", sigma, args.seed,
                         cfg.model.dtype)
        sides = {}
        for role, ckpt in (("candidate", folder), ("baseline", base)):
            sides[role] = from_checkpoint(cfg, lake, ckpt, f"{role}:{ckpt.name}", tasks, budget)
        run_id = f"degraded-s{sigma:g}-seed{args.seed}"
        r = compare_policies(cfg, run_id, sides["candidate"][0], sides["baseline"][0], tasks,
                             candidate_key=sides["candidate"][1], baseline_key=sides["baseline"][1])
        m = next(m for m in r.metrics if m.metric == "passed")
        rows.append((sigma, m, r, time.time() - t0))
    print(f"\n{cfg.model.base} on {Path(cfg.path(ec.tasks_dir)).name} ({len(tasks)} tasks x {budget.samples} samples, T {budget.temperature}, "
          f"{budget.max_tokens} tokens, tolerance {ec.tolerance}, z {ec.z}, max_mde {ec.max_mde})\n")
    print(f"| sigma | candidate pass rate | baseline pass rate | diff | {ec.z:g}-interval | detectable change "
          f"({ec.power:.0%} power) | verdict | refused | s |")
    print("|---:|---:|---:|---:|---|---:|---|---|---:|")
    for sigma, m, r, dt in rows:
        print(f"| {sigma:g} | {m.candidate_mean:.3f} | {m.baseline_mean:.3f} | {m.mean_diff:+.3f} | "
              f"[{m.ci_low:+.3f}, {m.ci_high:+.3f}] | {m.mde:.3f} | {r.verdict} | {'yes' if not r.passed else 'no'} "
              f"| {dt:.0f} |")
    for sigma, _, r, _ in rows:
        for reason in r.reasons:
            print(f"- sigma {sigma:g}: {reason}")
    if args.json:
        meta = {"model": cfg.model.base, "tasks": len(tasks), "samples": budget.samples, "seed": budget.seed,
                "temperature": budget.temperature, "max_tokens": budget.max_tokens, "tolerance": ec.tolerance,
                "z": ec.z, "power": ec.power, "max_mde": ec.max_mde, "noise_seed": args.seed}
        out = [{"sigma": sigma, "verdict": r.verdict, "refused": not r.passed, "reasons": r.reasons,
                "seconds": round(dt), **{k: getattr(m, k) for k in ("n", "n_pairs", "candidate_mean", "baseline_mean",
                                                                   "mean_diff", "se", "ci_low", "ci_high", "mde")}}
               for sigma, m, r, dt in rows]
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
