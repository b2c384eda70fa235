"""An organisation's own eval tasks: the shared suite's tasks, judged by the org's conventions as well.

Why: an org adapter earns its place by doing better on *its* organisation's work without losing on the
shared suite. The simulator's organisations differ by convention (`[simulate] conventions`; their picky users
revert edits that break it). Where the convention is one a test can check on code (type hints, docstrings),
an org task is a shared task whose hidden tests also check that every function the episode added or changed
follows it. The reference solution is rewritten to follow it, so every org task stays solvable (the
oracle passes it). Functions left as they were are never judged; `self`/`cls` need no annotation.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from evals.tasks import Task, load_tasks
from rl_core.config import Config

CONVENTION_TEST = "test_hidden_org_convention.py"

_TEST_TEMPLATE = '''import ast
import pathlib

CONVENTION = {convention!r}
ORIGINAL = json_loads({original!r})
CHECKED = {checked!r}


def _functions(src):
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return {{}}
    return {{n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}}


def test_org_convention():
    bad = []
    for path in CHECKED:
        p = pathlib.Path(path)
        if not p.exists():
            continue
        before = {{k: ast.dump(v) for k, v in _functions(ORIGINAL.get(path, "")).items()}}
        for name, node in _functions(p.read_text()).items():
            if before.get(name) == ast.dump(node):
                continue
            args = [a for a in node.args.args if a.arg not in ("self", "cls")]
            if CONVENTION == "type_hints" and (node.returns is None or any(a.annotation is None for a in args)):
                bad.append(path + ": " + name + " has no type hints")
            if CONVENTION == "docstrings" and ast.get_docstring(node) is None:
                bad.append(path + ": " + name + " has no docstring")
    assert not bad, bad
'''


REWRITABLE = ("type_hints", "docstrings")  # conventions a reference solution can be rewritten to follow


def convention_of(cfg: Config, org_id: str) -> str:
    """The org's convention as an eval task can check it: "type_hints" or "docstrings" when the org wants one
    of those (`[simulate] conventions`), else "none". Other answer features (comments, quotes, a summary line)
    are measured on the org's own traffic (bench/feature_census.py, the experiment's sim/* rates) instead."""
    p = cfg.simulate.conventions.get(org_id)
    return p.feature if p is not None and p.want and p.feature in REWRITABLE else "none"


def _follow(source: str, original: str, convention: str) -> str:
    """source with every added or changed function made to follow the convention."""
    tree = ast.parse(source)
    before = {n.name: ast.dump(n) for n in ast.walk(ast.parse(original or "")) if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or before.get(node.name) == ast.dump(node):
            continue
        if convention == "type_hints":
            for a in node.args.args:
                if a.annotation is None and a.arg not in ("self", "cls"):
                    a.annotation = ast.Name("object")
            node.returns = node.returns or ast.Name("object")
        elif convention == "docstrings" and ast.get_docstring(node) is None:
            node.body.insert(0, ast.Expr(ast.Constant(f"{node.name.replace('_', ' ').capitalize()}.")))
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def org_task(task: Task, org_id: str, convention: str) -> Task:
    """The org's variant of a shared task (id `<task>@<org>`), or the task itself for a convention-less org."""
    if convention == "none":
        return task
    checked = sorted(p for p in task.solution if p.endswith(".py") and not Path(p).name.startswith("test_"))
    original = {p: task.files.get(p, "") for p in checked}
    test = _TEST_TEMPLATE.format(convention=convention, original=json.dumps(original), checked=checked)
    test = "from json import loads as json_loads\n" + test
    solution = {p: (_follow(src, task.files.get(p, ""), convention) if p in checked else src)
                for p, src in task.solution.items()}
    return task.model_copy(update={"id": f"{task.id}@{org_id}", "hidden_tests": {**task.hidden_tests, CONVENTION_TEST: test},
                                   "solution": solution, "tags": [*task.tags, f"org={org_id}", f"convention={convention}"]})


def org_tasks(cfg: Config, org_id: str, limit: int | None = None) -> list[Task]:
    """The org's task set: the shared suite's tasks that have a reference solution, as org variants."""
    limit = cfg.eval.task_limit if limit is None else limit
    kinds = ["bugfix", "feature", "refactor", "write_test"]  # "ambiguous" tasks ask; they write no function
    base = load_tasks(cfg.path(cfg.eval.tasks_dir), kinds=kinds, limit=limit)  # kind-balanced subset
    return [org_task(t, org_id, convention_of(cfg, org_id)) for t in base if t.solution]
