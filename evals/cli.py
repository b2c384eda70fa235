"""`rtrl eval`: run the CursorBench-style suite or HumanEval on a registered version, a checkpoint folder or
an OpenAI-compatible endpoint; print the table; log metrics and a markdown/PNG report to MLflow.

  rtrl eval --version 2 --baseline 1        suite on v2 and v1, paired comparison, logged to v2's run
  rtrl eval --suite humaneval --solutions canonical      prints "164/164 passed"
  rtrl eval --checkpoint DIR                a folder that is not registered (nothing is logged)
  rtrl eval --base-url http://127.0.0.1:8000/v1 --model champion     through the serving gateway
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

from evals import humaneval, report
from evals.harness import Budget
from evals.policies import EnginePolicy, OpenAIPolicy
from evals.tasks import load_tasks
from rl_core.config import Config, load_config


def add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=["cursorbench", "humaneval"], default=None, help="default: config eval.suite")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--version", type=int, help="a registered version of the policy")
    src.add_argument("--checkpoint", help="an HF checkpoint folder")
    src.add_argument("--base-url", help="an OpenAI-compatible endpoint (e.g. the rtrl gateway's /v1)")
    p.add_argument("--model", default="champion", help="model name at --base-url")
    p.add_argument("--api-key", default=os.environ.get("RTRL_API_KEY", "rtrl-dev-token"),
                   help="bearer token for --base-url (default: $RTRL_API_KEY, else the dev token); prefer the "
                        "variable: a command line is readable by every process of the host")
    p.add_argument("--baseline", type=int, help="a registered version to compare with (paired)")
    p.add_argument("--solutions", choices=["canonical", "wrong", "model"], default="model",
                   help="humaneval: canonical answers, a wrong answer, or the model's")
    p.add_argument("--limit", type=int, default=None, help="number of tasks (default: config eval.task_limit)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--run-id", default=None, help="lake folder runs/<run-id>/eval (default: eval-v<version>)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=_run)


def _policy(cfg: Config, args, version: int | None):
    from rl_core.registry.store import checkpoint_path  # lazy: keeps rtrl --help fast (pyarrow)

    if args.base_url:
        return OpenAIPolicy(args.base_url, args.model, args.api_key)
    if args.checkpoint:
        return EnginePolicy(args.checkpoint, cfg)
    return EnginePolicy(checkpoint_path(cfg, version), cfg, name=f"rtrl-policy/{version}")


def _run(args) -> int:
    cfg = load_config()
    suite = args.suite or cfg.eval.suite
    workers = args.workers or cfg.eval.workers
    if suite == "humaneval":
        return _humaneval(cfg, args, workers)
    if not (args.version or args.checkpoint or args.base_url):
        print("rtrl eval: give --version, --checkpoint or --base-url", file=sys.stderr)
        return 2
    return _cursorbench(cfg, args, workers)


def _humaneval(cfg: Config, args, workers: int) -> int:
    problems = humaneval.load_problems()
    if args.limit:
        problems = problems[: args.limit]
    if args.solutions == "canonical":
        completions = humaneval.canonical(problems)
    elif args.solutions == "wrong":
        completions = {p["task_id"]: humaneval.WRONG for p in problems}
    else:
        if not (args.version or args.checkpoint or args.base_url):
            print("rtrl eval --suite humaneval --solutions model: give --version, --checkpoint or --base-url",
                  file=sys.stderr)
            return 2
        policy = _policy(cfg, args, args.version)
        try:
            completions = humaneval.policy_completions(problems, policy, cfg.eval.max_tokens)
        finally:
            if isinstance(policy, EnginePolicy):
                policy.close()
    results = humaneval.run_solutions(problems, completions, workers, cfg.eval.timeout_s, not args.no_progress)
    n_pass = sum(r.passed for r in results)
    for r in results:
        if not r.passed and args.solutions != "wrong":
            print(f"FAILED {r.task_id} ({r.status}): {r.stderr_tail.strip().splitlines()[-1:]}")
    print(f"{n_pass}/{len(results)} passed")
    if args.version and args.solutions == "model":
        _log_mlflow(cfg, args.version, {"humaneval_pass_rate": n_pass / len(results)}, {})
    return 0 if args.solutions == "wrong" or n_pass == len(results) or args.solutions == "model" else 1


def _cursorbench(cfg: Config, args, workers: int) -> int:
    from evals.compare import compare_policies  # lazy: keeps rtrl --help fast (pyarrow)
    from evals.runner import aggregate, results_table, run_suite
    from rl_core.lake import lake_from_config

    if args.limit is not None:
        cfg.eval.task_limit = args.limit
    cfg.eval.workers = workers
    tasks = load_tasks(cfg.path(cfg.eval.tasks_dir), limit=cfg.eval.task_limit)
    label = f"v{args.version}" if args.version else ("endpoint" if args.base_url else Path(args.checkpoint).name)
    run_id = args.run_id or f"eval-{label}"
    policy = _policy(cfg, args, args.version)
    if args.baseline is not None:
        base = _policy(cfg, argparse.Namespace(base_url=None, checkpoint=None), args.baseline)
        result = compare_policies(cfg, run_id, policy, base, tasks, progress=not args.no_progress)
        columns = {label: result.candidate, f"v{args.baseline}": result.baseline}
        text = report.markdown(result, policy.name, base.name)
        print(text)
        status = 0 if result.passed else 1
    else:
        try:
            results = run_suite(tasks, policy, Budget.from_config(cfg.eval), workers, not args.no_progress)
        finally:
            if isinstance(policy, EnginePolicy):
                policy.close()
        lake = lake_from_config(cfg)
        lake.write_parquet(f"{lake.run(run_id).eval}/results.parquet", results_table(results, label))
        columns = {label: aggregate(results)}
        text = (f"# eval {run_id}: {policy.name} on {len(tasks)} tasks x {cfg.eval.samples} samples\n\n"
                + report.metrics_table(columns) + "\n")
        print(text)
        status = 0
    if args.version:
        _log_mlflow(cfg, args.version, columns[label], columns, text)
    return status


def _log_mlflow(cfg: Config, version: int, metrics: dict[str, float], columns: dict, text: str | None = None) -> None:
    """Metrics (eval/*) plus report.md / report.png as artifacts of the version's own MLflow run."""
    from rl_core.registry.store import client, get_version  # lazy: keeps rtrl --help fast (pyarrow)

    run_id = get_version(cfg, version).run_id
    c = client(cfg)
    for k, v in metrics.items():
        if not (isinstance(v, float) and math.isnan(v)):
            c.log_metric(run_id, f"eval/{k}", float(v))
    if text is not None:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "report.md").write_text(text)
            report.pass_rate_png(columns, Path(tmp) / "report.png")
            c.log_artifacts(run_id, tmp, "eval")
    print(f"logged to MLflow run {run_id} (version {version})")
