"""The task bank and its loader: enough tasks of every kind, each solvable and not already solved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.harness import Budget
from evals.policies import AskingPolicy, OraclePolicy
from evals.runner import aggregate, run_suite
from evals.sandbox import Limits
from evals.tasks import KINDS, TaskError, load_tasks
from evals.tools import run_tests

TASKS = Path(__file__).resolve().parent.parent / "evals" / "tasks"


def test_bank_has_40_tasks_across_every_kind():
    tasks = load_tasks(TASKS)
    assert len(tasks) >= 40
    for kind in KINDS:
        assert sum(t.kind == kind for t in tasks) >= 8, kind
    for t in tasks:
        assert t.solution and t.hidden_tests and set(t.tools) == {"read_file", "write_file", "apply_patch", "run_tests"}


def test_limit_is_deterministic_and_covers_every_kind():
    a, b = load_tasks(TASKS, limit=5), load_tasks(TASKS, limit=5)
    assert [t.id for t in a] == [t.id for t in b]
    assert {t.kind for t in a} == set(KINDS)


def test_every_task_is_solvable_and_not_already_solved():
    """The reference solution passes the hidden tests; the untouched snapshot fails them."""
    tasks = load_tasks(TASKS)
    budget = Budget(max_turns=2, limits=Limits(timeout_s=10))
    solved = run_suite(tasks, OraclePolicy(tasks), budget, workers=2, progress=False)
    assert [r.task_id for r in solved if not r.passed] == []
    untouched = run_suite(tasks, AskingPolicy(), budget, workers=2, progress=False)
    assert [r.task_id for r in untouched if r.passed] == []
    assert aggregate(untouched)["clarifying_rate"] == 1.0


@pytest.mark.slow
def test_reference_solutions_keep_visible_tests_green():
    for t in load_tasks(TASKS):
        res = run_tests({**t.files, **t.solution}, Limits(timeout_s=10))
        assert res.passed, (t.id, res.summary)


def _write(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "bank.jsonl").write_text("\n".join(lines) + "\n")
    return folder


GOOD = {"id": "t1", "kind": "bugfix", "prompt": "fix it", "files": {"a.py": "x = 1\n"},
        "hidden_tests": {"test_h.py": "def test_x():\n    pass\n"}}


def test_loader_names_file_line_and_field(tmp_path):
    bad = dict(GOOD, kind="poetry")
    with pytest.raises(TaskError, match=r"bank.jsonl:2: kind"):
        load_tasks(_write(tmp_path / "a", [json.dumps(GOOD), json.dumps(bad)]))
    with pytest.raises(TaskError, match=r"bank.jsonl:1: not valid JSON"):
        load_tasks(_write(tmp_path / "b", ["{nope"]))
    with pytest.raises(TaskError, match="duplicate task id 't1'"):
        load_tasks(_write(tmp_path / "c", [json.dumps(GOOD), json.dumps(GOOD)]))
    with pytest.raises(TaskError, match="files: Value error, path '../evil.py'"):
        load_tasks(_write(tmp_path / "d", [json.dumps(dict(GOOD, files={"../evil.py": ""}))]))
    with pytest.raises(TaskError, match="unknown tools"):
        load_tasks(_write(tmp_path / "e", [json.dumps(dict(GOOD, tools=["rm_rf"]))]))
    with pytest.raises(TaskError, match="does not exist"):
        load_tasks(tmp_path / "nowhere")
    assert [t.id for t in load_tasks(_write(tmp_path / "f", [json.dumps(GOOD)]))] == ["t1"]
