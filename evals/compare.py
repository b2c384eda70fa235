"""Candidate versus baseline on the same tasks, with paired error bars, and the "eval" verdict.

Following Miller (2024), "Adding Error Bars to Evals: A Statistical Approach to Language Model
Evaluations": both models answer the *same* questions, so we compare per-task differences
d_i = candidate_i - baseline_i. Their mean estimates the change; their standard error
sd(d) / sqrt(n) is the paired SE, much smaller than the unpaired one when the tasks' difficulty
dominates the variance. A metric regresses when it gets worse by more than `tolerance` AND the
z-interval of the mean difference excludes zero: noise alone never blocks a checkpoint, and a tiny
but certain drop within tolerance neither.

Metrics compared per task: passed (higher is better), clarified (asked instead of acting: lower is
better), invalid_tool_rate (lower is better) and wrote_code (changed a file or answered with a complete code
block: higher is better; an update that met a reward by writing less code, as two org adapters did in
docs/results/history-org-conventions.md, fails here even where pass rates are near zero either way). The promotion gate reads the verdict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa

from evals import cache
from evals.harness import Budget, TaskResult
from evals.policies import LocalPolicy, Policy
from evals.report import markdown
from evals.runner import aggregate, results_table, run_suite
from evals.tasks import load_tasks
from rl_core.config import Config
from rl_core.lake import lake_from_config
from rl_core.registry.store import checkpoint_path
from rl_core.reports import Verdict, write_verdict

# per-task metric -> +1 when higher is better, -1 when lower is better
PAIRED_METRICS = {"passed": +1, "clarified": -1, "invalid_tool_rate": -1, "wrote_code": +1}


@dataclass
class PairedMetric:
    metric: str
    n: int
    candidate_mean: float
    baseline_mean: float
    mean_diff: float  # candidate - baseline
    se: float  # paired standard error of mean_diff
    ci_low: float
    ci_high: float
    regression: bool


@dataclass
class EvalComparison:
    run_id: str
    verdict: str  # "no_regression" | "regression"
    passed: bool
    metrics: list[PairedMetric]
    candidate: dict[str, float]
    baseline: dict[str, float]
    reasons: list[str]


def _value(r: TaskResult, metric: str) -> float:
    return float(r.invalid_tool_rate if metric == "invalid_tool_rate" else getattr(r, metric))


def paired(candidate: list[TaskResult], baseline: list[TaskResult], metric: str, tolerance: float,
           z: float = 1.96) -> PairedMetric:
    """The paired difference of one per-task metric over the tasks both runs share."""
    if metric not in PAIRED_METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {sorted(PAIRED_METRICS)}")
    base = {r.task_id: r for r in baseline}
    pairs = [(_value(c, metric), _value(base[c.task_id], metric)) for c in candidate if c.task_id in base]
    n = len(pairs)
    if n == 0:
        raise ValueError("candidate and baseline share no task")
    diffs = [c - b for c, b in pairs]
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else math.inf
    se = math.sqrt(var / n)
    lo, hi = mean - z * se, mean + z * se
    direction = PAIRED_METRICS[metric]
    worse = -direction * mean  # > 0 when the candidate is worse
    significant = hi < 0 if direction > 0 else lo > 0
    return PairedMetric(metric, n, sum(c for c, _ in pairs) / n, sum(b for _, b in pairs) / n, mean, se, lo, hi,
                        bool(worse > tolerance and significant))


def compare(run_id: str, candidate: list[TaskResult], baseline: list[TaskResult], tolerance: float,
            z: float = 1.96) -> EvalComparison:
    metrics = [paired(candidate, baseline, m, tolerance, z) for m in PAIRED_METRICS]
    reasons = [
        f"{m.metric}: candidate {m.candidate_mean:.3f} vs baseline {m.baseline_mean:.3f} "
        f"(diff {m.mean_diff:+.3f}, paired SE {m.se:.3f}, {z:g}-interval [{m.ci_low:+.3f}, {m.ci_high:+.3f}], "
        f"tolerance {tolerance}) over {m.n} tasks"
        for m in metrics if m.regression
    ]
    verdict = "regression" if reasons else "no_regression"
    return EvalComparison(run_id, verdict, not reasons, metrics, aggregate(candidate), aggregate(baseline), reasons)


def compare_policies(cfg: Config, run_id: str, candidate: Policy | cache.Cached, baseline: Policy | cache.Cached,
                     tasks=None, progress: bool = False, candidate_key: str | None = None,
                     baseline_key: str | None = None) -> EvalComparison:
    """Run the suite for both policies, write results/comparison/report and the "eval" verdict.

    A `cache.Cached` side is not run again: its results were read from the cache (evals/cache.py).
    A side that does run with a key is kept under it for a later cycle.
    """
    ec = cfg.eval
    tasks = tasks if tasks is not None else load_tasks(cfg.path(ec.tasks_dir), limit=ec.task_limit)
    budget = Budget.from_config(ec)
    lake = lake_from_config(cfg)

    def suite(policy: Policy | cache.Cached, key: str | None) -> list[TaskResult]:
        if isinstance(policy, cache.Cached):
            return policy.results
        results = run_suite(tasks, policy, budget, ec.workers, progress)
        if key is not None:
            cache.save(lake, key, results)
        return results

    cand, base = suite(candidate, candidate_key), suite(baseline, baseline_key)
    result = compare(run_id, cand, base, ec.tolerance, ec.z)
    folder = lake.run(run_id).eval
    table = pa.concat_tables([results_table(cand, "candidate", cached=isinstance(candidate, cache.Cached)),
                              results_table(base, "baseline", cached=isinstance(baseline, cache.Cached))])
    lake.write_parquet(f"{folder}/results.parquet", table)
    lake.write_json(f"{folder}/comparison.json", asdict(result))
    lake.write_bytes(f"{folder}/report.md", markdown(result, candidate.name, baseline.name).encode())
    details = {"verdict": result.verdict, "n_tasks": len(tasks), "candidate": candidate.name,
               "baseline": baseline.name, "candidate_cached": isinstance(candidate, cache.Cached),
               "baseline_cached": isinstance(baseline, cache.Cached),
               **{f"candidate_{k}": v for k, v in result.candidate.items()},
               **{f"baseline_{k}": v for k, v in result.baseline.items()},
               **{f"diff_{m.metric}": m.mean_diff for m in result.metrics},
               **{f"se_{m.metric}": m.se for m in result.metrics}}
    write_verdict(lake, run_id, Verdict(name="eval", passed=result.passed, reasons=result.reasons, details=details))
    return result


def evaluate(cfg: Config, run_id: str, candidate_dir: str | Path, baseline_version: int,
             candidate: Policy | None = None, baseline: Policy | None = None) -> EvalComparison:
    """The cycle's eval step: the suite on the new checkpoint and on the baseline version, paired.

    Writes runs/<run_id>/eval/{results.parquet, comparison.json, report.md} and the verdict "eval",
    which passes iff no metric regressed. `candidate`/`baseline` override the checkpoint-backed
    policies (planted scripted candidates in tests and demos). A checkpoint-backed side whose weights
    already ran this suite is read from the cache (evals/cache.py) instead: the baseline is usually the
    champion an earlier cycle evaluated, or the candidate of the cycle before.
    """
    ec = cfg.eval
    tasks = load_tasks(cfg.path(ec.tasks_dir), limit=ec.task_limit)
    budget, lake = Budget.from_config(ec), lake_from_config(cfg)

    def from_checkpoint(folder, name: str) -> tuple[Policy | cache.Cached, str | None]:
        """The cached run of these weights, else the loaded model; and the cache key to keep its run under."""
        key = cache.key(folder, cfg.model.dtype, tasks, budget)
        return cache.load(lake, key, name) or LocalPolicy(folder, cfg.model.dtype, name=name), key

    candidate_key = baseline_key = None
    if candidate is None:
        candidate, candidate_key = from_checkpoint(candidate_dir, f"candidate:{Path(candidate_dir).name}")
    if baseline is None:
        baseline, baseline_key = from_checkpoint(checkpoint_path(cfg, baseline_version),
                                                 f"rtrl-policy/{baseline_version}")
    return compare_policies(cfg, run_id, candidate, baseline, tasks, candidate_key=candidate_key,
                            baseline_key=baseline_key)
