"""The simulator's own task bank (lab/simulate/tasks/*.jsonl), in the eval suite's task format.

Why a separate bank: if users asked the eval suite's tasks, training on their feedback would leak the
test set into the policy. The format is evals.tasks.Task; simulator-only facts ride in its `tags`:
`easy`/`hard`, `answer=<what the user says when asked a clarifying question>`, `org=<org_id>` for a task
only that organisation asks.

Another bank (a protocol's `bank`, e.g. the band tasks of bench/band/ or evals/band/, in the same format with a
`target` file) needs none of these tags: a task without `answer=` has the answer every simulator task of one
file gives ("it is in <target>, just make it work"), and a `moderate` task counts as hard.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evals.tasks import Task, load_tasks

BANK_DIR = Path(__file__).with_name("tasks")


@dataclass(frozen=True)
class SimTask:
    task: Task
    hard: bool
    answer: str  # the user's answer to a clarifying question
    org: str | None  # only this org asks it (None: everyone)

    @property
    def id(self) -> str:
        return self.task.id

    @property
    def target(self) -> str:
        """The file the request is about: the task's `target` when it names one (the band tasks), else the first
        non-test file of the snapshot (the simulator's own tasks)."""
        return self.task.target or next(p for p in self.task.files if not Path(p).name.startswith("test_"))


def _tag(task: Task, key: str) -> str | None:
    return next((t[len(key) + 1:] for t in task.tags if t.startswith(key + "=")), None)


def load_bank(folder: str | Path | None = None) -> list[SimTask]:
    """The simulator's own bank (folder None: every task must carry its `answer=` tag), or the bank in folder
    (a missing answer derived from the task's target, module docstring)."""
    out = []
    for t in load_tasks(folder or BANK_DIR):
        answer = _tag(t, "answer")
        if not answer and folder is None:
            raise ValueError(f"simulator task {t.id}: tags lack 'answer=...' (the reply to a clarifying question)")
        if not answer:
            sim = SimTask(t, False, "", None)
            answer = f"it is in {sim.target}, just make it work"
        out.append(SimTask(t, "hard" in t.tags or "moderate" in t.tags, answer, _tag(t, "org")))
    return out


def tasks_for(bank: list[SimTask], org_id: str) -> list[SimTask]:
    """The tasks a user of org_id may ask: the shared ones plus the org's own."""
    return [t for t in bank if t.org in (None, org_id)]


def select(bank: list[SimTask], ids: list[str]) -> list[SimTask]:
    """The tasks named by `simulate.tasks` (all when empty); an unknown id is an error that names it."""
    if not ids:
        return bank
    known = {t.id for t in bank}
    unknown = sorted(set(ids) - known)
    if unknown:
        raise ValueError(f"simulate.tasks: unknown task id(s) {unknown}; the bank has {len(known)} tasks "
                         f"(lab/simulate/tasks/)")
    return [t for t in bank if t.id in set(ids)]
