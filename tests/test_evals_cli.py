"""`rtrl eval` end to end: the cycle's evaluate() and the CLI on the registered base model (MLflow on
SQLite), and HumanEval's canonical solutions through the sandbox."""

from __future__ import annotations

import pytest

from evals.compare import evaluate
from rl_core.cli import main
from rl_core.lake import lake_from_config
from rl_core.registry.store import client, get_version
from rl_core.reports import read_verdict


@pytest.mark.slow
def test_evaluate_and_rtrl_eval_on_the_registered_base_model(registered, capsys):
    cfg = registered
    # the cycle's step: same weights as version 1 -> no regression, verdict "eval" written
    result = evaluate(cfg, "cycle-20261202T1000", cfg.models_dir / "tiny", 1)
    assert result.verdict == "no_regression" and all(m.mean_diff == 0 for m in result.metrics)
    lake = lake_from_config(cfg)
    v = read_verdict(lake, "cycle-20261202T1000", "eval")
    assert v.passed and v.details["n_tasks"] == cfg.eval.task_limit
    assert lake.read_parquet("runs/cycle-20261202T1000/eval/results.parquet").num_rows == 2 * cfg.eval.task_limit

    # the next cycle against the same version: the registered checkpoint's run is read back, not rerun
    again = evaluate(cfg, "cycle-20261202T1500", cfg.models_dir / "tiny", 1)
    table = lake.read_parquet("runs/cycle-20261202T1500/eval/results.parquet")
    assert all(table["cached"].to_pylist()) and again.baseline == result.baseline
    details = read_verdict(lake, "cycle-20261202T1500", "eval").details
    assert details["baseline_cached"] and details["candidate_cached"]

    # the CLI: table printed, metrics + report logged to the version's own MLflow run
    assert main(["eval", "--version", "1", "--baseline", "1", "--limit", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| passed | 3 |" in out and "no_regression" in out and "| pass_rate |" in out
    run_id = get_version(cfg, 1).run_id
    c = client(cfg)
    metrics = c.get_run(run_id).data.metrics
    assert metrics["eval/n_tasks"] == 3 and 0 <= metrics["eval/pass_rate"] <= 1
    assert {"eval/clarifying_rate", "eval/mean_turns", "eval/mean_latency_ms"} <= set(metrics)
    arts = {a.path for a in c.list_artifacts(run_id, "eval")}
    assert arts == {"eval/report.md", "eval/report.png"}
    assert lake.read_parquet("runs/eval-v1/eval/results.parquet").num_rows == 6


@pytest.mark.slow
def test_humaneval_canonical_164(cfg, capsys):
    assert main(["eval", "--suite", "humaneval", "--solutions", "canonical", "--no-progress"]) == 0
    assert capsys.readouterr().out.strip().endswith("164/164 passed")


def test_humaneval_canonical_subset_passes_and_wrong_fails(cfg, capsys):
    assert main(["eval", "--suite", "humaneval", "--solutions", "canonical", "--limit", "16", "--no-progress"]) == 0
    assert capsys.readouterr().out.strip().endswith("16/16 passed")
    assert main(["eval", "--suite", "humaneval", "--solutions", "wrong", "--limit", "3", "--no-progress"]) == 0
    assert capsys.readouterr().out.strip().endswith("0/3 passed")


def test_eval_without_a_model_is_a_clear_error(cfg, capsys):
    assert main(["eval"]) == 2
    assert "give --version, --checkpoint or --base-url" in capsys.readouterr().err
