"""Tools executed on a task's working copy: schemas enforced, paths confined, tests run in the sandbox."""

from __future__ import annotations

import json

from evals.sandbox import Limits
from evals.tools import SPECS, Workspace, openai_tools

FILES = {"m.py": "def f():\n    return 1\n", "test_m.py": "from m import f\n\n\ndef test_f():\n    assert f() == 2\n"}


def _ws(tmp_path, allowed=("read_file", "write_file", "apply_patch", "run_tests")):
    return Workspace(tmp_path / "repo", FILES, list(allowed), Limits(timeout_s=10))


def test_specs_are_json_schemas():
    tools = openai_tools(list(SPECS))
    assert [t["function"]["name"] for t in tools] == list(SPECS)
    for t in tools:
        assert t["type"] == "function" and t["function"]["parameters"]["type"] == "object"


def test_read_patch_and_run_tests(tmp_path):
    ws = _ws(tmp_path)
    r = ws.execute("read_file", json.dumps({"path": "m.py"}))
    assert r.valid and r.ok and "return 1" in r.content
    r = ws.execute("run_tests", "{}")
    assert r.valid and not r.ok and "0 passed, 1 failed" in r.content and "test_f" in r.content
    r = ws.execute("apply_patch", json.dumps({"path": "m.py", "find": "return 1", "replace": "return 2"}))
    assert r.ok
    r = ws.execute("run_tests", "")
    assert r.ok and r.content.startswith("1 passed, 0 failed")
    r = ws.execute("apply_patch", json.dumps({"path": "m.py", "find": "nothing", "replace": "x"}))
    assert r.valid and not r.ok and "occurs 0 times" in r.content


def test_write_file_creates_and_snapshot_sees_it(tmp_path):
    ws = _ws(tmp_path)
    assert ws.execute("write_file", json.dumps({"path": "pkg/new.py", "content": "y = 2\n"})).ok
    assert ws.snapshot()["pkg/new.py"] == "y = 2\n"


def test_bad_calls_are_invalid_and_change_nothing(tmp_path):
    ws = _ws(tmp_path, allowed=("read_file", "write_file"))
    before = ws.snapshot()
    cases = {
        ("write_file", json.dumps({"path": "../../escape.py", "content": "x"})): "outside the repository",
        ("write_file", json.dumps({"path": "/etc/x.py", "content": "x"})): "outside the repository",
        ("write_file", '{"path": "a.py"'): "not valid JSON",
        ("write_file", json.dumps({"path": "a.py"})): "missing required argument 'content'",
        ("write_file", json.dumps({"path": "a.py", "content": 3})): "'content' must be a string",
        ("read_file", json.dumps({"path": "m.py", "mode": "x"})): "unknown argument 'mode'",
        ("run_tests", "{}"): "unknown tool 'run_tests'",
        ("__invalid__", "{broken"): "unknown tool '__invalid__'",
    }
    for (name, args), message in cases.items():
        r = ws.execute(name, args)
        assert not r.valid and not r.ok and message in r.content, (name, args, r.content)
    assert ws.snapshot() == before
    assert not (tmp_path.parent / "escape.py").exists()
