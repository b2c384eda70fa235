"""The tools an eval task offers the model, with JSON schemas, executed against the task's working copy.

read_file / write_file / apply_patch are plain file operations done by the harness on its own copy of
the repository (paths are checked to stay inside it); run_tests runs the visible tests of that copy
in the sandbox, because that is where model-written code executes. Every call returns a ToolResult:
the text the model sees next, and whether the call was well-formed and did what it asked.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals import sandbox

RUNNER_NAME = "_rtrl_runtests.py"
RUNNER_SOURCE = Path(__file__).with_name("_runtests.py").read_text()
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
        res = run_tests(self.snapshot(), [], self.limits)
        return ToolResult(res.summary, True, res.passed)


@dataclass
class TestRun:
    passed: bool
    n_passed: int
    n_failed: int
    status: str  # the sandbox status
    summary: str  # short text for the model / the report


def run_tests(files: dict[str, str], test_files: list[str], limits: sandbox.Limits) -> TestRun:
    """Run test files (default: discovered test_*.py) over `files` in the sandbox."""
    nonce = secrets.token_hex(16)
    res = sandbox.run({**files, RUNNER_NAME: RUNNER_SOURCE}, [RUNNER_NAME, nonce, *test_files], limits,
                      cwd_on_path=False)
    report: dict[str, Any] = {}
    for line in reversed(res.stdout.splitlines()):
        try:
            obj = json.loads(line) if line.startswith("{") else None
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("nonce") == nonce:  # a report printed by the model is ignored
            report = obj
            break
    n_pass, n_fail = int(report.get("passed", 0)), int(report.get("failed", 0))
    if res.status in ("timeout", "killed", "error"):
        summary = f"tests {res.status} after {res.duration_s:.1f}s"
    elif not report:
        summary = "tests crashed: " + res.stderr[-500:]
    else:
        lines = [f"{n_pass} passed, {n_fail} failed"]
        lines += [f"FAILED {f['test']}: {f['error']}"[:300] for f in report.get("failures", [])[:5]]
        summary = "\n".join(lines)
    return TestRun(res.status == "passed" and n_pass > 0 and n_fail == 0, n_pass, n_fail, res.status, summary)
