"""The style rule as a check: every module of the product and the lab under 400 lines, every function under 80
(tests are exempt: a test reads best as one story). A failure names the module or function and its length."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOUSES = ("rl_core", "evals", "dags", "plugins", "lab", "bench")
MAX_MODULE, MAX_FUNCTION = 400, 80


def sizes(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(modules over MAX_MODULE lines, functions over MAX_FUNCTION lines), each as 'path[:name]: n lines'."""
    modules, functions = [], []
    for house in HOUSES:
        for path in sorted((root / house).rglob("*.py")):
            src = path.read_text()
            rel = path.relative_to(root)
            if (n := src.count("\n")) > MAX_MODULE:
                modules.append(f"{rel}: {n} lines")
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION:
                        functions.append(f"{rel}:{node.name}: {n} lines")
    return modules, functions


def test_modules_and_functions_stay_small():
    modules, functions = sizes()
    assert not modules, f"modules over {MAX_MODULE} lines: {modules}"
    assert not functions, f"functions over {MAX_FUNCTION} lines: {functions}"


def test_the_check_sees_a_long_module_and_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "big.py").write_text(f"def long():\n{body}\n" + "\n" * MAX_MODULE)
    modules, functions = sizes(tmp_path)
    assert len(modules) == 1 and modules[0].startswith("lab/big.py: "), modules
    assert functions == [f"lab/big.py:long: {MAX_FUNCTION + 1} lines"]
