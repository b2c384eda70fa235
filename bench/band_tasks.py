"""Candidates for the calibrated band of eval tasks (issue 43): small CursorBench-style tasks, graded trivial to moderate.

    python bench/band_tasks.py --out bench/band/candidates.jsonl

Why: an eval suite has power on a model only where its tasks discriminate. On the product's default model
(SmolLM2-135M-Instruct) the CursorBench-style bank in evals/tasks/ is solved almost never, so a paired
comparison of two checkpoints on it sees 0 vs 0 and can detect nothing. Issue 43 asks for a calibrated band:
at least 60 tasks with executed hidden tests (bugfix, feature, refactor, write_test), none of them in the
simulator's bank, whose pass rate for the default model under the product's sampling lies in [0.2, 0.8].
This script writes the candidates: ~170 one-function tasks, from trivial (a one-token fix the request spells
out) to moderate (a 2-5 line body). A candidate is passable the way the model answers: prose and one
```python block, which the harness applies over the task's `target` file (the IDE's "apply"); so every
target is one short function (or one small class), and a block holding just that function is a whole file.

How the band is chosen: `bench/band_census.py` samples the model k times per candidate (the product's chat
template and sampling), applies each answer over `target`, runs the hidden tests in the judge, and keeps the
candidates whose pass rate lies in [0.2, 0.8] as the bank evals/band/. The tags carry "band" and the
generator's difficulty guess (trivial | easy | moderate), which the census does not trust, only reports.

The rows live in bench/band_specs_{bugfix,feature,refactor,write_test}.py; this file turns them into
evals.tasks.Task lines (ids `band-<kind>-<name>`, sorted), deterministic byte for byte.
tests/test_band_tasks.py proves every reference solution passes, every snapshot fails, and the candidates
share no id, prompt, module or function name with the simulator's bank or evals/tasks/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import band_specs_bugfix  # noqa: E402
import band_specs_feature  # noqa: E402
import band_specs_refactor  # noqa: E402
import band_specs_write_test  # noqa: E402

TOOLS = ["read_file", "write_file", "run_tests"]
LEVELS = ("trivial", "easy", "moderate")
DEFAULT_OUT = HERE / "band" / "candidates.jsonl"


def function_src(sig: str, body: str, doc: str = "") -> str:
    """A one-function module: `def sig:`, an optional docstring, the body (unindented lines) indented."""
    lines = [f"def {sig}:"] + ([f'    """{doc}"""'] if doc else []) + ["    " + ln for ln in body.splitlines()]
    return "\n".join(lines) + "\n"


def func_name(spec: dict) -> str:
    return spec.get("fn") or spec["sig"].split("(")[0]


def assert_test(header: str, test_name: str, checks: list[str], helpers: str = "") -> str:
    """A hidden test file: the import header, optional helpers, one test function asserting every check."""
    body = "".join(f"    assert {c}\n" for c in checks)
    return header + "\n\n\n" + (helpers + "\n\n" if helpers else "") + f"def test_{test_name}():\n" + body


def task(kind: str, spec: dict, files: dict, hidden: dict, solution: dict, target: str) -> dict:
    assert spec["level"] in LEVELS, spec["name"]
    return {"id": f"band-{kind.replace('_', '-')}-{spec['name']}", "kind": kind, "prompt": spec["prompt"],
            "files": files, "hidden_tests": hidden, "tools": list(TOOLS), "solution": solution,
            "target": target, "tags": ["band", spec["level"]]}


def bugfix(spec: dict) -> dict:
    path, fn = spec["mod"] + ".py", func_name(spec)
    before = spec.get("bug_src") or function_src(spec["sig"], spec["bug"])
    after = spec.get("fix_src") or function_src(spec["sig"], spec["fix"])
    test = assert_test(f"from {spec['mod']} import {fn}", fn.lower(), spec["checks"], spec.get("helpers", ""))
    return task("bugfix", spec, {path: before}, {"test_hidden.py": test}, {path: after}, path)


def feature_stub(spec: dict) -> str:
    """The snapshot of a feature task: the function's stub (or, for "missing", a module without it)."""
    if "stub_src" in spec:
        return spec["stub_src"]
    stub = spec.get("stub", "raise")
    if stub == "missing":
        return f"# {spec['mod']}.py: small helpers\n"
    body = {"raise": "raise NotImplementedError", "pass": "pass", "todo": "# TODO\npass",
            "doc": "raise NotImplementedError"}[stub]
    return function_src(spec["sig"], body, spec.get("doc", "") if stub == "doc" else "")


def feature(spec: dict) -> dict:
    path, fn = spec["mod"] + ".py", func_name(spec)
    after = spec.get("src") or function_src(spec["sig"], spec["body"])
    test = assert_test(f"from {spec['mod']} import {fn}", fn.lower(), spec["checks"])
    return task("feature", spec, {path: feature_stub(spec)}, {"test_hidden.py": test}, {path: after}, path)


ANNOTATIONS_HELPER = ('def _ann(f):\n    return {k: getattr(v, "__name__", v) for k, v in '
                      'f.__annotations__.items()}\n')


def refactor(spec: dict) -> dict:
    path, mod = spec["mod"] + ".py", spec["mod"]
    test = assert_test(f"import inspect\n\nimport {mod}", "refactor", spec["checks"], ANNOTATIONS_HELPER)
    return task("refactor", spec, {path: spec["before"]}, {"test_hidden.py": test}, {path: spec["after"]}, path)


WRITE_TEST_CHECK = '''import importlib
import sys

import rtrl_judge

import {mod}


def _run_user_tests():
    sys.modules.pop("{test_mod}", None)
    t = importlib.import_module("{test_mod}")
    fns = [getattr(t, n) for n in sorted(dir(t)) if n.startswith("test_") and callable(getattr(t, n))]
    assert fns, "no test functions in {test_mod}.py"
    for f in fns:
        f()


def test_written_tests_pass():
    _run_user_tests()


def test_written_tests_catch_a_bug():
    good = {mod}.{fn}
    {mod}.{fn} = rtrl_judge.remote({mutant!r})
    try:
        try:
            _run_user_tests()
        except Exception:
            return
        raise AssertionError("the tests in {test_mod}.py did not catch a broken {fn}")
    finally:
        {mod}.{fn} = good
'''


def write_test(spec: dict) -> dict:
    """The module is right; the target is test_<mod>.py; the hidden test runs it on the code and on a mutant."""
    mod, fn = spec["mod"], func_name(spec)
    test_mod = f"test_{mod}"
    imports = f"from {mod} import {fn}\n"
    stub = {"empty": "", "import": imports,
            "pass": imports + f"\n\ndef test_{fn}():\n    pass\n"}[spec.get("stub", "empty")]
    check = WRITE_TEST_CHECK.format(mod=mod, fn=fn, test_mod=test_mod, mutant=spec["mutant"])
    solution = imports + "\n\n" + f"def test_{fn}():\n" + "".join(f"    assert {c}\n" for c in spec["sol"])
    files = {mod + ".py": function_src(spec["sig"], spec["body"]), test_mod + ".py": stub}
    return task("write_test", spec, files, {f"test_hidden_{mod}_check.py": check}, {test_mod + ".py": solution},
                test_mod + ".py")


FAMILIES = [(bugfix, band_specs_bugfix.SPECS), (feature, band_specs_feature.SPECS),
            (refactor, band_specs_refactor.SPECS), (write_test, band_specs_write_test.SPECS)]


def build() -> list[dict]:
    """Every candidate, sorted by id; ids and prompts are unique."""
    tasks = sorted((make(spec) for make, specs in FAMILIES for spec in specs), key=lambda t: t["id"])
    for field in ("id", "prompt"):
        values = [t[field] for t in tasks]
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise ValueError(f"duplicate {field}s among the band candidates: {dupes}")
    return tasks


def write(tasks: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSONL file to write (one task a line)")
    args = p.parse_args(argv)
    tasks = build()
    write(tasks, args.out)
    counts: dict[str, int] = {}
    for t in tasks:
        key = f"{t['kind']}/{t['tags'][1]}"
        counts[key] = counts.get(key, 0) + 1
    print(f"{len(tasks)} candidates -> {args.out}")
    for key in sorted(counts):
        print(f"  {key}: {counts[key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
