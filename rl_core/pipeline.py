"""The cycle's checks, defined once: every path that trains or deploys a model runs these, by these names.

Why one table: the cycle was assembled in four places (the DAG, the gate operator's table, the org branch, the
simulator's scenario) and they drifted: an org adapter was trained and went live without the data-quality
gates or the reward-hacking monitors that the main cycle requires. Now the gate operator's checks, the
verdicts the promotion gate requires, the verdicts an org adapter requires, and the gates the org path runs
are all read from here, so a path cannot skip one without a visible edit to this file; each DAG checks its
own tasks when it is parsed (check_dag: realtime_rl against CYCLE, realtime_rl_orgs against ORG_CYCLE).

A gate is `fn(cfg, *args) -> Verdict` (or raises GateFailed carrying one); it judges and writes its verdict
under the run, nothing else. The stages between gates (harvest, exclude, score, train, evaluate, register, deploy, outcome) stay
where each is defined (rl_core/<stage>), and the DAG's task order follows CYCLE.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rl_core.config import Config
from rl_core.reports import GateFailed, Verdict
from rl_core.stages import ADAPTER_VERDICTS, BEFORE_TRAIN, CYCLE, ORG_CYCLE, REQUIRED_VERDICTS  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class Gate:
    name: str  # the verdict's name and the DAG task's id
    call: str  # "package.module:function", called as fn(cfg, *args)
    args: tuple[str, ...]  # argument names, taken from the run's values (run_id, start, end, parent_version)


GATES: tuple[Gate, ...] = (
    Gate("monitors", "rl_core.rewards.monitors:monitor_served", ("run_id", "parent_version")),
    Gate("gate_raw", "rl_core.quality.gates:gate_raw", ("start", "end", "run_id")),
    Gate("gate_episodes", "rl_core.quality.gates:gate_episodes", ("run_id",)),
    Gate("gate_rewards", "rl_core.quality.gates:gate_rewards", ("run_id",)),
    Gate("gate_promotion", "rl_core.registry.gate:decide", ("run_id",)),
)
BY_NAME = {g.name: g for g in GATES}

def check_dag(dag: Any, chains: tuple[tuple[str, ...], ...] = (CYCLE,), name: str = "CYCLE") -> None:
    """The DAG's tasks (group prefixes dropped) are those of chains, each downstream of the one before it in its
    chain: realtime_rl calls this with CYCLE when it is parsed, realtime_rl_orgs with ORG_CYCLE, so a DAG that
    drifts from the one definition fails to import."""
    tasks = {t.task_id.rsplit(".", 1)[-1]: t for t in dag.tasks}
    if len(tasks) != len(dag.tasks) or set(tasks) != {n for chain in chains for n in chain}:
        raise ValueError(f"DAG {dag.dag_id} has tasks {sorted(t.task_id for t in dag.tasks)}, not pipeline.{name} "
                         + " | ".join(" -> ".join(chain) for chain in chains))
    for chain in chains:
        for before, after in zip(chain, chain[1:], strict=False):
            if tasks[before].task_id not in tasks[after].get_flat_relative_ids(upstream=True):
                raise ValueError(f"DAG {dag.dag_id}: {tasks[after].task_id} must run after {tasks[before].task_id} "
                                 f"(pipeline.{name})")


def callable_of(path: str):
    """'package.module:function' -> the function (imported when called, never when a DAG is parsed)."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"callable path {path!r} must look like 'package.module:function'")
    return getattr(importlib.import_module(module), name)


def judge(cfg: Config, name: str, values: dict[str, Any]) -> Verdict:
    """Run one gate on the run's values; a refusal comes back as its Verdict (not raised)."""
    gate = BY_NAME[name]
    missing = [a for a in gate.args if a not in values]
    if missing:
        raise ValueError(f"gate {name}: missing value(s) {missing}; got {sorted(values)}")
    try:
        return callable_of(gate.call)(cfg, *(values[a] for a in gate.args))
    except GateFailed as exc:
        return exc.verdict


def run_gates(cfg: Config, names: tuple[str, ...], values: dict[str, Any]) -> list[Verdict]:
    """The gates in order; raises GateFailed with the first refusal (the ones after it do not run)."""
    out = []
    for name in names:
        verdict = judge(cfg, name, values)
        if not verdict.passed:
            raise GateFailed(verdict)
        out.append(verdict)
    return out
