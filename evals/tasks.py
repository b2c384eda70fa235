"""The task format shared by the eval suite and the traffic simulator, and its loader.

A task bank is a folder of *.jsonl files, one task per line (see evals/README.md for every field).
A task is what a user would hand a coding assistant: a terse request, a small repository snapshot,
the tools the assistant may call, and hidden tests that decide whether the result is right. The
optional reference `solution` (files to write) lets us prove every task is solvable and drive the
scripted "oracle" policy; it is never shown to the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

KINDS = ("bugfix", "feature", "refactor", "write_test", "ambiguous")
TOOL_NAMES = ("read_file", "write_file", "apply_patch", "run_tests")


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Literal["bugfix", "feature", "refactor", "write_test", "ambiguous"]
    prompt: str = Field(min_length=1)
    files: dict[str, str] = Field(min_length=1)  # the repository snapshot: relative path -> text
    hidden_tests: dict[str, str] = Field(min_length=1)  # run after the episode, never shown to the model
    tools: list[str] = list(TOOL_NAMES)
    solution: dict[str, str] = {}  # reference: files whose writing solves the task
    tags: list[str] = []
    # the file an answer's code block is applied to when the answer calls no tool (the IDE's "apply", as a user
    # pastes it over the file the request is about); empty: code blocks are not applied
    target: str = ""

    @model_validator(mode="after")
    def _target_in_repo(self) -> Task:
        if self.target and self.target not in self.files:
            raise ValueError(f"target {self.target!r} is not one of the task's files {sorted(self.files)}")
        return self

    @field_validator("files", "hidden_tests", "solution")
    @classmethod
    def _relative_paths(cls, v: dict[str, str]) -> dict[str, str]:
        for p in v:
            if p.startswith("/") or ".." in Path(p).parts or not p.endswith((".py", ".txt", ".md", ".json", ".cfg")):
                raise ValueError(f"path {p!r} must be relative, inside the repo, and a text file")
        return v

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - set(TOOL_NAMES))
        if unknown:
            raise ValueError(f"unknown tools {unknown}; known: {list(TOOL_NAMES)}")
        return v

    @property
    def visible_tests(self) -> list[str]:
        return sorted(p for p in self.files if Path(p).name.startswith("test_") and p.endswith(".py"))


class TaskError(ValueError):
    """A task file is malformed; the message names the file, the line and the field."""


def load_tasks(folder: str | Path, kinds: list[str] | None = None, limit: int = 0) -> list[Task]:
    """Every task in folder/*.jsonl, in a stable order (file name, then line); ids must be unique.

    `limit` > 0 keeps a deterministic, kind-balanced subset (round-robin over kinds), so a small eval
    still covers every kind.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskError(f"task folder {folder} does not exist")
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for path in sorted(folder.glob("*.jsonl")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("//"):
                continue
            where = f"{path}:{lineno}"
            try:
                task = Task.model_validate(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TaskError(f"{where}: not valid JSON: {exc}") from None
            except ValidationError as exc:
                fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                raise TaskError(f"{where}: {fields}") from None
            if task.id in seen:
                raise TaskError(f"{where}: duplicate task id {task.id!r} (first in {seen[task.id]})")
            seen[task.id] = where
            tasks.append(task)
    if not tasks:
        raise TaskError(f"no tasks in {folder}/*.jsonl")
    if kinds:
        tasks = [t for t in tasks if t.kind in kinds]
    if limit and limit < len(tasks):
        by_kind: dict[str, list[Task]] = {}
        for t in tasks:
            by_kind.setdefault(t.kind, []).append(t)
        picked: list[Task] = []
        while len(picked) < limit:
            for k in sorted(by_kind):
                if by_kind[k] and len(picked) < limit:
                    picked.append(by_kind[k].pop(0))
        tasks = picked
    return tasks
