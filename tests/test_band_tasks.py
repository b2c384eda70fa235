"""The band candidates (bench/band_tasks.py -> bench/band/candidates.jsonl, issue 43): enough of every kind,
each answerable by one code block over its target, new to both task banks, solvable and not already solved."""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evals.judge import judge
from evals.sandbox import Limits
from evals.tasks import load_tasks

ROOT = Path(__file__).resolve().parent.parent
BAND = ROOT / "bench" / "band"
BANKS = [ROOT / "lab" / "simulate" / "tasks", ROOT / "evals" / "tasks"]
KINDS = ("bugfix", "feature", "refactor", "write_test")
# the fast check's fixed sample: 3 per kind, the odd shapes among them (a class, None, a docstring stub, a missing
# function, type hints, two renamed parameters, an extracted helper, mutants that need a chosen input)
SAMPLE = [
    "band-bugfix-tally-bump", "band-bugfix-lookup", "band-bugfix-is-leap",
    "band-feature-box-class", "band-feature-squares-of", "band-feature-starts-upper",
    "band-refactor-hints-is-short", "band-refactor-repeat-word", "band-refactor-extract-tidy",
    "band-write-test-fizz", "band-write-test-leap-year", "band-write-test-full",
]


def _candidates():
    return load_tasks(BAND)


def _is_test(path: str) -> bool:
    return Path(path).name.startswith("test_")


def _defs(src: str) -> list[str]:
    return [n.name for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def _code_names(tasks, tests_too: bool) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """(module names, top-level function/class names, (module, name) pairs) over files and solutions."""
    mods, names, pairs = set(), set(), set()
    for t in tasks:
        for path, src in list(t.files.items()) + list(t.solution.items()):
            if not path.endswith(".py") or (_is_test(path) and not tests_too):
                continue
            mod = path[:-3].replace("/", ".")
            mods.add(mod)
            for name in _defs(src):
                names.add(name)
                pairs.add((mod, name))
    return mods, names, pairs


def test_candidates_cover_every_kind_with_a_target():
    tasks = _candidates()
    assert len(tasks) >= 150
    for kind in KINDS:
        assert sum(t.kind == kind for t in tasks) >= 25, kind
    assert {t.kind for t in tasks} == set(KINDS)
    for t in tasks:
        assert t.id.startswith(f"band-{t.kind.replace('_', '-')}-"), t.id
        assert t.target and t.target in t.files, t.id
        assert set(t.solution) == {t.target}, t.id  # one code block over the target solves it
        assert t.tools == ["read_file", "write_file", "run_tests"], t.id
        assert t.tags[0] == "band" and t.tags[1] in ("trivial", "easy", "moderate"), t.id
        assert "\n" not in t.prompt.strip() and t.target.split("/")[-1] in t.prompt, t.id  # names the file
        for path in t.hidden_tests:
            assert path not in t.files, t.id


def test_targets_are_one_short_function():
    """A code block holding just the function is a whole file: one function (or class) per target, a few lines."""
    for t in _candidates():
        if t.kind == "write_test":
            module = next(p for p in t.files if not _is_test(p))
            assert len(_defs(t.files[module])) == 1, t.id
            continue
        assert len(_defs(t.files[t.target])) <= 1, t.id
        assert 1 <= len(_defs(t.solution[t.target])) <= 2, t.id
        assert len(t.solution[t.target].splitlines()) <= 12, t.id


def test_candidates_are_new_to_both_banks():
    """No id, prompt, module, function name or (module, function) pair of the simulator's bank or evals/tasks."""
    tasks = _candidates()
    bank = [t for folder in BANKS for t in load_tasks(folder)]
    assert len(bank) >= 70
    assert not {t.id for t in tasks} & {t.id for t in bank}
    assert not {t.prompt.strip().lower() for t in tasks} & {t.prompt.strip().lower() for t in bank}
    mods, names, pairs = _code_names(tasks, tests_too=False)
    bank_mods, bank_names, bank_pairs = _code_names(bank, tests_too=True)
    assert not pairs & bank_pairs
    assert not mods & bank_mods, sorted(mods & bank_mods)
    assert not names & bank_names, sorted(names & bank_names)
    shadowed = sorted(m for m in mods if m in sys.stdlib_module_names or m in ("rtrl_judge", "pytest"))
    assert not shadowed, shadowed  # a work-dir module must not shadow what the tests import


def test_ids_and_prompts_are_unique_and_the_file_is_up_to_date(tmp_path):
    tasks = _candidates()
    assert len({t.id for t in tasks}) == len(tasks)
    assert len({t.prompt for t in tasks}) == len(tasks)
    assert [t.id for t in tasks] == sorted(t.id for t in tasks)
    out = tmp_path / "candidates.jsonl"
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "band_tasks.py"), "--out", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert out.read_bytes() == (BAND / "candidates.jsonl").read_bytes(), "rerun bench/band_tasks.py"


def _verdicts(task) -> tuple[str, bool, bool]:
    """(id, the reference solution passes, the untouched snapshot passes)."""
    limits = Limits(timeout_s=10)
    solved = judge({**task.files, **task.solution}, task.hidden_tests, limits)
    untouched = judge(dict(task.files), task.hidden_tests, limits)
    return task.id, solved.passed, untouched.passed


def _check_solvable_and_unsolved(tasks) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = list(pool.map(_verdicts, tasks))
    assert [tid for tid, solved, _ in verdicts if not solved] == []
    assert [tid for tid, _, untouched in verdicts if untouched] == []


def test_sample_solutions_pass_and_snapshots_fail():
    by_id = {t.id: t for t in _candidates()}
    assert set(SAMPLE) <= set(by_id)
    assert sorted(by_id[i].kind for i in SAMPLE) == sorted(KINDS * 3)
    _check_solvable_and_unsolved([by_id[i] for i in SAMPLE])


@pytest.mark.slow
def test_every_solution_passes_and_every_snapshot_fails():
    _check_solvable_and_unsolved(_candidates())


@pytest.mark.slow
def test_write_tests_that_check_nothing_fail():
    """A written test must catch the mutant: one that only calls the function (checks no value) passes on the real
    code and fails the task on the mutant alone."""
    tasks = [t for t in _candidates() if t.kind == "write_test"]
    bad = []
    for t in tasks:
        module = next(p for p in t.files if not _is_test(p))[:-3]
        fn = _defs(t.files[module + ".py"])[0]
        call = t.solution[t.target].split("assert ", 1)[1].split(")")[0] + ")"  # the reference's first call
        weak = f"from {module} import {fn}\n\n\ndef test_{fn}():\n    {call.removeprefix('not ')}\n"
        run = judge({**t.files, t.target: weak}, t.hidden_tests, Limits(timeout_s=10))
        if run.passed or (run.n_passed, run.n_failed) != (1, 1):  # runs green on the code, misses the mutant
            bad.append((t.id, run.summary))
    assert bad == []
