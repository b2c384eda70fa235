"""Samples per task, seeded draws, the IDE's apply, and an eval that states (and is judged by) its power."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from evals.compare import compare, paired
from evals.harness import Budget, TaskResult, run_episode
from evals.policies import Completion, EnginePolicy
from evals.runner import run_suite
from evals.tasks import Task

ADD = Task(id="p-add", kind="bugfix", prompt="add() in calc.py subtracts, fix it",
           files={"calc.py": "def add(a, b):\n    return a - b\n"},
           hidden_tests={"test_hidden.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
           tools=["read_file", "write_file", "run_tests"], target="calc.py")


class Pasting:
    """Answers with a code block and no tool call, as SmolLM2 does; fixes the bug when the seed is even."""

    name = "scripted:pasting"

    def __init__(self):
        self.seeds: list[int | None] = []

    def complete(self, messages, tools, max_tokens, temperature, seed=None):
        self.seeds.append(seed)
        op = "+" if seed is not None and seed % 2 == 0 else "-"
        return Completion(f"Fixed:\n```python\ndef add(a, b):\n    return a {op} b\n```", [], 10, 10, 0.0, "stop")


def _r(task: str, sample: int, passed: bool) -> TaskResult:
    return TaskResult(task, "bugfix", "p", passed, int(passed), int(not passed), "passed", 1, 0, 0, False, 10, 5,
                      1.0, 0.1, sample=sample)


def test_a_code_block_is_applied_to_the_target_and_judged():
    p = Pasting()
    results = [run_episode(ADD, p, Budget(samples=1, seed=s), 0) for s in range(12)]
    applied_and_fixed = [r.passed for r, s in zip(results, p.seeds, strict=True) if s % 2 == 0]
    assert applied_and_fixed and all(applied_and_fixed)  # the block replaced calc.py and the hidden test ran on it
    assert not any(r.passed for r, s in zip(results, p.seeds, strict=True) if s % 2 == 1)
    untargeted = run_episode(ADD.model_copy(update={"target": ""}), Pasting(), Budget(seed=0))
    assert not untargeted.passed  # no target: a code block stays an answer, as in the old suite


def test_samples_are_seeded_per_task_sample_and_turn():
    budget = Budget(max_turns=1, samples=3, seed=7)
    p = Pasting()
    results = run_suite([ADD], p, budget, workers=2, progress=False)
    assert [r.sample for r in results] == [0, 1, 2]
    assert len(set(p.seeds)) == 3 and set(p.seeds) == {budget.draw_seed("p-add", k, 0) for k in range(3)}
    again = Pasting()
    assert [r.passed for r in run_suite([ADD], again, budget, workers=1, progress=False)] == [r.passed for r in results]
    assert budget.draw_seed("p-add", 0, 0) != dataclasses.replace(budget, seed=8).draw_seed("p-add", 0, 0)


def test_pairs_by_task_and_sample_and_clusters_by_task():
    base = [_r(f"t{i}", k, (i + k) % 2 == 0) for i in range(10) for k in range(4)]
    cand = [_r(f"t{i}", k, (i + k) % 2 == 0 and not (i == 0 and k == 0)) for i in range(10) for k in range(4)]
    m = paired(cand, base, "passed", tolerance=0.0)
    assert m.n == 10 and m.n_pairs == 40 and m.mean_diff == pytest.approx(-1 / 40)
    task_diffs = [-0.25] + [0.0] * 9
    mean = sum(task_diffs) / 10
    se = math.sqrt(sum((d - mean) ** 2 for d in task_diffs) / 9 / 10)
    assert m.se == pytest.approx(se)  # over the 10 tasks, not the 40 pairs
    # the design SE (independent draws at the baseline's rate 0.5) sets the floor of the detectable change
    assert m.mde == pytest.approx((1.96 + 0.8416) * max(se, math.sqrt(2 * 0.25 / 40)), rel=1e-3)


def test_a_blind_suite_is_refused_and_a_powered_one_judges():
    zeros = [_r(f"t{i}", k, False) for i in range(60) for k in range(4)]
    blind = compare("r", zeros, zeros, tolerance=0.02, max_mde=0.1)
    assert blind.verdict == "underpowered" and not blind.passed
    assert any("cannot show" in r for r in blind.reasons)
    assert compare("r", zeros, zeros, tolerance=0.02).verdict == "no_regression"  # max_mde 0: not checked
    rng = random.Random(0)
    base = [_r(f"t{i}", k, rng.random() < 0.5) for i in range(60) for k in range(8)]
    powered = compare("r", base, base, tolerance=0.02, max_mde=0.1)
    assert powered.verdict == "no_regression", powered.reasons
    few = [r for r in base if r.sample == 0 and r.task_id in {f"t{i}" for i in range(10)}]
    weak = compare("r", few, few, tolerance=0.02, max_mde=0.1)
    assert weak.verdict == "underpowered" and "minimum detectable change" in weak.reasons[0]
    worse = [_r(r.task_id, r.sample, r.passed and rng.random() < 0.6) for r in base]
    assert compare("r", worse, base, tolerance=0.02, max_mde=0.1).verdict == "regression"


def test_engine_policy_generates_seeded_through_the_serving_backend(tiny_checkpoint, cfg):
    policy = EnginePolicy(tiny_checkpoint, cfg, kind="transformers")
    assert policy._backend is None  # nothing starts before the first request
    try:
        msgs = [{"role": "user", "content": "fix add"}]
        a = policy.complete(msgs, [], 8, 1.0, seed=3)
        b = policy.complete(msgs, [], 8, 1.0, seed=3)
        assert a.content == b.content and a.completion_tokens >= 1 and a.prompt_tokens > 0
    finally:
        policy.close()
    assert policy._backend is None
