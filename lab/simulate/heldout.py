"""Held-out requests: what the measured cycle serves is what no update has seen (other tasks, or other users).

Why: a policy measured on the requests it was trained on is measured in-sample. With the seeded users of the
shared protocols every cycle opens with the same first requests, and the org replay measured each adapter on
its own training cycle's requests. A protocol that names a task bank and a split (`heldout`, a share of the
bank) serves the training part in the cycles that train, and the held-out part only in the measured last
cycle; `new_users` makes the measured cycle's users ones the update never saw. The optional `baseline` cycle
serves the measured cycle's requests to v1 before anything trains (no DAG runs on its window, so nothing
trains on it), so the paired test compares the same users on the same kind of requests, v1 against the update.

The split is deterministic and seeded: within each stratum (an org's own tasks and the shared ones, by task
kind) tasks are ordered by a hash of (seed, task id) and the first round(share x n) are held out, at least one
and at most n - 1 of a stratum of two or more. A stratum of one task is trained on. So every kind is in both
parts in about the registered share, and the same seed and bank give the same split whatever the file order.

The measured requests can be more than the trained ones (`measure_users`, `measure_interactions`): the baseline
and the measured cycle then serve that many users (the trained cycle's users first, the same seeded sequence, then
users the update never saw) and that many interactions, while the trained cycle keeps its registered size (so a
frozen training stays exactly as it was and only the measurement gains power).

How a plan reaches the simulated users: run_experiment (experiment.py) enters `planned(plan)` around each
cycle; runner.simulate reads `current()`: the bank to ask, the users, their raters, and a list that collects
each request's record (users.request_record). No plan: the config's bank and users, exact raters, as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from lab.simulate.bank import SimTask, load_bank, select
from lab.simulate.personas import Org, User, make_users
from rl_core.config import REPO_ROOT


@dataclass(frozen=True)
class Split:
    train: list[SimTask]
    heldout: list[SimTask]

    @property
    def heldout_ids(self) -> list[str]:
        return [t.id for t in self.heldout]

    @property
    def train_ids(self) -> list[str]:
        return [t.id for t in self.train]


def _rank(seed: int, task_id: str) -> str:
    return hashlib.sha256(f"heldout/{seed}/{task_id}".encode()).hexdigest()


def split_bank(bank: list[SimTask], share: float, seed: int) -> Split:
    """The bank's tasks in a training and a held-out part: stratified by (org, kind), seeded (module docstring).
    share 0: nothing held out."""
    if not 0 <= share < 1:
        raise ValueError(f"heldout share must be in [0, 1), got {share!r}")
    strata: dict[tuple[str, str], list[SimTask]] = {}
    for t in bank:
        strata.setdefault((t.org or "", t.task.kind), []).append(t)
    held: set[str] = set()
    for tasks in strata.values():
        if share <= 0 or len(tasks) < 2:
            continue
        k = min(max(round(share * len(tasks)), 1), len(tasks) - 1)
        held |= {t.id for t in sorted(tasks, key=lambda t: _rank(seed, t.id))[:k]}
    return Split([t for t in bank if t.id not in held], [t for t in bank if t.id in held])


def resolve_bank(folder: str) -> Path:
    """A protocol's bank folder: `{repo}` is this checkout; a relative path is under it too."""
    p = Path(folder.replace("{repo}", str(REPO_ROOT)))
    return p if p.is_absolute() else REPO_ROOT / p


def load_named_bank(folder: str, task_ids: list[str]) -> list[SimTask]:
    """The protocol's bank ("" : the simulator's own), narrowed to simulate.tasks when that names any."""
    return select(load_bank(resolve_bank(folder) if folder else None), task_ids)


def new_users(n: int, orgs: list[Org], seed: int) -> list[User]:
    """n users no earlier cycle had: the next n of the same seeded sequence (other ids, seeds and personas
    drawn the same way), so the first n users, the ones every earlier cycle served, stay exactly as they were."""
    return make_users(2 * n, orgs, seed)[n:]


@dataclass
class CyclePlan:
    """What one cycle's simulated users do. bank None: the config's; users "new": new_users(), else the
    config's; rate_share/flip: their raters (raters.py); heldout: the task ids recorded as held out;
    role: "train", "measured" or "baseline" (a measuring cycle of v1 that trains nothing);
    n_users / interactions: this cycle's users and interaction budget (None: the config's, the experiment's);
    records: every request's record, filled by the simulator."""

    role: str = "train"
    bank: list[SimTask] | None = None
    users: str = "same"  # "same" | "new"
    rate_share: float = 1.0
    flip: float = 0.0
    heldout: frozenset[str] = frozenset()
    run_dag: bool | None = None  # None: the experiment decides (measure_last); False: traffic only
    n_users: int | None = None
    interactions: int | None = None
    records: list[dict] = field(default_factory=list)


_PLAN: ContextVar[CyclePlan | None] = ContextVar("rtrl_cycle_plan", default=None)


@contextmanager
def planned(plan: CyclePlan | None) -> Iterator[CyclePlan | None]:
    """The plan the simulator follows while the block runs (in this thread and the calls it makes)."""
    token = _PLAN.set(plan)
    try:
        yield plan
    finally:
        _PLAN.reset(token)


def current() -> CyclePlan | None:
    return _PLAN.get()


@dataclass(frozen=True)
class Design:
    """A protocol's held-out design, as the plans need it (protocol_model.Protocol's fields)."""

    bank: str = ""
    heldout: float = 0.0
    new_users: bool = False
    baseline: bool = False
    rate_share: float = 1.0
    flip: float = 0.0
    split_seed: int | None = None
    measure_users: int | None = None  # the baseline and measured cycles' users (None: the trained cycles')
    measure_interactions: int | None = None  # and their interactions (None: the trained cycles')


def plans(design: Design, cycles: int, measure_last: bool, seed: int, task_ids: list[str]) -> tuple[list[CyclePlan], dict]:
    """One plan per cycle the experiment runs (the baseline cycle first when there is one), and what the summary
    records of the design (the bank, the split, which tasks were held out)."""
    custom = bool(design.bank) or design.heldout > 0
    bank = load_named_bank(design.bank, task_ids) if custom else None
    split = split_bank(bank, design.heldout, seed if design.split_seed is None else design.split_seed) if bank else None
    held = split.heldout if split and split.heldout else bank
    train = split.train if split and split.heldout else bank
    rater = {"rate_share": design.rate_share, "flip": design.flip}
    last_users = "new" if design.new_users else "same"
    held_ids = frozenset(split.heldout_ids) if split else frozenset()
    size = {"n_users": design.measure_users, "interactions": design.measure_interactions}
    out = [CyclePlan("baseline", held, last_users, heldout=held_ids, run_dag=False, **rater, **size)
           ] if design.baseline else []
    for k in range(1, cycles + 1):
        last = k == cycles
        measured = last and measure_last
        out.append(CyclePlan("measured" if measured else "train", held if last else train,
                             last_users if last else "same", heldout=held_ids if last else frozenset(), **rater,
                             **(size if measured else {})))
    record = {"bank": design.bank or "lab/simulate/tasks", "heldout_share": design.heldout,
              "split_seed": seed if design.split_seed is None else design.split_seed,
              "train_tasks": split.train_ids if split else None, "heldout_tasks": split.heldout_ids if split else None,
              "new_users": design.new_users, "baseline": design.baseline, **rater,
              **({"measure_users": design.measure_users} if design.measure_users else {}),
              **({"measure_interactions": design.measure_interactions} if design.measure_interactions else {})}
    return out, record


def users_of(plan: CyclePlan | None, n: int, orgs: list[Org], seed: int) -> list[User]:
    """The users a cycle serves: the config's n seeded users (plan.n_users of them when the plan says), or n new
    ones (plan.users == "new")."""
    n = plan.n_users if plan is not None and plan.n_users else n
    if plan is not None and plan.users == "new":
        return new_users(n, orgs, seed)
    return make_users(n, orgs, seed)
