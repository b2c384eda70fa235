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
experiments/org-conventions/history.md, fails here even where pass rates are near zero either way). The promotion gate reads the verdict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist

import pyarrow as pa

from evals import cache
from evals.harness import Budget, TaskResult
from evals.policies import EnginePolicy, Policy
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
    n: int  # tasks (the clusters the SE is computed over)
    candidate_mean: float
    baseline_mean: float
    mean_diff: float  # candidate - baseline
    se: float  # paired, task-clustered standard error of mean_diff
    ci_low: float
    ci_high: float
    regression: bool
    n_pairs: int = 0  # (task, sample) pairs
    mde: float = math.nan  # the smallest change this run detects with `power` (two-sided z test)


@dataclass
class EvalComparison:
    run_id: str
    verdict: str  # "no_regression" | "regression" | "underpowered"
    passed: bool
    metrics: list[PairedMetric]
    candidate: dict[str, float]
    baseline: dict[str, float]
    reasons: list[str]
    power: float = 0.8


def _value(r: TaskResult, metric: str) -> float:
    return float(r.invalid_tool_rate if metric == "invalid_tool_rate" else getattr(r, metric))


def _sd(xs: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return math.inf
    m = sum(xs) / n
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def paired(candidate: list[TaskResult], baseline: list[TaskResult], metric: str, tolerance: float,
           z: float = 1.96, power: float = 0.8) -> PairedMetric:
    """The paired difference of one metric over the (task, sample) pairs both runs share, clustered by task.

    Samples of one task are not independent evidence about the suite (Miller 2024, section on clustered
    questions): each task's mean difference is one observation, and the SE is over tasks. The minimum
    detectable change at `power` is (z + z_power) x SE, with the SE taken no smaller than the design's
    own (what independent draws at the baseline's rate would give: 2 p(1-p) / (tasks x samples)), so a run whose
    two sides happened to agree everywhere does not claim a power it has not got."""
    if metric not in PAIRED_METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {sorted(PAIRED_METRICS)}")
    base = {(r.task_id, r.sample): r for r in baseline}
    by_task: dict[str, list[tuple[float, float]]] = {}
    for c in candidate:
        b = base.get((c.task_id, c.sample))
        if b is not None:
            by_task.setdefault(c.task_id, []).append((_value(c, metric), _value(b, metric)))
    if not by_task:
        raise ValueError("candidate and baseline share no (task, sample) pair")
    pairs = [p for ps in by_task.values() for p in ps]
    n, n_pairs = len(by_task), len(pairs)
    task_diffs = [sum(c - b for c, b in ps) / len(ps) for ps in by_task.values()]
    mean = sum(task_diffs) / n
    se = _sd(task_diffs) / math.sqrt(n)
    b_vals = [b for _, b in pairs]
    b_mean = sum(b_vals) / n_pairs
    b_var = sum((x - b_mean) ** 2 for x in b_vals) / n_pairs
    se_design = math.sqrt(2 * b_var / n_pairs)
    mde = (z + NormalDist().inv_cdf(power)) * max(se, se_design)
    lo, hi = mean - z * se, mean + z * se
    direction = PAIRED_METRICS[metric]
    worse = -direction * mean  # > 0 when the candidate is worse
    significant = hi < 0 if direction > 0 else lo > 0
    return PairedMetric(metric, n, sum(c for c, _ in pairs) / n_pairs, b_mean, mean, se, lo, hi,
                        bool(worse > tolerance and significant), n_pairs, mde)


def blind_spots(m: PairedMetric, max_mde: float, power: float) -> list[str]:
    """Why this run could not have seen a pass-rate drop of `max_mde` (empty when it could, or when off)."""
    if max_mde <= 0:
        return []
    out = []
    if m.mde > max_mde:
        out.append(f"{m.metric}: the suite cannot see a change of {max_mde:.3f}: its minimum detectable change at "
                   f"{power:.0%} power is {m.mde:.3f} over {m.n} tasks x {m.n_pairs // max(1, m.n)} samples "
                   "(more tasks or samples, or tasks nearer a 50% pass rate, lower it)")
    if m.baseline_mean < max_mde:
        out.append(f"{m.metric}: the baseline passes {m.baseline_mean:.3f}, so a drop of {max_mde:.3f} cannot show "
                   "(a suite the model cannot pass cannot see it get worse)")
    return out


def compare(run_id: str, candidate: list[TaskResult], baseline: list[TaskResult], tolerance: float,
            z: float = 1.96, power: float = 0.8, max_mde: float = 0.0) -> EvalComparison:
    """Every paired metric; the verdict is "regression" when one is significantly worse beyond `tolerance`, else
    "underpowered" when the pass rate's detectable change exceeds `max_mde` (0: not checked), else
    "no_regression". Only "no_regression" passes: a gate that cannot see a drop must not wave a model through."""
    metrics = [paired(candidate, baseline, m, tolerance, z, power) for m in PAIRED_METRICS]
    reasons = [
        f"{m.metric}: candidate {m.candidate_mean:.3f} vs baseline {m.baseline_mean:.3f} "
        f"(diff {m.mean_diff:+.3f}, paired SE {m.se:.3f}, {z:g}-interval [{m.ci_low:+.3f}, {m.ci_high:+.3f}], "
        f"tolerance {tolerance}) over {m.n} tasks x {m.n_pairs // max(1, m.n)} samples"
        for m in metrics if m.regression
    ]
    blind = blind_spots(next(m for m in metrics if m.metric == "passed"), max_mde, power)
    verdict = "regression" if reasons else "underpowered" if blind else "no_regression"
    return EvalComparison(run_id, verdict, verdict == "no_regression", metrics, aggregate(candidate),
                          aggregate(baseline), reasons + blind, power)


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
        try:
            results = run_suite(tasks, policy, budget, ec.workers, progress)
        finally:
            if isinstance(policy, EnginePolicy):
                policy.close()  # an engine's memory is free before the other side's starts
        if key is not None:
            cache.save(lake, key, results)
        return results

    cand, base = suite(candidate, candidate_key), suite(baseline, baseline_key)
    result = compare(run_id, cand, base, ec.tolerance, ec.z, ec.power, ec.max_mde)
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
               **{f"se_{m.metric}": m.se for m in result.metrics},
               **{f"mde_{m.metric}": m.mde for m in result.metrics},
               "samples": budget.samples, "power": ec.power, "max_mde": ec.max_mde}
    write_verdict(lake, run_id, Verdict(name="eval", passed=result.passed, reasons=result.reasons, details=details))
    return result


def from_checkpoint(cfg: Config, lake, folder: str | Path, name: str, tasks, budget: Budget
                    ) -> tuple[Policy | cache.Cached, str]:
    """One checkpoint-backed side: the cached run of these weights, else the engine on them (it starts only when
    asked); and the cache key to keep its run under."""
    engine = EnginePolicy(folder, cfg, name=name)
    key = cache.key(folder, cfg.model.dtype, tasks, budget, engine.kind)
    return cache.load(lake, key, name) or engine, key


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

    candidate_key = baseline_key = None
    if candidate is None:
        candidate, candidate_key = from_checkpoint(cfg, lake, candidate_dir, f"candidate:{Path(candidate_dir).name}",
                                                   tasks, budget)
    if baseline is None:
        baseline, baseline_key = from_checkpoint(cfg, lake, checkpoint_path(cfg, baseline_version),
                                                 f"rtrl-policy/{baseline_version}", tasks, budget)
    return compare_policies(cfg, run_id, candidate, baseline, tasks, candidate_key=candidate_key,
                            baseline_key=baseline_key)
