"""The paired comparison (Miller 2024) and the "eval" verdict the promotion gate reads."""

from __future__ import annotations

import dataclasses
import math

import pytest

from evals.compare import compare, compare_policies, paired
from evals.harness import TaskResult
from evals.policies import AskingPolicy, BrokenToolPolicy, OraclePolicy
from evals.tasks import load_tasks
from rl_core.lake import lake_from_config
from rl_core.reports import read_verdict


def _r(task_id: str, passed: bool, clarified: bool = False, calls: int = 1, valid: int = 1,
       wrote_code: bool = False) -> TaskResult:
    return TaskResult(task_id, "bugfix", "p", passed, int(passed), int(not passed), "passed", 1, calls, valid,
                      clarified, 10, 5, 1.0, 0.1, wrote_code=wrote_code)


def test_paired_se_matches_hand_computation():
    base = [_r(f"t{i}", p) for i, p in enumerate([1, 1, 0, 1, 0])]
    cand = [_r(f"t{i}", p) for i, p in enumerate([1, 0, 0, 1, 1])]
    m = paired(cand, base, "passed", tolerance=0.0)
    diffs = [0, -1, 0, 0, 1]
    mean = sum(diffs) / 5
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4 / 5)
    assert m.n == 5 and m.mean_diff == pytest.approx(mean) and m.se == pytest.approx(se)
    assert m.ci_low == pytest.approx(mean - 1.96 * se) and not m.regression


def test_paired_is_tighter_than_unpaired_when_tasks_differ_in_difficulty():
    # hard tasks fail for both, easy pass for both; the candidate loses exactly one: a small, sure drop
    base = [_r(f"t{i}", i < 15) for i in range(30)]
    cand = [_r(f"t{i}", i < 14) for i in range(30)]
    m = paired(cand, base, "passed", tolerance=0.0)
    unpaired = math.sqrt((0.5 * 0.5 + (14 / 30) * (16 / 30)) / 30)
    assert m.se < unpaired / 2


def test_tolerance_and_significance_both_required():
    base = [_r(f"t{i}", True) for i in range(20)]
    one_loss = [_r(f"t{i}", i != 0) for i in range(20)]
    assert not paired(one_loss, base, "passed", tolerance=0.1).regression  # within tolerance
    noisy = [_r(f"t{i}", i % 2 == 0) for i in range(4)]
    noisy_base = [_r(f"t{i}", i % 2 == 1 or i == 0) for i in range(4)]
    assert not paired(noisy, noisy_base, "passed", tolerance=0.0).regression  # not significant
    all_lost = [_r(f"t{i}", False) for i in range(20)]
    assert paired(all_lost, base, "passed", tolerance=0.1).regression


def test_clarifying_more_is_a_regression_even_at_equal_pass_rate():
    base = [_r(f"t{i}", False) for i in range(10)]
    cand = [_r(f"t{i}", False, clarified=True, calls=0, valid=0) for i in range(10)]
    result = compare("r", cand, base, tolerance=0.02)
    assert result.verdict == "regression" and not result.passed
    assert [m.metric for m in result.metrics if m.regression] == ["clarified"]


def test_writing_less_code_is_a_regression_even_where_nothing_passes():
    """Two org adapters met their reward by writing fewer complete code blocks while the suite's pass rates
    stayed near zero (experiments/org-conventions/history.md, org-conventions v3 and v4): the eval now compares that too."""
    base = [_r(f"t{i}", False, calls=0, valid=0, wrote_code=i < 16) for i in range(20)]
    cand = [_r(f"t{i}", False, calls=0, valid=0, wrote_code=i < 6) for i in range(20)]
    result = compare("r", cand, base, tolerance=0.02)
    assert [m.metric for m in result.metrics if m.regression] == ["wrote_code"] and not result.passed
    assert compare("r", base, base, tolerance=0.02).passed


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="unknown metric"):
        paired([_r("a", True)], [_r("a", True)], "vibes", 0.0)
    with pytest.raises(ValueError, match="share no \(task, sample\) pair"):
        paired([_r("a", True)], [_r("b", True)], "passed", 0.0)


def test_planted_asking_candidate_is_judged_a_regression(cfg):
    tasks = load_tasks(cfg.path(cfg.eval.tasks_dir), limit=cfg.eval.task_limit)
    result = compare_policies(cfg, "cycle-asking", AskingPolicy(), OraclePolicy(tasks), tasks)
    assert result.verdict == "regression" and not result.passed
    assert {m.metric for m in result.metrics if m.regression} == {"passed", "clarified", "wrote_code"}
    lake = lake_from_config(cfg)
    v = read_verdict(lake, "cycle-asking", "eval")
    assert v is not None and not v.passed and any(r.startswith("passed:") for r in v.reasons)
    table = lake.read_parquet("runs/cycle-asking/eval/results.parquet")
    assert table.num_rows == 2 * len(tasks) and set(table.column("role").to_pylist()) == {"candidate", "baseline"}
    assert "regression" in lake.fs.cat(lake.path("runs/cycle-asking/eval/report.md")).decode()


def test_planted_broken_tool_candidate_regresses_on_validity(cfg):
    tasks = load_tasks(cfg.path(cfg.eval.tasks_dir), limit=4)
    result = compare_policies(cfg, "cycle-broken", BrokenToolPolicy(), OraclePolicy(tasks), tasks)
    assert {m.metric for m in result.metrics if m.regression} == {"passed", "invalid_tool_rate", "wrote_code"}


def test_good_candidate_passes(cfg):
    tasks = load_tasks(cfg.path(cfg.eval.tasks_dir), limit=4)
    result = compare_policies(cfg, "cycle-good", OraclePolicy(tasks), OraclePolicy(tasks), tasks)
    assert result.verdict == "no_regression" and result.passed
    assert read_verdict(lake_from_config(cfg), "cycle-good", "eval").passed


def test_evaluate_checkpoint_writes_results_and_verdict(cfg, tiny_checkpoint):
    """The cycle's entry point on a real checkpoint (the baseline given as a policy: no registry needed here;
    tests/test_evals_cli.py runs it against the MLflow-registered version)."""
    from evals.compare import evaluate
    from evals.policies import LocalPolicy

    cfg.eval.task_limit = 3
    result = evaluate(cfg, "cycle-20261202T1000", tiny_checkpoint, 1,
                      baseline=LocalPolicy(tiny_checkpoint, name="rtrl-policy/1"))
    assert result.verdict == "no_regression" and all(m.mean_diff == 0 for m in result.metrics)
    lake = lake_from_config(cfg)
    v = read_verdict(lake, "cycle-20261202T1000", "eval")
    assert v.passed and v.details["n_tasks"] == 3 and v.details["candidate"].startswith("candidate:")
    assert lake.read_parquet("runs/cycle-20261202T1000/eval/results.parquet").num_rows == 6


def test_a_checkpoint_that_already_ran_the_suite_is_read_from_the_cache(cfg, tiny_checkpoint, tmp_path):
    """Same weights, tasks, budget and code -> the earlier run comes back instead of a rerun; any change to
    the weights is a new key; a sampled eval is never cached."""
    import shutil

    from evals import cache
    from evals.compare import evaluate
    from evals.harness import Budget
    from evals.policies import OraclePolicy

    cfg.eval.task_limit = 3
    lake = lake_from_config(cfg)
    tasks = load_tasks(cfg.path(cfg.eval.tasks_dir), limit=3)
    first = evaluate(cfg, "cycle-a", tiny_checkpoint, 1, baseline=OraclePolicy(tasks))
    rows = lake.read_parquet("runs/cycle-a/eval/results.parquet").to_pylist()
    assert not any(r["cached"] for r in rows)
    assert not read_verdict(lake, "cycle-a", "eval").details["candidate_cached"]

    # the same weights in another folder (the registry's copy): same key, results reused, renamed
    copy = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, copy)
    budget = Budget.from_config(cfg.eval)
    assert cache.key(copy, cfg.model.dtype, tasks, budget) == cache.key(tiny_checkpoint, cfg.model.dtype, tasks, budget)
    second = evaluate(cfg, "cycle-b", copy, 1, baseline=OraclePolicy(tasks))
    table = lake.read_parquet("runs/cycle-b/eval/results.parquet")
    cand = [r for r in table.to_pylist() if r["role"] == "candidate"]
    assert all(r["cached"] for r in cand) and all(r["policy"] == "candidate:copy" for r in cand)
    assert read_verdict(lake, "cycle-b", "eval").details["candidate_cached"]
    assert second.candidate == first.candidate and second.metrics == first.metrics

    # changed weights, tasks, seed, samples or engine: another key
    (copy / "generation_config.json").write_text('{"changed": true}')
    assert cache.key(copy, cfg.model.dtype, tasks, budget) != cache.key(tiny_checkpoint, cfg.model.dtype, tasks, budget)
    assert cache.key(tiny_checkpoint, cfg.model.dtype, tasks[:2], budget) != cache.key(
        tiny_checkpoint, cfg.model.dtype, tasks, budget)
    base_key = cache.key(tiny_checkpoint, cfg.model.dtype, tasks, budget)
    assert cache.key(tiny_checkpoint, cfg.model.dtype, tasks, budget, "vllm") != base_key
    for change in ({"seed": 1}, {"samples": 2}, {"temperature": 0.7}):
        assert cache.key(tiny_checkpoint, cfg.model.dtype, tasks, dataclasses.replace(budget, **change)) != base_key

    # a run with a policy error or a test timeout may be the machine's fault that day: never kept
    for bad in ({"error": "ConnectionError: reset"}, {"test_status": "timeout"}):
        r = _r("t0", False)
        for k, v in bad.items():
            setattr(r, k, v)
        assert cache.save(lake, "k-bad", [_r("t1", True), r]) is None
        assert cache.load(lake, "k-bad", "x") is None
    assert cache.save(lake, "k-good", [_r("t1", True)]) and cache.load(lake, "k-good", "x").results[0].policy == "x"
