"""How rtrl's runs are laid out in the MLflow UI, so an operator finds the numbers that decide without digging.

Why: MLflow 3's UI sorts metric names (plain code-unit order), shows only attribute columns in a fresh runs
table, lists common artifacts in its compare view only for files at a run's root, and opens an experiment in
its GenAI mode (the traces page) unless told otherwise. So:

- The deciding numbers of every run are logged a second time under `_decide/` (`_` sorts before every
  lower-case letter), beside their source metrics (`reward/*`, `train/*`, `eval/*`,
  `monitor/*`, `ab/*`, which keep one name each): the first rows of the compare view and, through a shared view
  (below), the runs table's columns.
- Each experiment is created as a classic ML experiment (tag `mlflow.experimentKind` =
  `custom_model_development`) and carries a shared view (tag `mlflow.sharedViewState.decide`: the runs table's
  columns) that the printed links open: `runs_url` adds `viewStateShareKey=decide` and
  `workflowType=machine_learning` (MLflow 3.17's UI takes the GenAI/ML mode from that URL parameter, else from
  the browser's last choice, GenAI by default; the experiment tag alone does not switch it).
- Every run of a kind has the same files at its root (COMMON_FILES), so "compare" shows them side by side.
"""

from __future__ import annotations

import json

DECIDE = "_decide/"
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
SHARE_KEY = "decide"
SHARED_VIEW_TAG = f"mlflow.sharedViewState.{SHARE_KEY}"

# The deciding numbers of a checkpoint's run (rl_core/registry/card.py), numbered by the stage that produced them
# (1 rewards, 2 training, 3 eval, 4 monitors, 5 A/B): MLflow sorts metric names in its compare view and in the runs
# table's columns alike, so the number keeps that order in both.
VERSION_DECIDE = (
    "1_reward_mean", "1_reward_n", "2_kl_mean", "2_kl_max",
    "3_eval_pass_rate", "3_eval_delta", "3_eval_delta_lo", "3_eval_delta_hi", "3_eval_mde",
    "4_monitor_broken_tool_rate", "4_monitor_clarify_rate", "4_monitor_empty_refusal_rate", "4_monitor_no_edit_rate",
    "5_ab_n_champion", "5_ab_n_challenger", "5_ab_primary_diff", "5_ab_primary_p", "5_ab_reward_diff",
    "5_ab_reward_p",
)
# The deciding numbers of an A/B analysis's run (rl_core/ab/report.py).
AB_DECIDE = ("n_champion", "n_challenger", "primary_diff", "primary_lo", "primary_hi", "primary_p",
             "reward_diff", "reward_p")
# Files at the root of every run of a kind (beside the folders with the full reports).
COMMON_FILES = {
    "train": ("card.md", "reward_hist.png", "eval_deltas.png", "eval_report.md", "verdicts.json"),
    "ab": ("report.md", "chart.png"),
}
# The runs table's columns per experiment purpose (rl_core/registry/store.PURPOSES), after the run name.
COLUMNS = {
    "train": [f"metrics.`{DECIDE}{m}`" for m in VERSION_DECIDE] + ["tags.`parent_version`", "tags.`promotion`"],
    "ab": ["tags.`decision`"] + [f"metrics.`{DECIDE}{m}`" for m in AB_DECIDE] + ["tags.`challenger_version`"],
    "cycles": ["tags.`outcome`", "tags.`version`", "tags.`ab`", "attributes.`Description`"],
    "learning": [],
}


def decide_key(name: str) -> str:
    return DECIDE + name


def shared_view(purpose: str) -> str | None:
    """The runs-table state the experiment's shared view holds (JSON, as the UI reads it), None for no columns."""
    columns = COLUMNS.get(purpose) or []
    if not columns:
        return None
    return json.dumps({"selectedColumns": columns, "orderByKey": "attributes.start_time", "orderByAsc": False})


def experiment_tags(purpose: str) -> dict[str, str]:
    """The tags every rtrl experiment of this purpose carries (set at creation, added to older ones)."""
    tags = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
    if (view := shared_view(purpose)) is not None:
        tags[SHARED_VIEW_TAG] = view
    return tags


def runs_url(base: str, experiment_id: str, purpose: str = "train") -> str:
    """The experiment's runs table in ML mode, with the deciding columns (the shared view) when it has one."""
    query = "workflowType=machine_learning"
    if shared_view(purpose) is not None:
        query += f"&viewStateShareKey={SHARE_KEY}"
    return f"{base}/#/experiments/{experiment_id}/runs?{query}"
