"""The tools an eval task offers the model, with JSON schemas, executed against the task's working copy.

read_file / write_file / apply_patch are plain file operations done by the harness on its own copy of
the repository (paths are checked to stay inside it); run_tests runs the visible tests of that copy
through the judge (evals/judge.py): their code in the sandbox, the verdict outside it. Every call returns a ToolResult:
the text the model sees next, and whether the call was well-formed and did what it asked.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals import sandbox
from evals.judge import TestRun, judge

MAX_FILE_CHARS = 20_000

SPECS: dict[str, dict[str, Any]] = {
    "read_file": {
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    "write_file": {
        "description": "Create or overwrite a file of the repository with the full new content.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]},
    },
    "apply_patch": {
        "description": "Edit a file: replace the exact text `find` (must occur once) with `replace`.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "find": {"type": "string"},
                                                         "replace": {"type": "string"}},
                       "required": ["path", "find", "replace"]},
    },
    "run_tests": {
        "description": "Run the repository's tests and report failures.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}


def openai_tools(names: list[str]) -> list[dict[str, Any]]:
    """OpenAI `tools` entries for the given tool names."""
    return [{"type": "function", "function": {"name": n, **SPECS[n]}} for n in names]


@dataclass
class ToolResult:
    content: str
    valid: bool  # the call named an offered tool with arguments matching its schema
    ok: bool  # ...and it succeeded (file found, patch applied, tests passed)


def _check_args(name: str, raw: str) -> dict[str, Any]:
    try:
        args = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not valid JSON: {exc}") from None
    if not isinstance(args, dict):
        raise ValueError("arguments must be a JSON object")
    schema = SPECS[name]["parameters"]
    for key in schema["required"]:
        if key not in args:
            raise ValueError(f"missing required argument {key!r}")
    for key, value in args.items():
        if key not in schema["properties"]:
            raise ValueError(f"unknown argument {key!r}")
        if not isinstance(value, str):
            raise ValueError(f"argument {key!r} must be a string")
    return args


class Workspace:
    """A task's working copy on disk (owned by the harness, never by model code)."""

    def __init__(self, root: Path, files: dict[str, str], allowed: list[str], limits: sandbox.Limits):
        self.root = root
        self.allowed = list(allowed)
        self.limits = limits
        for rel, text in files.items():
            p = self._path(rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)

    def _path(self, rel: str) -> Path:
        p = (self.root / rel).resolve()
        if not rel or not str(p).startswith(str(self.root.resolve()) + "/"):
            raise ValueError(f"path {rel!r} is outside the repository")
        return p

    def snapshot(self) -> dict[str, str]:
        return {str(p.relative_to(self.root)): p.read_text(errors="replace")
                for p in sorted(self.root.rglob("*")) if p.is_file()}

    def execute(self, name: str, raw_args: str) -> ToolResult:
        if name not in self.allowed:
            return ToolResult(f"error: unknown tool {name!r}; available: {', '.join(self.allowed)}", False, False)
        try:
            args = _check_args(name, raw_args)
            return getattr(self, f"_{name}")(**args)
        except ValueError as exc:
            return ToolResult(f"error: {exc}", False, False)

    def _read_file(self, path: str) -> ToolResult:
        p = self._path(path)
        if not p.is_file():
            return ToolResult(f"error: no such file {path}", True, False)
        return ToolResult(p.read_text(errors="replace")[:MAX_FILE_CHARS], True, True)

    def _write_file(self, path: str, content: str) -> ToolResult:
        p = self._path(path)
        if len(content) > MAX_FILE_CHARS:
            return ToolResult(f"error: content over {MAX_FILE_CHARS} characters", True, False)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        return ToolResult(f"wrote {path} ({len(content)} chars)", True, True)

    def _apply_patch(self, path: str, find: str, replace: str) -> ToolResult:
        p = self._path(path)
        if not p.is_file():
            return ToolResult(f"error: no such file {path}", True, False)
        text = p.read_text()
        n = text.count(find) if find else 0
        if n != 1:
            return ToolResult(f"error: `find` occurs {n} times in {path}; it must occur exactly once", True, False)
        p.write_text(text.replace(find, replace, 1))
        return ToolResult(f"patched {path}", True, True)

    def _run_tests(self) -> ToolResult:
        res = run_tests(self.snapshot(), self.limits)
        return ToolResult(res.summary, True, res.passed)


def visible_tests(files: dict[str, str]) -> dict[str, str]:
    """The judge's test file that runs a work dir's own tests (test_*.py, tests/test_*.py) in the sandbox.

    The visible tests are the model's to edit, so their code runs with the rest of its code, never in the
    judge: the judge imports each test module there and calls each of its top-level test functions
    (names read from the source's syntax tree, nothing executed here), and a test passes only when its call
    returned. A test file that does not parse or import fails as a whole.
    """
    lines, tests = ["import importlib", ""], []
    for rel in sorted(files):
        p = Path(rel)
        if not (p.name.startswith("test_") and p.suffix == ".py" and len(p.parts) <= 2):
            continue
        module = ".".join(p.with_suffix("").parts)
        if not all(part.isidentifier() for part in p.with_suffix("").parts):
            continue
        try:
            names = [n.name for n in ast.parse(files[rel]).body
                     if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        except (SyntaxError, ValueError):
            names = []
        for name in names or ["import"]:
            test = f"test_{module.replace('.', '__')}__{name}"
            call = "" if name == "import" else f".{name}()"
            tests.append(f"def {test}():\n    importlib.import_module({module!r}){call}\n")
    return {"test_visible.py": "\n".join(lines + tests)} if tests else {}


def run_tests(files: dict[str, str], limits: sandbox.Limits) -> TestRun:
    """Run the work dir's visible tests (judged from outside, their code confined with the rest)."""
    tests = visible_tests(files)
    if not tests:
        return TestRun(False, 0, 0, "failed", "no tests found (test_*.py)")
    return judge(files, tests, limits)
