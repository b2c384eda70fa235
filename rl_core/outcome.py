"""A cycle's outcome in one line: what an operator reads first, in Airflow and in MLflow.

The DAG's last task (`outcome`, trigger rule all_done) hands this module its run's task states and the A/B
task's return value; the rest comes from what the stages left in the lake (the verdicts, the harvest manifest)
and in the registry (the version registered for the run, the `challenger` alias). The line is one of

    skipped: <why>                      (nothing to train on: the harvest manifest's reason)
    refused by <gate>: <first reason>   (a gate's verdict in the lake refused the run)
    failed at <task>                    (a task failed with no refusing verdict: a crash, a timeout)
    registered v<N> -> challenger       (or `registered v<N>, challenger not moved`)
    dry run: ...                        (everything computed, nothing registered)

followed by the A/B decision with its per-arm counts when the window had a live challenger, and by
`alias drift: ...` when an alias was moved outside rtrl (rl_core/registry/drift.py, checked here as by every
alias move): rtrl then refuses to move aliases, so the outcome is not ok and the run stays red until an operator
settles it (`rtrl registry --adopt` or `--revert`). A challenger that deploy did not move says why (the first
reason of the promotion verdict, e.g. the drift).

The same outcome goes to MLflow for every window, skipped and refused ones included: one run per cycle in the
experiment `<mlflow.experiment>-cycles`, named after the cycle's run id, with tags `outcome` (the kind),
`reason`, `window`, `airflow.run_id`, `run_id`, `alias_drift` and the line as the run's description; a rerun of
the window updates the same run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_core.config import Config
from rl_core.ids import mlflow_filter_value
from rl_core.lake import Lake
from rl_core.reports import Verdict, read_verdicts
from rl_core.stages import CYCLE

FAILED = ("failed", "upstream_failed")
# The verdict a task writes, where its name is not the task's (the others: the same name).
VERDICT_OF = {"gate_promotion": "promotion", "evaluate": "eval"}
STAGES = tuple(s for s in CYCLE if s != "outcome")


@dataclass(frozen=True)
class Outcome:
    kind: str  # skipped | refused | failed | registered | dry_run | done
    reason: str  # why, in one line (the kind's detail)
    line: str  # the whole one-line outcome, A/B decision included
    ab: str = ""  # the A/B part of the line ("" when there was no A/B)
    version: int | None = None
    drift: str = ""  # aliases moved outside rtrl, in words ("" when none)

    @property
    def ok(self) -> bool:
        """False when the run failed or was refused, or aliases drifted: its DAG run must end failed."""
        return self.kind not in ("refused", "failed") and not self.drift


def short_states(states: dict[str, Any]) -> dict[str, str]:
    """Task states by short task id (group prefix and map index dropped); a mapped task takes its worst
    instance's state (failed before upstream_failed before skipped before success)."""
    rank = {"failed": 0, "upstream_failed": 1, "skipped": 3, "success": 4}
    out: dict[str, str] = {}
    for tid, state in states.items():
        name = tid.rsplit(".", 1)[-1]
        if name not in STAGES:  # a mapped instance: "<task>_<map index>"
            base, _, index = name.rpartition("_")
            name = base if index.isdigit() and base in STAGES else name
        s = str(state.value if hasattr(state, "value") else state).lower() if state is not None else "none"
        if name not in out or rank.get(s, 2) < rank.get(out[name], 2):
            out[name] = s
    return out


def first_in(states: dict[str, str], wanted: tuple[str, ...]) -> str | None:
    """The first stage of the cycle (CYCLE order) whose state is one of wanted."""
    return next((s for s in STAGES if states.get(s) in wanted), None)


def skip_reason(cfg: Config, run_id: str) -> str | None:
    """Why the harvest skipped the window, from its manifest (rl_core.artifacts.HarvestResult.skip_reason);
    None without one, or with another release's that lacks a field."""
    try:
        harvested = Lake(cfg.lake_root).read_harvest(run_id)
    except ValueError:
        return None
    return harvested.skip_reason() if harvested else None


def ab_part(ab: dict | None) -> str:
    """`A/B <decision> (champion n=.., challenger n=..): <first reason>; <action>`, or "" when the window
    had no A/B verdict (the task did not run) or nothing to compare."""
    if not ab or not ab.get("decision"):
        return ""
    n = ab.get("n") or {}
    counts = ", ".join(f"{arm} n={int(n.get(arm, 0))}" for arm in ("champion", "challenger"))
    reasons = ab.get("reasons") or []
    text = f"A/B {ab['decision']} ({counts})"
    if reasons:
        text += f": {reasons[0]}"
    action = ab.get("action")
    if action and action != ab["decision"]:
        text += f"; action {action}"
    return text


def _refusal(task: str, verdicts: dict[str, Verdict]) -> str | None:
    verdict = verdicts.get(VERDICT_OF.get(task, task))
    if verdict is None or verdict.passed:
        return None
    return (verdict.reasons or ["(no reason given)"])[0]


def _finished(cfg: Config, run_id: str, states: dict[str, str], dry_run: bool) -> tuple[str, str, int | None]:
    """kind, reason and version of a run in which nothing failed."""
    skipped = first_in(states, ("skipped",))
    if skipped == "register" and dry_run:
        return "dry_run", "dry run: trained and evaluated, nothing registered", None
    if skipped is not None:
        reason = skip_reason(cfg, run_id) if skipped == "harvest" else None
        if reason is None and skipped == "register":  # EpisodesConsumed: another run registered them first
            reason = "register skipped: another run of the lineage registered these episodes while this one trained"
        return "skipped", reason or f"{skipped} skipped", None
    if states.get("deploy") != "success":
        return "done", "the cycle ended before deploy", None
    from rl_core.registry.register import find_version  # lazy: heavy (mlflow)
    from rl_core.registry.store import version_for_alias

    version = find_version(cfg, run_id)
    if version is None:
        return "done", "no version registered for the run", None
    if version_for_alias(cfg, "challenger") == version:
        return "registered", f"v{version} -> challenger", version
    refusal = _refusal("gate_promotion", read_verdicts(Lake(cfg.lake_root), run_id))  # deploy's own refusal
    return "registered", f"v{version}, challenger not moved" + (f": {refusal}" if refusal else ""), version


def settle(cfg: Config, run_id: str | None, states: dict[str, Any], ab: dict | None = None,
           dry_run: bool = False) -> Outcome:
    """The run's outcome from its task states (task id -> state, as Airflow gives them), the A/B task's return
    value, and what the stages left in the lake and the registry."""
    short = short_states(states)
    ab_text = ab_part(ab)
    failed = first_in(short, ("failed",)) or first_in(short, FAILED)
    if run_id is None:  # the window task failed: no window, no lake folder
        kind, reason, version = "failed", "window", None
    elif failed is not None:
        first = _refusal(failed, read_verdicts(Lake(cfg.lake_root), run_id))
        kind, reason, version = ("refused", f"{failed}: {first}", None) if first else ("failed", failed, None)
    else:
        kind, reason, version = _finished(cfg, run_id, short, dry_run)
    head = {"skipped": "skipped: ", "refused": "refused by ", "failed": "failed at ", "registered": "registered "}
    line = head.get(kind, "") + reason
    if ab_text:
        line += f" | {ab_text}"
    drift_text = drift_part(cfg)
    if drift_text:
        line += f" | {drift_text}"
    return Outcome(kind, reason, " ".join(line.split()), ab_text, version, drift_text)


def drift_part(cfg: Config) -> str:
    """`alias drift: <each drift>; settle ...`, or "" when MLflow's aliases are where rtrl last put them."""
    from rl_core.registry import drift  # lazy: heavy (mlflow)

    found = drift.check(cfg)
    if not found:
        return ""
    return ("alias drift: " + "; ".join(d.describe() for d in found)
            + " (rtrl moves no alias until `rtrl registry --adopt` or `--revert`)")


def record(cfg: Config, outcome: Outcome, run_id: str, window: str, airflow_run_id: str) -> str:
    """The outcome on the cycle's MLflow run (one per rtrl run id, found by its `run_id` tag and updated in
    place on a rerun); returns the MLflow run id. A failed or refused cycle's run ends FAILED."""
    from rl_core.registry.store import client, experiment_id  # lazy: heavy (mlflow)

    c, exp = client(cfg), experiment_id(cfg, "cycles")
    found = c.search_runs([exp], filter_string=f"tags.run_id = {mlflow_filter_value(run_id)}", max_results=1)
    mlflow_run = found[0].info.run_id if found else c.create_run(exp, run_name=run_id, tags={"run_id": run_id,
                                                                                             "kind": "cycle"}).info.run_id
    tags = {"outcome": outcome.kind, "reason": outcome.reason, "window": window, "airflow.run_id": airflow_run_id,
            "ab": outcome.ab, "version": "" if outcome.version is None else str(outcome.version),
            "alias_drift": outcome.drift, "mlflow.note.content": outcome.line}
    for key, value in tags.items():
        c.set_tag(mlflow_run, key, value)
    c.set_terminated(mlflow_run, status="FINISHED" if outcome.ok else "FAILED")
    return mlflow_run
