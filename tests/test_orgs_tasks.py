"""An org's eval tasks: solvable (the rewritten reference passes), and the convention test fails a correct
solution that breaks the org's convention (so a gain on these tasks can only come from following it)."""

from __future__ import annotations

import pytest

from evals.judge import judge
from evals.sandbox import Limits
from rl_core.config import Preference
from rl_core.orgs.tasks import CONVENTION_TEST, org_tasks


@pytest.fixture
def cfg(cfg):
    """The conventions an eval task can check (rtrl.toml's default conventions are answer features)."""
    cfg.simulate.conventions = {"org-acme": Preference(feature="type_hints"),
                                "org-globex": Preference(feature="docstrings")}
    return cfg


def hidden(task, files: dict[str, str]):
    return judge({**task.files, **files}, task.hidden_tests, Limits(timeout_s=20))


@pytest.mark.parametrize("org, convention", [("org-acme", "type_hints"), ("org-globex", "docstrings")])
def test_org_tasks_pass_with_the_convention_and_fail_without(cfg, org, convention):
    tasks = org_tasks(cfg, org, limit=4)
    assert len(tasks) == 4 and len({t.kind for t in tasks}) >= 3  # kind-balanced
    for t in tasks:
        assert t.id.endswith(f"@{org}") and f"convention={convention}" in t.tags and CONVENTION_TEST in t.hidden_tests
    t = tasks[0]
    shared = next(s for s in org_tasks(cfg, "org-unknown", limit=4) if f"{s.id}@{org}" == t.id)
    assert shared.hidden_tests.keys() == t.hidden_tests.keys() - {CONVENTION_TEST}  # unknown org: the shared task
    assert hidden(t, t.solution).passed  # the org's reference: correct and in convention
    run = hidden(t, shared.solution)  # the shared reference: correct, but breaks the convention
    assert not run.passed and run.n_failed == 1


def test_untouched_functions_are_not_judged(cfg):
    # feature-clamp adds clamp() beside an existing double(x) without hints: only clamp() is judged
    t = next(x for x in org_tasks(cfg, "org-acme", limit=0) if x.id == "feature-clamp@org-acme")
    assert "def double(x):" in t.solution["utils.py"] and "def clamp(x: object" in t.solution["utils.py"]
    assert hidden(t, t.solution).passed
    assert not hidden(t, {}).passed  # unsolved: the task's own hidden test fails
