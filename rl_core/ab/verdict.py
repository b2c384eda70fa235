"""A/B verdict: is the challenger better than the champion on real logged outcomes? (cycle step 1)

`ab_verdict` reads the lake's raw interactions in [since, until) served by the current champion and
challenger versions (each on its own arm: sql/ab/arms.sql), joins their feedback (arriving up to grace_hours after
the window: sql/ab/outcomes.sql), and compares per arm with intervals clustered by user (rl_core.ab.stats):
  edit_persisted_rate (primary by default), dissatisfied_rate, latency_p50_ms, latency_p90_ms, reward.
The decision rule (`decide`), in order:
  continue  while either arm has fewer than ab.min_samples_per_arm interactions (no early peeking);
  rollback  when any guardrail (ab.guardrails) or the primary metric is significantly worse;
  promote   when the primary metric is significantly better and every guardrail with a margin
            (ab.guardrail_margins) is shown non-inferior (rl_core/ab/result.py: its interval's bad-side bound
            within the margin), so never with a significantly worse guardrail;
  continue  when the primary is significantly better but such a guardrail is not shown non-inferior (the reason
            names it, its bound and its margin), or the primary is not significant (keep collecting).
Without margins (the default) promote needs only the primary, as before margins existed.
`apply_verdict` carries it out through rl_core.registry.promote (promote: champion <- challenger and the
challenger alias removed; rollback: challenger alias removed, the version tagged rolled_back). The same analysis
judges an org's adapter against its base version on the org's traffic (rl_core/ab/org.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import duckdb
import numpy as np
import pyarrow as pa

from rl_core import duck
from rl_core.ab import report, stats
from rl_core.ab.result import (  # noqa: F401 - re-exported: the A/B's types have always been imported from here
    ARMS,
    METRICS,
    ABResult,
    Decision,
    MetricResult,
    OrgABResult,
    bad_bound,
    check_margins,
    noninferior,
)
from rl_core.config import Config
from rl_core.lake import Lake
from rl_core.registry import promote, store
from rl_core.rewards import followup
from rl_core.schema import FEEDBACK_SCHEMA, INTERACTIONS_SCHEMA, now_utc

# A follow-up message counts as dissatisfied by the same lexicon the rewards use (rl_core/rewards/followup.py):
# a strong cue, or a weak cue without a positive one; DuckDB and Arrow both use RE2.
DISSATISFIED_PARAMS = {"dis_strong": followup.STRONG, "dis_weak": followup.WEAK, "dis_positive": followup.POSITIVE}


def sql(name: str) -> str:
    return duck.load_sql(f"ab/{name}.sql")


def _utc(ts: datetime, field: str) -> datetime:
    if not isinstance(ts, datetime) or ts.tzinfo is None:
        raise ValueError(f"{field} must be a timezone-aware datetime, got {ts!r}")
    return ts.astimezone(timezone.utc)


def window(since: datetime, until: datetime | None) -> tuple[datetime, datetime]:
    """[since, until) in UTC (until defaults to now); refused unless both are aware and until > since."""
    since = _utc(since, "since")
    until = _utc(until, "until") if until is not None else now_utc()
    if until <= since:
        raise ValueError(f"until ({until.isoformat()}) must be after since ({since.isoformat()})")
    return since, until


def check_config(cfg: Config) -> None:
    """Fail early, naming the field, when the A/B config names a metric that does not exist."""
    if cfg.ab.primary not in METRICS:
        raise ValueError(f"[ab] primary = {cfg.ab.primary!r}: not one of {sorted(METRICS)}")
    for g in cfg.ab.guardrails:
        if g not in METRICS:
            raise ValueError(f"[ab] guardrails: {g!r} is not one of {sorted(METRICS)}")
    try:  # checked when the config loads too; again here for guardrails changed since
        check_margins(cfg.ab.guardrail_margins, cfg.ab.guardrails)
    except ValueError as exc:
        raise ValueError(f"[ab] guardrail_margins: {exc}") from None


def connect(lake: Lake, start: datetime, until: datetime, grace_hours: float,
            prefix: str = "") -> duckdb.DuckDBPyConnection:
    """DuckDB with views `<prefix>interactions` [start, until) and `<prefix>feedback` [start, until + grace)."""
    con = duck.connect(lake)
    duck.bind_files(con, lake, f"{prefix}interactions", lake.list_window("interactions", start, until),
                    INTERACTIONS_SCHEMA)
    fb_end = until + timedelta(hours=grace_hours)
    duck.bind_files(con, lake, f"{prefix}feedback", lake.list_window("feedback", start, fb_end), FEEDBACK_SCHEMA)
    return con


def _metric(name: str, d: stats.Diff, method: str, margin: float | None = None) -> MetricResult:
    sign = METRICS[name]
    good = d.lo > 0 if sign > 0 else d.hi < 0
    bad = d.hi < 0 if sign > 0 else d.lo > 0
    ni = None if margin is None else noninferior(d.lo, d.hi, sign > 0, margin)
    return MetricResult(
        name=name, higher_is_better=sign > 0, champion=d.champion, challenger=d.challenger, diff=d.diff,
        se=d.se, lo=d.lo, hi=d.hi, p_value=d.p_value, method=method, better=bool(good), worse=bool(bad),
        margin=margin, noninferior=ni,
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
    if primary is None or not primary.better:
        detail = _describe(primary, "not significant") if primary else f"{cfg.ab.primary}: not computed"
        return "continue", [detail]
    margins = {g: cfg.ab.guardrail_margins[g] for g in cfg.ab.guardrails if g in cfg.ab.guardrail_margins}
    shown = {g: g in metrics and noninferior(metrics[g].lo, metrics[g].hi, METRICS[g] > 0, margin)
             for g, margin in margins.items()}
    checks = [_describe_noninferior(g, metrics.get(g), margins[g], ok, cfg.ab.alpha) for g, ok in shown.items()]
    if not all(shown.values()):  # better on the primary, but a guardrail could still be worse by its margin
        return "continue", [c for g, c in zip(shown, checks, strict=True) if not shown[g]] + [
            _describe(primary, "significantly better")]
    return "promote", [_describe(primary, "significantly better"), *checks]


def _describe(m: MetricResult, what: str) -> str:
    return (f"{m.name} {what}: challenger {m.challenger:.4g} vs champion {m.champion:.4g}, "
            f"diff {m.diff:+.4g} [{m.lo:+.4g}, {m.hi:+.4g}], p={m.p_value:.3g} ({m.method})")


def _describe_noninferior(name: str, m: MetricResult | None, margin: float, shown: bool, alpha: float) -> str:
    """`<guardrail> non-inferior` or `not shown non-inferior`, with the bound that decides and the margin."""
    if m is None:
        return f"{name} not shown non-inferior: not computed (margin {margin:g})"
    up = METRICS[name] > 0
    side, limit, op = ("lower", -margin, ">") if up else ("upper", margin, "<")
    bound = bad_bound(m.lo, m.hi, up)
    pct = round((1 - alpha) * 100)
    what = "non-inferior" if shown else "not shown non-inferior"
    return (f"{name} {what}: {side} bound {bound:+.4g} of the {pct}% CI vs margin {margin:g} (needs {op} {limit:+.4g}); "
            f"diff {m.diff:+.4g} [{m.lo:+.4g}, {m.hi:+.4g}]")


def _arm_arrays(table: pa.Table, arm: str, cols: list[str]) -> dict[str, np.ndarray]:
    mask = np.asarray(table["arm"].to_numpy(zero_copy_only=False)) == arm
    return {c: np.asarray(table[c].to_numpy(zero_copy_only=False))[mask] for c in cols}


def compute_metrics(con, cfg: Config, since: datetime, cuped: bool) -> tuple[dict[str, MetricResult], dict, dict]:
    """Per-arm counts and every metric's challenger - champion difference from the `outcomes` table."""
    alpha, margins = cfg.ab.alpha, cfg.ab.guardrail_margins
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
        method = "clustered delta method" + (" + CUPED" if pre is not None else "")
        metrics[name] = _metric(name, d, method, margins.get(name))
    la, lb = (con.sql(sql("latency"), params={"arm": arm}).to_arrow_table() for arm in ARMS)
    qs = stats.quantile_diffs(
        (la["latency_ms"].to_numpy(), la["user_key"].to_numpy()),
        (lb["latency_ms"].to_numpy(), lb["user_key"].to_numpy()), (0.5, 0.9),
        alpha, cfg.ab.bootstrap_iters, seed=0,
    )
    for q, name in ((0.5, "latency_p50_ms"), (0.9, "latency_p90_ms")):
        metrics[name] = _metric(name, qs[q], f"cluster bootstrap ({cfg.ab.bootstrap_iters})", margins.get(name))
    return metrics, counts, nusers


def _pre_period(con, cfg: Config, since: datetime) -> dict[str, dict[str, float]]:
    pre_since = since - timedelta(hours=cfg.ab.cuped_pre_hours)
    params = {"pre_since": pre_since, "since": since, **DISSATISFIED_PARAMS}
    t = con.sql(sql("pre_period"), params=params).to_arrow_table()
    ids = t["user_id"].to_pylist()
    return {c: dict(zip(ids, t[c].to_pylist(), strict=True)) for c in ("persisted_pre", "dissatisfied_pre")}


def analyse(con, cfg: Config, arms: str, arms_params: dict, since: datetime, cuped: bool
            ) -> tuple[dict[str, MetricResult], dict, dict]:
    """Metrics, counts and users per arm: `arms` (a SELECT over the connection's `interactions`: event_id,
    user_id, arm, latency_ms, one row per interaction) becomes the temp table `arms`, outcomes.sql joins its
    feedback and compute_metrics compares the arms."""
    con.execute(f"CREATE TEMP TABLE arms AS {arms}", arms_params)
    con.execute(f"CREATE TEMP TABLE outcomes AS {sql('outcomes')}", outcome_params(cfg))
    return compute_metrics(con, cfg, since, cuped)


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
    since, until = window(since, until)
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
        arms_params = {"since": since, "until": until, "champion": int(champion), "challenger": int(challenger)}
        metrics, n, users = analyse(con, cfg, sql("arms"), arms_params, since, cuped)
    finally:
        con.close()
    decision, reasons = decide(metrics, n, cfg)
    result = ABResult(decision=decision, reasons=reasons, n=n, users=users, metrics=metrics, **base)
    if log and any(result.n.values()):
        report.publish(cfg, result)
    return result


def outcome_params(cfg: Config) -> dict:
    """outcomes.sql's parameters: the follow-up lexicon and the reward weights (config [rewards])."""
    w = cfg.rewards.weights
    return {
        **DISSATISFIED_PARAMS,
        "w_persisted": float(w.get("edit_persisted", 0.0)), "w_reverted": float(w.get("edit_reverted", 0.0)),
        "w_dissatisfied": float(w.get("dissatisfied_followup", 0.0)), "w_latency": float(w.get("latency", 0.0)),
        "w_thumbs": float(w.get("thumbs", 0.0)), "latency_budget_ms": float(cfg.rewards.latency_budget_ms),
    }


def apply_verdict(cfg: Config, result: ABResult) -> str:
    """Carry out the verdict; returns what was done: promote / rollback / continue, or stale.

    `stale` means the challenger alias no longer points at the analysed version (a newer deploy came in
    between): acting on an old analysis would judge the wrong model, so nothing moves. An org's A/B
    (OrgABResult) is refused: it judges an adapter, applied by rl_core.ab.org.apply_org_verdict.
    """
    if isinstance(result, OrgABResult):
        raise ValueError(f"an A/B of {result.org_id}'s adapter moves no policy alias: use apply_org_verdict")
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
