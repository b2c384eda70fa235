"""bench/convention_rate.py counts, per org, the answers whose code follows each convention (the simulator's own
check), from the code the simulated user would apply: a write_file call, else the answer's code block."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path


def _bench(name: str):
    """bench/<name>.py as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / f"bench/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cr = _bench("convention_rate")

HINTED = "def area(w: float, h: float) -> float:\n    return w * h\n"
DOCD = 'def area(w, h):\n    """Area."""\n    return w * h\n'
PLAIN = "def area(w, h):\n    return w * h\n"


def _row(org, text=None, calls=None, persisted=False, reverted=False):
    return {"org_id": org, "completion_text": text, "tool_calls": calls, "edit_persisted": persisted,
            "edit_reverted": reverted}


def _write(src):
    return [{"function": {"name": "write_file", "arguments": json.dumps({"path": "geo.py", "content": src})}}]


def test_counts_follow_the_simulators_check():
    rows = [
        _row("org-acme", calls=_write(HINTED), persisted=True),
        _row("org-acme", text=f"Here:\n```python\n{PLAIN}```", reverted=True),
        _row("org-acme", text="Which file do you mean?"),  # no code: not counted as defining a function
        _row("org-globex", text=f"```python\n{DOCD}```", calls=_write(PLAIN)),  # the tool call wins, as applied
        _row("org-globex", text=f"```python\n{DOCD}```"),
        _row("org-globex", text="```python\ndef broken(:\n```"),  # does not parse
    ]
    acme, globex = cr.rates(rows)
    assert acme == {"org": "org-acme", "answers": 3, "with_function": 2, "type_hints": 1, "docstrings": 0,
                    "persisted": 1, "reverted": 1}
    assert globex == {"org": "org-globex", "answers": 3, "with_function": 2, "type_hints": 0, "docstrings": 1,
                      "persisted": 0, "reverted": 0}


def test_convention_probe_samples_the_simulators_requests_and_judges_them(tiny_checkpoint, monkeypatch):
    """bench/convention_probe.py on the tiny model: every request is answered and counted; the judge is
    convention_rate's, so an answer that writes a hinted function counts as hinted (planted via decode)."""
    cp = _bench("convention_probe")
    tok, model = cp.load(str(tiny_checkpoint), None)
    r = cp.probe(tok, model, n_tasks=2, samples=1, temperature=0.0, max_tokens=4, seed=0)
    assert r["answers"] == 4 and r["tokens"] > 0  # 2 tasks x 2 orgs
    assert r["with_function"] == 0  # 4 random tokens define no function
    monkeypatch.setattr(tok, "decode", lambda *a, **k: f"Here:\n```python\n{HINTED}```")
    r = cp.probe(tok, model, n_tasks=2, samples=1, temperature=0.0, max_tokens=4, seed=0)
    assert (r["answers"], r["with_function"], r["type_hints"], r["docstrings"]) == (4, 4, 4, 0)


def test_convention_probe_tells_test_styles_apart():
    cp = _bench("convention_probe")
    assert cp.test_style("from adder import add\n\ndef test_add():\n    assert add(2, 3) == 5\n") == "pytest"
    assert cp.test_style("import unittest\n\nclass T(unittest.TestCase):\n    def test_a(self):\n        pass\n") == "unittest"
    assert cp.test_style("def add(a, b):\n    return a + b\n") is None  # code, but no tests
    assert cp.test_style("def test_(:\n") is None  # does not parse
    tasks = cp.requests("write_test", 3)
    assert len(tasks) == 3 and all(t.task.kind == "write_test" for t in tasks)
