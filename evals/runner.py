"""A suite run: every task `budget.samples` times through a bounded worker pool with a progress bar, then the
aggregate metrics.

Results become one Parquet row per (task, sample, policy); `aggregate` is what the report and MLflow show.
"""

from __future__ import annotations

import math
import sys
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from evals.harness import Budget, TaskResult, run_episode
from evals.policies import Policy
from evals.tasks import Task


def run_suite(tasks: list[Task], policy: Policy, budget: Budget, workers: int = 2,
              progress: bool = True) -> list[TaskResult]:
    """Run every task `budget.samples` times; results come back in (task, sample) order whatever the completion
    order. With an engine that batches (vLLM), `workers` is how many requests it can batch."""
    from tqdm import tqdm

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if budget.samples < 1:
        raise ValueError(f"samples must be >= 1, got {budget.samples}")
    runs = [(t, k) for t in tasks for k in range(budget.samples)]
    bar = tqdm(total=len(runs), desc=policy.name, file=sys.stderr, disable=not progress, leave=False)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_episode, t, policy, budget, k) for t, k in runs]
        for f in futures:
            f.add_done_callback(lambda _f: bar.update(1))
        results = [f.result() for f in futures]
    bar.close()
    return results


def aggregate(results: list[TaskResult]) -> dict[str, float]:
    """Suite-level metrics: rates over episodes (pass, clarifying), over calls (tool validity), means per episode.
    Every task has the same number of samples, so a rate over episodes is also the mean of per-task rates."""
    n = len(results)
    if n == 0:
        raise ValueError("no results to aggregate")
    calls = sum(r.tool_calls for r in results)
    out = {
        "n_tasks": float(len({r.task_id for r in results})),
        "n_episodes": float(n),
        "pass_rate": sum(r.passed for r in results) / n,
        "tool_call_validity_rate": (sum(r.valid_tool_calls for r in results) / calls) if calls else math.nan,
        "clarifying_rate": sum(r.clarified for r in results) / n,
        "error_rate": sum(bool(r.error) for r in results) / n,
        "mean_turns": sum(r.turns for r in results) / n,
        "mean_tool_calls": calls / n,
        "mean_prompt_tokens": sum(r.prompt_tokens for r in results) / n,
        "mean_completion_tokens": sum(r.completion_tokens for r in results) / n,
        "mean_latency_ms": sum(r.latency_ms for r in results) / n,
    }
    for kind in sorted({r.kind for r in results}):
        rs = [r for r in results if r.kind == kind]
        out[f"pass_rate_{kind}"] = sum(r.passed for r in rs) / len(rs)
    return out


def results_table(results: list[TaskResult], role: str, cached: bool = False) -> pa.Table:
    """One row per task result, with the role ("candidate", "baseline", or a version label) and whether
    the result was read back from the baseline cache (evals/cache.py) instead of run now."""
    rows = [{"role": role, "cached": cached, **r.row()} for r in results]
    return pa.Table.from_pylist(rows)
