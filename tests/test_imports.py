"""The two houses, walked from the source: every import statement of the product (rl_core, evals, the DAGs and
plugins), function-level ones included, resolved to the module it names. The product imports nothing of the lab
(lab/), and no two product modules import each other through any path (a cycle hidden by a lazy import counts).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("rl_core", "evals")  # packages; dags/ and plugins/ are walked as their own roots below
LAB = "lab"


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for pkg in packages:
        for f in (root / pkg).rglob("*.py"):
            parts = f.relative_to(root).with_suffix("").parts
            if "tasks" in parts or "band" in parts:  # eval task sources: code under test, not the product's own
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return found


def _imports(name: str, path: Path) -> set[str]:
    """Every module path an import in path names, absolute (relative imports resolved against name)."""
    out: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(product module -> the product modules it imports, product module -> the lab modules it imports)."""
    mods = _modules(REPO, PRODUCT)
    mods |= {f"dags.{f.stem}": f for f in (REPO / "dags").glob("*.py")}
    mods |= {".".join(f.relative_to(REPO / "plugins").with_suffix("").parts).removesuffix(".__init__"): f
             for f in (REPO / "plugins").rglob("*.py")}
    edges, lab = {}, {}
    for name, path in mods.items():
        named = _imports(name, path) | (_gate_modules() if name == "rl_core.pipeline" else set())
        edges[name] = {m for m in named if m in mods and m != name}
        lab[name] = {m for m in named if m == LAB or m.startswith(LAB + ".")}
    return edges, lab


def _gate_modules() -> set[str]:
    """The modules pipeline.GATES names as "module:function" strings (imported when a gate runs): edges too."""
    from rl_core.pipeline import GATES

    return {g.call.partition(":")[0] for g in GATES}


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path a -> ... -> a), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_walk_sees_the_product():
    edges, _ = _graph()
    assert {"rl_core.cli", "rl_core.pipeline", "evals.harness", "dags.realtime_rl", "rtrl_operators"} <= set(edges)
    assert any("rl_core.harvest" in v for v in edges.values())
    assert "rl_core.quality.gates" in edges["rl_core.pipeline"]  # a gate named by string is an edge too


def test_no_product_module_imports_the_lab():
    _, lab = _graph()
    offenders = {m: sorted(v) for m, v in lab.items() if v}
    assert offenders == {}


def test_no_import_cycle_among_the_product_modules():
    edges, _ = _graph()
    assert _cycle(edges) is None, " -> ".join(_cycle(edges) or [])


@pytest.mark.parametrize("edges", [
    {"a": {"b"}, "b": {"c"}, "c": {"a"}},  # a -> b -> c -> a
    {"x": {"x.y"}, "x.y": {"x"}},  # a package and its module, each importing the other
])
def test_the_cycle_finder_finds_a_cycle(edges):
    assert _cycle(edges) is not None


def test_the_walk_finds_a_lazy_lab_import(tmp_path):
    """The check can fail: a function-level import of the lab, the way the product's cycles were hidden."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("def f():\n    from lab.simulate import runner\n    from . import other\n")
    named = _imports("pkg.mod", tmp_path / "pkg" / "mod.py")
    assert "lab.simulate.runner" in named and "pkg.other" in named
