"""Sandbox and suite throughput: per-run overhead, HumanEval canonical by worker count, the task bank with
scripted policies. Prints a markdown table (run: python bench/evals_sandbox.py)."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evals import humaneval, sandbox  # noqa: E402
from evals.harness import Budget  # noqa: E402
from evals.policies import AskingPolicy, OraclePolicy  # noqa: E402
from evals.runner import aggregate, run_suite  # noqa: E402
from evals.tasks import load_tasks  # noqa: E402


def main() -> None:
    rows = []
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        r = sandbox.run({"a.py": "print(1)"}, ["a.py"])
        times.append(time.perf_counter() - t0)
        assert r.passed
    rows.append(("sandbox: hello world, one run (median of 20)", f"{statistics.median(times) * 1000:.0f} ms",
                 ", ".join(r.isolation)))
    problems = humaneval.load_problems()
    for workers in (1, 2, 4):
        t0 = time.perf_counter()
        res = humaneval.run_solutions(problems, humaneval.canonical(problems), workers, progress=False)
        dt = time.perf_counter() - t0
        rows.append((f"humaneval canonical, {workers} workers", f"{dt:.1f} s",
                     f"{sum(r.passed for r in res)}/{len(res)} passed"))
    tasks = load_tasks(Path(__file__).resolve().parent.parent / "evals" / "tasks")
    for policy in (OraclePolicy(tasks), AskingPolicy()):
        t0 = time.perf_counter()
        agg = aggregate(run_suite(tasks, policy, Budget(), workers=2, progress=False))
        rows.append((f"suite, {len(tasks)} tasks, {policy.name}, 2 workers", f"{time.perf_counter() - t0:.1f} s",
                     f"pass rate {agg['pass_rate']:.2f}"))
    print("| measurement | time | result |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
