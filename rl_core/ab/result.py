"""What an A/B analysis produces: the metrics and their directions, each metric's comparison, the result.

Kept apart from the analysis (verdict.py, org.py) and the report (report.py), which all read these types, and
free of rtrl imports, so the config can check `[ab]` metric names against METRICS when it loads.

Non-inferiority (`[ab] guardrail_margins`): a guardrail with a margin is shown non-inferior when the bound of its
(1 - alpha) interval on the bad side stays within the margin: hi < margin for a lower-is-better metric, lo > -margin
for a higher-is-better one (the margin in the metric's own units). The interval is two-sided, so this is a
one-sided test at alpha / 2. No interval (a metric not computed, NaN bounds) is not shown non-inferior.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel

# metric -> +1 when higher is better, -1 when lower is better
METRICS = {
    "edit_persisted_rate": +1,
    "dissatisfied_rate": -1,
    "latency_p50_ms": -1,
    "latency_p90_ms": -1,
    "reward": +1,
}
ARMS = ("champion", "challenger")
Decision = Literal["promote", "rollback", "continue"]


def noninferior(lo: float, hi: float, higher_is_better: bool, margin: float) -> bool:
    """The interval's bad-side bound within the margin (module docstring); NaN bounds: False."""
    bound = lo if higher_is_better else hi
    if not math.isfinite(bound):
        return False
    return bound > -margin if higher_is_better else bound < margin


def check_margins(margins: dict[str, float], guardrails: list[str]) -> dict[str, float]:
    """`[ab] guardrail_margins` as the config loads it: margins >= 0 (finite) of guardrails; else ValueError."""
    for metric, margin in margins.items():
        if metric not in METRICS:
            raise ValueError(f"{metric!r} is not an A/B metric; known: {', '.join(sorted(METRICS))}")
        if not 0 <= margin < math.inf:  # NaN fails too
            raise ValueError(f"{metric} = {margin!r}: a margin must be a finite number >= 0 (in the metric's units)")
        if metric not in guardrails:  # its margin would be ignored
            raise ValueError(f"{metric!r} is not in [ab] guardrails {guardrails}: add it there or drop its margin")
    return margins


def bad_bound(lo: float, hi: float, higher_is_better: bool) -> float:
    """The bound of the interval on the metric's bad side (the one a margin limits)."""
    return lo if higher_is_better else hi


class MetricResult(BaseModel):
    name: str
    higher_is_better: bool
    champion: float
    challenger: float
    diff: float  # challenger - champion
    se: float
    lo: float
    hi: float
    p_value: float
    method: str
    better: bool  # the interval excludes 0 on the good side
    worse: bool  # the interval excludes 0 on the bad side
    margin: float | None = None  # [ab] guardrail_margins: the non-inferiority margin, in the metric's units
    noninferior: bool | None = None  # the bad-side bound within the margin; None without a margin


class ABResult(BaseModel):
    decision: Decision
    reasons: list[str]
    since: datetime
    until: datetime
    champion_version: int | None
    challenger_version: int | None
    n: dict[str, int]
    users: dict[str, int]
    metrics: dict[str, MetricResult] = {}
    alpha: float
    min_samples_per_arm: int
    cuped: bool = False
    report_path: str = ""
    mlflow_run_id: str = ""


class OrgABResult(ABResult):
    """One org's live LoRA adapter against its base version, on that org's traffic only (rl_core/ab/org.py).

    Both arms are answered by the base version (champion_version = challenger_version = base_version): the arm
    "champion" without an adapter, the arm "challenger" by the adapter. Never applied by verdict.apply_verdict (it
    moves the policy's aliases); org.apply_org_verdict applies it to the org's `live` alias.
    """

    org_id: str
    base_version: int | None = None
    adapter_version: str | None = None  # the adapter's serving name (interactions.adapter_version)
    adapter_model_version: int | None = None  # its version of the registered model rtrl-adapter-<org>
