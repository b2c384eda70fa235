"""A/B verdict: is the challenger better than the champion on real logged outcomes? (cycle step 1)

`ab_verdict` reads the lake's raw interactions in [since, until) served by the current champion and
challenger versions (each on its own arm), joins their feedback (arriving up to grace_hours after the
window), and compares per arm with intervals clustered by user (rl_core.ab.stats):
  edit_persisted_rate (primary by default), dissatisfied_rate, latency_p50_ms, latency_p90_ms, reward.
The decision rule, in order:
  continue  while either arm has fewer than ab.min_samples_per_arm interactions (no early peeking);
  rollback  when any guardrail (ab.guardrails) or the primary metric is significantly worse;
  promote   when the primary metric is significantly better (so never with a significantly worse guardrail);
  continue  otherwise (keep collecting).
`apply_verdict` carries it out through rl_core.registry.promote (promote: champion <- challenger and the
challenger alias removed; rollback: challenger alias removed, the version tagged rolled_back).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Literal

import duckdb
import numpy as np
import pyarrow as pa
from pydantic import BaseModel

from rl_core import duck
from rl_core.ab import report, stats
from rl_core.config import Config
from rl_core.lake import Lake
from rl_core.registry import promote, store
from rl_core.rewards import followup
from rl_core.schema import FEEDBACK_SCHEMA, INTERACTIONS_SCHEMA, now_utc

# A follow-up message counts as dissatisfied by the same lexicon the rewards use (rl_core/rewards/followup.py):
# a strong cue, or a weak cue without a positive one; DuckDB and Arrow both use RE2.
DISSATISFIED_PARAMS = {"dis_strong": followup.STRONG, "dis_weak": followup.WEAK, "dis_positive": followup.POSITIVE}
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


def sql(name: str) -> str:
    return duck.load_sql(f"ab/{name}.sql")


def _utc(ts: datetime, field: str) -> datetime:
    if not isinstance(ts, datetime) or ts.tzinfo is None:
        raise ValueError(f"{field} must be a timezone-aware datetime, got {ts!r}")
    return ts.astimezone(timezone.utc)


def check_config(cfg: Config) -> None:
    """Fail early, naming the field, when the A/B config names a metric that does not exist."""
    if cfg.ab.primary not in METRICS:
        raise ValueError(f"[ab] primary = {cfg.ab.primary!r}: not one of {sorted(METRICS)}")
    for g in cfg.ab.guardrails:
        if g not in METRICS:
            raise ValueError(f"[ab] guardrails: {g!r} is not one of {sorted(METRICS)}")


def connect(lake: Lake, start: datetime, until: datetime, grace_hours: float) -> duckdb.DuckDBPyConnection:
    """DuckDB with views `interactions` [start, until) and `feedback` [start, until + grace) over the lake."""
    con = duck.connect(lake)
    duck.bind_files(con, lake, "interactions", lake.list_window("interactions", start, until), INTERACTIONS_SCHEMA)
    fb_end = until + timedelta(hours=grace_hours)
    duck.bind_files(con, lake, "feedback", lake.list_window("feedback", start, fb_end), FEEDBACK_SCHEMA)
    return con


def _metric(name: str, d: stats.Diff, method: str) -> MetricResult:
    sign = METRICS[name]
    good = d.lo > 0 if sign > 0 else d.hi < 0
    bad = d.hi < 0 if sign > 0 else d.lo > 0
    return MetricResult(
        name=name, higher_is_better=sign > 0, champion=d.champion, challenger=d.challenger, diff=d.diff,
        se=d.se, lo=d.lo, hi=d.hi, p_value=d.p_value, method=method, better=bool(good), worse=bool(bad),
    )


def decide(metrics: dict[str, MetricResult], n: dict[str, int], cfg: Config) -> tuple[Decision, list[str]]:
    """The decision rule (module docstring) on computed metrics; pure, so it is tested on its own."""
    low = [f"{arm} has {n.get(arm, 0)} interactions < min_samples_per_arm {cfg.ab.min_samples_per_arm}"
           for arm in ARMS if n.get(arm, 0) < cfg.ab.min_samples_per_arm]
    if low:
        return "continue", low
    bad = [g for g in cfg.ab.guardrails if g in metrics and metrics[g].worse]
    primary = metrics.get(cfg.ab.primary)
    if primary is not None and primary.worse and cfg.ab.primary not in bad:
        bad.append(cfg.ab.primary)
    if bad:
        return "rollback", [_describe(metrics[m], "significantly worse") for m in bad]
    if primary is not None and primary.better:
        return "promote", [_describe(primary, "significantly better")]
    detail = _describe(primary, "not significant") if primary else f"{cfg.ab.primary}: not computed"
    return "continue", [detail]


def _describe(m: MetricResult, what: str) -> str:
    return (f"{m.name} {what}: challenger {m.challenger:.4g} vs champion {m.champion:.4g}, "
            f"diff {m.diff:+.4g} [{m.lo:+.4g}, {m.hi:+.4g}], p={m.p_value:.3g} ({m.method})")


def _arm_arrays(table: pa.Table, arm: str, cols: list[str]) -> dict[str, np.ndarray]:
    mask = np.asarray(table["arm"].to_numpy(zero_copy_only=False)) == arm
    return {c: np.asarray(table[c].to_numpy(zero_copy_only=False))[mask] for c in cols}


def compute_metrics(con, cfg: Config, since: datetime, cuped: bool) -> tuple[dict[str, MetricResult], dict, dict]:
    """Per-arm counts and every metric's challenger - champion difference from the `outcomes` table."""
    alpha = cfg.ab.alpha
    users = con.sql(sql("per_user")).to_arrow_table()
    counts = {arm: 0 for arm in ARMS}
    nusers = {arm: 0 for arm in ARMS}
    arrays = {}
    for arm in ARMS:
        a = _arm_arrays(users, arm, ["user_id", "n", "persisted", "dissatisfied", "reward"])
        arrays[arm] = a
        counts[arm] = int(a["n"].sum())
        nusers[arm] = len(a["n"])
    if min(nusers.values()) < 2:
        return {}, counts, nusers
    pre = _pre_period(con, cfg, since) if cuped else None
    metrics: dict[str, MetricResult] = {}
    for name, col, pre_col in (
        ("edit_persisted_rate", "persisted", "persisted_pre"),
        ("dissatisfied_rate", "dissatisfied", "dissatisfied_pre"),
        ("reward", "reward", "persisted_pre"),
    ):
        xs = [None, None]
        if pre is not None:
            xs = [np.array([pre[pre_col].get(u, np.nan) for u in arrays[arm]["user_id"]]) for arm in ARMS]
        d = stats.ratio_diff_result(
            (arrays["champion"][col], arrays["champion"]["n"]),
            (arrays["challenger"][col], arrays["challenger"]["n"]),
            alpha, xs[0], xs[1],
        )
        metrics[name] = _metric(name, d, "clustered delta method" + (" + CUPED" if pre is not None else ""))
    la, lb = (con.sql(sql("latency"), params={"arm": arm}).to_arrow_table() for arm in ARMS)
    qs = stats.quantile_diffs(
        (la["latency_ms"].to_numpy(), la["user_key"].to_numpy()),
        (lb["latency_ms"].to_numpy(), lb["user_key"].to_numpy()), (0.5, 0.9),
        alpha, cfg.ab.bootstrap_iters, seed=0,
    )
    for q, name in ((0.5, "latency_p50_ms"), (0.9, "latency_p90_ms")):
        metrics[name] = _metric(name, qs[q], f"cluster bootstrap ({cfg.ab.bootstrap_iters})")
    return metrics, counts, nusers


def _pre_period(con, cfg: Config, since: datetime) -> dict[str, dict[str, float]]:
    pre_since = since - timedelta(hours=cfg.ab.cuped_pre_hours)
    params = {"pre_since": pre_since, "since": since, **DISSATISFIED_PARAMS}
    t = con.sql(sql("pre_period"), params=params).to_arrow_table()
    ids = t["user_id"].to_pylist()
    return {c: dict(zip(ids, t[c].to_pylist(), strict=True)) for c in ("persisted_pre", "dissatisfied_pre")}


def ab_verdict(
    cfg: Config,
    since: datetime,
    until: datetime | None = None,
    *,
    champion: int | None = None,
    challenger: int | None = None,
    cuped: bool | None = None,
    log: bool = True,
) -> ABResult:
    """The verdict for [since, until) (until defaults to now). Versions default to the current aliases.

    With log=True the report (JSON, markdown table, PNG chart) is written to the lake under
    ab/<since>_<until>/ and logged to MLflow (one run per window, reused on a rerun), unless neither arm had a
    request in the window: an empty analysis logs nothing (the `rtrl-ab` experiment would fill with n=0 runs).
    """
    check_config(cfg)
    since = _utc(since, "since")
    until = _utc(until, "until") if until is not None else now_utc()
    if until <= since:
        raise ValueError(f"until ({until.isoformat()}) must be after since ({since.isoformat()})")
    cuped = cfg.ab.cuped if cuped is None else cuped
    champion = champion if champion is not None else store.version_for_alias(cfg, "champion")
    challenger = challenger if challenger is not None else store.version_for_alias(cfg, "challenger")
    base = dict(since=since, until=until, champion_version=champion, challenger_version=challenger,
                alpha=cfg.ab.alpha, min_samples_per_arm=cfg.ab.min_samples_per_arm, cuped=cuped)
    if champion is None or challenger is None:
        missing = "champion" if champion is None else "challenger"
        return ABResult(decision="continue", reasons=[f"no {missing} alias: nothing to compare"],
                        n={}, users={}, **base)
    lake = Lake(cfg.lake_root)
    start = since - timedelta(hours=cfg.ab.cuped_pre_hours) if cuped else since
    con = connect(lake, start, until, cfg.harvest.grace_hours)
    try:
        con.execute(f"CREATE TEMP TABLE outcomes AS {sql('outcomes')}", _outcome_params(cfg, since, until,
                                                                                        champion, challenger))
        metrics, n, users = compute_metrics(con, cfg, since, cuped)
    finally:
        con.close()
    decision, reasons = decide(metrics, n, cfg)
    result = ABResult(decision=decision, reasons=reasons, n=n, users=users, metrics=metrics, **base)
    if log and any(result.n.values()):
        report.publish(cfg, result)
    return result


def _outcome_params(cfg: Config, since, until, champion: int, challenger: int) -> dict:
    w = cfg.rewards.weights
    return {
        "since": since, "until": until, "champion": int(champion), "challenger": int(challenger),
        **DISSATISFIED_PARAMS,
        "w_persisted": float(w.get("edit_persisted", 0.0)), "w_reverted": float(w.get("edit_reverted", 0.0)),
        "w_dissatisfied": float(w.get("dissatisfied_followup", 0.0)), "w_latency": float(w.get("latency", 0.0)),
        "w_thumbs": float(w.get("thumbs", 0.0)), "latency_budget_ms": float(cfg.rewards.latency_budget_ms),
    }


def apply_verdict(cfg: Config, result: ABResult) -> str:
    """Carry out the verdict; returns what was done: promote / rollback / continue, or stale.

    `stale` means the challenger alias no longer points at the analysed version (a newer deploy came in
    between): acting on an old analysis would judge the wrong model, so nothing moves.
    """
    if result.decision == "continue" or result.challenger_version is None:
        return "continue"
    current = store.version_for_alias(cfg, "challenger")
    if current != result.challenger_version:
        return "stale"
    reason = f"A/B {result.since:%Y-%m-%dT%H:%M}..{result.until:%Y-%m-%dT%H:%M}: " + "; ".join(result.reasons)
    if result.decision == "promote":
        promote.promote(cfg, reason, expected=result.challenger_version)
    else:
        promote.drop_challenger(cfg, reason, expected=result.challenger_version)
    return result.decision
