"""Per-org A/B: an org's live LoRA adapter against its base version, judged on that org's traffic only.

Who is in which arm: the gateway answers a share of an org's users (`[orgs] ab_share`, stable per user:
rl_core/orgs/serving.in_adapter_arm) with the org's live adapter on its base version, and the others with the base
version alone; each turn is logged with interactions.adapter_version (the adapter's name, or null). So:
  champion    the org's turns answered by the base version without an adapter
  challenger  the org's turns answered by the adapter under judgement
(sql/ab/org_arms.sql: pinned requests, other versions and other adapters of the org are left out). The metrics,
the user-clustered intervals and the decision rule, guardrail margins included, are the policy A/B's
(rl_core/ab/verdict.py: analyse, decide).

Tenancy: the analysis's DuckDB connection holds only the org's rows. The window's files are bound as `lake_*`
views, the org's rows (only the columns the analysis reads) are copied into the tables `interactions` and
`feedback` (sql/ab/org_interactions.sql, org_feedback.sql), and the lake views are dropped before any other query
runs, so no later query (arms, outcomes, CUPED's pre-period) can read another org's rows.

The report is the policy A/B's, under ab/orgs/<org>/<since>_<until>/ in the lake and in its own MLflow run of the
A/B experiment, `ab-<org>-<since>-<until>` with the tag `org` (rl_core/ab/report.py). Applying it
(apply_org_verdict) goes through rl_core/orgs/registry.py: rollback removes the org's `live` alias (through
rl_core.registry.promote, the one module that moves aliases), promote keeps it live and records the decision; a
verdict on an adapter that is no longer live is `stale` and changes nothing. This module only judges.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import duckdb

from rl_core.ab import report, verdict
from rl_core.ab.result import OrgABResult
from rl_core.config import Config
from rl_core.ids import check_org_id
from rl_core.lake import Lake

if TYPE_CHECKING:
    from rl_core.orgs.registry import AdapterVersion

LAKE_PREFIX = "lake_"


def connect_org(lake: Lake, start: datetime, until: datetime, grace_hours: float,
                org_id: str) -> duckdb.DuckDBPyConnection:
    """DuckDB whose tables `interactions` [start, until) and `feedback` [start, until + grace) hold only org_id's
    rows; the views over the lake's files they were copied from are gone."""
    con = verdict.connect(lake, start, until, grace_hours, prefix=LAKE_PREFIX)
    try:
        for table in ("interactions", "feedback"):
            con.execute(f"CREATE TEMP TABLE {table} AS {verdict.sql(f'org_{table}')}", {"org": org_id})
            con.execute(f"DROP VIEW IF EXISTS {LAKE_PREFIX}{table}")
    except BaseException:
        con.close()
        raise
    return con


def org_ab_verdict(
    cfg: Config,
    org_id: str,
    since: datetime,
    until: datetime | None = None,
    *,
    adapter: AdapterVersion | None = None,
    cuped: bool | None = None,
    log: bool = True,
) -> OrgABResult:
    """The verdict on org_id's adapter (default: its `live` one) for [since, until) (until defaults to now).

    With log=True the report goes to the lake and to MLflow like the policy A/B's, unless neither arm had a
    request in the window. An org without a live adapter gets `continue` (nothing to compare).
    """
    verdict.check_config(cfg)
    check_org_id(org_id, "org")
    since, until = verdict.window(since, until)
    cuped = cfg.ab.cuped if cuped is None else cuped
    if adapter is None:
        from rl_core.orgs.registry import live_adapter  # lazy: heavy (the org pipeline's imports)

        adapter = live_adapter(cfg, org_id)
    fields = dict(org_id=org_id, since=since, until=until, alpha=cfg.ab.alpha,
                  min_samples_per_arm=cfg.ab.min_samples_per_arm, cuped=cuped)
    if adapter is None:
        return OrgABResult(decision="continue", reasons=[f"{org_id} has no live adapter: nothing to compare"],
                           champion_version=None, challenger_version=None, n={}, users={}, **fields)
    if adapter.org_id != org_id:
        raise ValueError(f"adapter {adapter.adapter_version} belongs to {adapter.org_id}, not {org_id}")
    base_version = int(adapter.base_version)
    fields |= dict(champion_version=base_version, challenger_version=base_version, base_version=base_version,
                   adapter_version=adapter.adapter_version, adapter_model_version=int(adapter.version))
    start = since - timedelta(hours=cfg.ab.cuped_pre_hours) if cuped else since
    con = connect_org(Lake(cfg.lake_root), start, until, cfg.harvest.grace_hours, org_id)
    try:
        params = {"since": since, "until": until, "org": org_id, "base": base_version,
                  "adapter": adapter.adapter_version}
        metrics, n, users = verdict.analyse(con, cfg, verdict.sql("org_arms"), params, since, cuped)
    finally:
        con.close()
    decision, reasons = verdict.decide(metrics, n, cfg)
    result = OrgABResult(decision=decision, reasons=reasons, n=n, users=users, metrics=metrics, **fields)
    if log and any(result.n.values()):
        report.publish(cfg, result)
    return result


def apply_org_verdict(cfg: Config, result: OrgABResult) -> str:
    """Carry out an org's verdict; returns what was done: promote (kept live, recorded) / rollback (its `live`
    alias removed) / continue, or stale (the org's live adapter is no longer the one analysed: nothing moves)."""
    from rl_core.orgs import registry as orgs  # lazy: heavy (the org pipeline's imports)

    if not isinstance(result, OrgABResult):
        raise TypeError("apply_org_verdict takes an org's A/B (OrgABResult); the policy's is apply_verdict's")
    if result.decision == "continue" or result.adapter_version is None:
        return "continue"
    live = orgs.live_adapter(cfg, result.org_id)
    if live is None or live.adapter_version != result.adapter_version:
        return "stale"
    reason = (f"org A/B {result.since:%Y-%m-%dT%H:%M}..{result.until:%Y-%m-%dT%H:%M} of {result.org_id}: "
              + "; ".join(result.reasons))
    if result.decision == "promote":
        orgs.keep_live(cfg, result.org_id, live.version, reason)
    elif orgs.withdraw_live(cfg, result.org_id, result.adapter_version, reason) is None:
        return "stale"  # the alias moved between the two reads
    return result.decision
