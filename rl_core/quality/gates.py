"""Data-quality gates between the stages of a cycle: raw window, episodes, rewards.

Each gate checks the files' schema against the contract, builds a small per-row DataFrame with DuckDB
(sql/quality/*.sql: ids, counts, derived flags; never the token lists themselves), validates it with a
Great Expectations suite, saves the GX result JSON to runs/<run_id>/quality/<gate>.json, writes its
verdict, and raises GateFailed listing every failing expectation with counts and examples. Training on
bad data is worse than not training, so a failing gate stops the cycle; nothing downstream runs. gate_raw
quarantines one org whose rows alone break row-level checks instead of refusing every org (its docstring says
when, and why a whole org).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from rl_core.config import Config
from rl_core.duck import bind_files, connect, load_sql
from rl_core.harvest import episodes_path, utc
from rl_core.lake import Lake
from rl_core.quality.gx import Check, Outcome, unexpected, validate
from rl_core.registry import store
from rl_core.reports import GateFailed, Verdict, write_verdict
from rl_core.rewards.score import rewards_path
from rl_core.schema import (
    ARMS,
    EPISODES_SCHEMA,
    FEEDBACK_KINDS,
    FEEDBACK_SCHEMA,
    INTERACTIONS_SCHEMA,
    REWARDS_SCHEMA,
    SIGNALS,
)


def schema_problems(lake: Lake, paths: list[str], contract: pa.Schema) -> list[str]:
    """Every contract column must exist in every file with the contract's type."""
    problems = []
    for p in paths:
        with lake.fs.open(p, "rb") as f:
            schema = pq.read_schema(f)
        for fld in contract:
            if fld.name not in schema.names:
                problems.append(f"schema: {p} lacks column {fld.name!r} ({fld.type})")
            elif not schema.field(fld.name).type.equals(fld.type):
                problems.append(f"schema: {p} column {fld.name!r} is {schema.field(fld.name).type}, "
                                f"contract says {fld.type}")
    return problems


def _ids(name: str) -> list[Check]:
    return [Check("ExpectColumnValuesToNotBeNull", {"column": name}, f"{name} present"),
            Check("ExpectColumnValuesToBeUnique", {"column": name}, f"{name} unique (no duplicated events)")]


def _logprob_checks() -> list[Check]:
    return [
        Check("ExpectColumnValuesToBeBetween", {"column": "n_bad_logprobs", "min_value": 0, "max_value": 0},
              "completion logprobs all finite and <= 0"),
        Check("ExpectColumnPairValuesToBeEqual", {"column_A": "n_logprobs", "column_B": "n_completion_tokens"},
              "one logprob per completion token"),
    ]


def _finish(lake: Lake, run_id: str, name: str, outcomes: list[Outcome], problems: list[str],
            details: dict) -> Verdict:
    reasons = problems + [f for o in outcomes for f in o.failures]
    lake.write_json(lake.run(run_id).quality(name),
                    {"gate": name, "success": not reasons, "schema_problems": problems,
                     "quarantined": details.get("quarantined", {}), "validations": [o.result for o in outcomes]})
    verdict = Verdict(name=name, passed=not reasons, reasons=reasons, details=details)
    write_verdict(lake, run_id, verdict)
    if reasons:
        raise GateFailed(verdict)
    return verdict


def _read_run_file(cfg: Config, lake: Lake, sql_name: str, path: str, **params):
    """One of sql/quality/'s queries over one of the run's files, as a DataFrame."""
    con = connect(lake, memory_limit=cfg.harvest.duckdb_memory_limit)
    try:
        return con.sql(load_sql(sql_name), params={"path": lake.url(path), **params}).df()
    finally:
        con.close()


def known_versions(cfg: Config) -> list[int]:
    """Every version of the registered model (a version outside this list was logged wrongly)."""
    return store.known_versions(cfg)


def gate_raw(cfg: Config, start: datetime, end: datetime, run_id: str,
             known: list[int] | None = None) -> Verdict:
    """Raw interactions in [start, end) and feedback up to end + grace (verdict "gate_raw"); only the org's rows
    when the run is an org adapter's (its harvest manifest names the org).

    One org's bad rows do not refuse every org's window. A row-level check (a non-finite logprob, an unknown
    version, ...) that only one org's rows break is that org's fault: its rows are all it can write (the org comes
    from the bearer token), and the gateway now refuses such values, so they got in by a corruption or a broken
    logging stack of that org. That org is quarantined for this window: named with counts, reasons and example
    ids in the verdict's details["quarantined"], and the rest of the window judged as usual; the next stage
    (rl_core/exclude.py) drops its episodes before anything downstream reads them (a gate only judges). A whole org rather than its bad rows, because a stack that logged some rows wrong cannot be trusted
    for the rest, and no threshold is left to tune. The gate still fails on window-level defects (schema, no
    interactions, duplicated ids: the collector's), when the same row-level defect shows in two or more orgs'
    rows (then the fault is the house's: the engine, the WAL, compaction), and when no other org's rows are
    left (an org adapter's run, or a window of one org).
    """
    start, end = utc(start, "start"), utc(end, "end")
    if end <= start:
        raise ValueError(f"end ({end.isoformat()}) must be after start ({start.isoformat()})")
    lake = Lake(cfg.lake_root)
    lake.run(run_id)  # a plain name
    grace_end = end + timedelta(hours=cfg.harvest.grace_hours)
    known = sorted(known) if known is not None else known_versions(cfg)
    ifiles = lake.list_window("interactions", start, end)
    ffiles = lake.list_window("feedback", start, grace_end)
    problems = schema_problems(lake, ifiles, INTERACTIONS_SCHEMA) + schema_problems(lake, ffiles, FEEDBACK_SCHEMA)
    details = {"start": start.isoformat(), "end": end.isoformat(), "known_versions": known,
               "interaction_files": len(ifiles), "feedback_files": len(ffiles)}
    if problems:
        return _finish(lake, run_id, "gate_raw", [], problems, details)
    idf, fdf = _raw_frames(cfg, lake, run_id, ifiles, ffiles, (start, end, grace_end))
    details |= {"interactions": len(idf), "feedback": len(fdf)}
    irows, frows = _raw_interaction_rows(known), _raw_feedback_rows()
    quarantined = quarantine(idf, irows, fdf, frows)
    if quarantined:
        idf, fdf = idf[~idf["org_id"].isin(quarantined)], fdf[~fdf["org_id"].isin(quarantined)]
        details["quarantined"] = quarantined
    icheck = _ids("event_id") + [Check("ExpectTableRowCountToBeBetween", {"min_value": 1},
                                       "the window has interactions")] + irows
    outcomes = [validate(idf, icheck, "raw_interactions"),
                validate(fdf, _ids("feedback_id") + frows, "raw_feedback", "feedback_id")]
    return _finish(lake, run_id, "gate_raw", outcomes, [], details)


def _raw_frames(cfg: Config, lake: Lake, run_id: str, ifiles: list[str], ffiles: list[str], bounds: tuple):
    """sql/quality/raw_*.sql over the window's files: (interactions, feedback) DataFrames of per-row facts."""
    start, end, grace_end = bounds
    con = connect(lake, memory_limit=cfg.harvest.duckdb_memory_limit)
    try:
        bind_files(con, lake, "interactions", ifiles, INTERACTIONS_SCHEMA)
        bind_files(con, lake, "feedback", ffiles, FEEDBACK_SCHEMA)
        harvested = lake.read_harvest(run_id)
        org = harvested.org_id if harvested else None  # an org adapter's run judges its org's rows
        idf = con.sql(load_sql("quality/raw_interactions.sql"),
                      params={"start": start, "end": end, "org_id": org}).df()
        fdf = con.sql(load_sql("quality/raw_feedback.sql"),
                      params={"start": start, "grace_end": grace_end, "org_id": org}).df()
    finally:
        con.close()
    return idf, fdf


def _raw_interaction_rows(known: list[int]) -> list[Check]:
    """The raw interactions' row-level checks: each judges one row alone, so a bad row has an org."""
    return [
        *[Check("ExpectColumnValuesToNotBeNull", {"column": c}, f"{c} present")
          for c in ("org_id", "user_id", "session_id", "model_version", "arm")],
        *_logprob_checks(),
        Check("ExpectColumnValuesToBeInSet", {"column": "model_version", "value_set": known},
              "model_version is a registered version"),
        Check("ExpectColumnValuesToBeInSet", {"column": "arm", "value_set": list(ARMS)}, "arm is known"),
        Check("ExpectColumnValuesToBeInSet", {"column": "latency_invalid", "value_set": [False]},
              "latency_ms finite and >= 0"),
        Check("ExpectColumnValuesToBeInSet", {"column": "ts_ordered", "value_set": [True]},
              "ts_response not before ts_request"),
    ]


def _raw_feedback_rows() -> list[Check]:
    return [
        Check("ExpectColumnValuesToNotBeNull", {"column": "event_id"}, "feedback names its interaction"),
        Check("ExpectColumnValuesToBeInSet", {"column": "kind", "value_set": list(FEEDBACK_KINDS)},
              "feedback kind is known"),
        Check("ExpectColumnValuesToBeInSet", {"column": "value_invalid", "value_set": [False]},
              "feedback value_float finite"),
    ]


def _bad(df, checks: list[Check]):
    out = df["org_id"].isna() & False
    for c in checks:
        out |= unexpected(df, c)
    return out


def quarantine(idf, irows: list[Check], fdf, frows: list[Check]) -> dict[str, dict]:
    """{org: report} when exactly one org's rows (interactions or feedback) break row-level checks and another
    org has interactions in the window; else {} and the gate judges the whole window (gate_raw says why)."""
    bad_i, bad_f = _bad(idf, irows), _bad(fdf, frows)
    orgs = {*idf.loc[bad_i, "org_id"], *fdf.loc[bad_f, "org_id"]}
    if len(orgs) != 1:
        return {}
    (org,) = orgs
    if not isinstance(org, str) or not (idf["org_id"] != org).any():  # a null org is no one's; no one else is left
        return {}
    mine_i, mine_f = idf[idf["org_id"] == org], fdf[fdf["org_id"] == org]
    reasons = _org_reasons(mine_i, irows, "event_id") + _org_reasons(mine_f, frows, "feedback_id")
    return {org: {"interactions": int(bad_i.sum()), "of": len(mine_i), "feedback": int(bad_f.sum()),
                  "feedback_of": len(mine_f), "reasons": reasons}}


def _org_reasons(df, checks: list[Check], id_column: str) -> list[str]:
    """One line per check the org's rows break: count, and up to three example ids."""
    out = []
    for c in checks:
        m = unexpected(df, c)
        if m.any():
            ids = ", ".join(str(x) for x in df.loc[m, id_column].head(3))
            out.append(f"{c.why}: {int(m.sum())} of {len(df)} rows ({id_column} {ids})")
    return out


def gate_episodes(cfg: Config, run_id: str) -> Verdict:
    """runs/<run_id>/episodes.parquet (verdict "gate_episodes")."""
    lake = Lake(cfg.lake_root)
    path = episodes_path(lake, run_id)
    if not lake.exists(path):
        raise FileNotFoundError(f"run {run_id!r} has no {path}: run `rtrl harvest` first")
    harvested = lake.read_harvest(run_id)
    org, policy = (harvested.org_id, harvested.policy_version) if harvested else (None, None)
    problems = schema_problems(lake, [lake.path(path)], EPISODES_SCHEMA)
    details = {"policy_version": policy}
    if problems:
        return _finish(lake, run_id, "gate_episodes", [], problems, details)
    df = _read_run_file(cfg, lake, "quality/episodes.sql", path)
    g = cfg.gates
    details |= {"episodes": len(df), "feedback_share": float(df["has_feedback"].mean()) if len(df) else 0.0}
    checks = _ids("event_id") + [
        Check("ExpectTableRowCountToBeBetween", {"min_value": g.min_episodes}, "enough episodes for an update"),
        *[Check("ExpectColumnValuesToNotBeNull", {"column": c}, f"{c} present")
          for c in ("org_id", "user_id", "session_id", "model_version")],
        *_logprob_checks(),
        Check("ExpectColumnValuesToBeBetween", {"column": "n_completion_tokens", "min_value": 1},
              "every episode has completion tokens"),
        Check("ExpectColumnValuesToBeBetween",
              {"column": "version_lag", "min_value": 0, "max_value": cfg.harvest.max_staleness},
              "version lag within max_staleness"),
        Check("ExpectColumnValuesToBeBetween", {"column": "credit_weight", "min_value": 0, "max_value": 1},
              "credit weight in [0, 1]"),
        Check("ExpectColumnMeanToBeBetween", {"column": "has_feedback", "min_value": g.min_feedback_share},
              "share of episodes with feedback"),
    ]
    if org:  # an org adapter's run: one org by construction, and only that org
        checks.append(Check("ExpectColumnValuesToBeInSet", {"column": "org_id", "value_set": [org]},
                            "only the adapter's own organisation"))
    else:  # the shared policy must not be dominated by one org
        checks.append(Check("ExpectColumnMaxToBeBetween", {"column": "org_share", "max_value": g.max_org_share},
                            "no single org above max_org_share"))
    if policy is not None:
        checks.append(Check("ExpectColumnValuesToBeInSet", {"column": "policy_version", "value_set": [policy]},
                            "model_version + version_lag is the harvested policy version"))
    return _finish(lake, run_id, "gate_episodes", [validate(df, checks, "episodes")], [], details)


def gate_rewards(cfg: Config, run_id: str) -> Verdict:
    """runs/<run_id>/rewards.parquet against its episodes and the current reward config ("gate_rewards")."""
    lake = Lake(cfg.lake_root)
    path, eps = rewards_path(lake, run_id), episodes_path(lake, run_id)
    for p in (eps, path):
        if not lake.exists(p):
            raise FileNotFoundError(f"run {run_id!r} has no {p}: run harvest and rewards first")
    problems = schema_problems(lake, [lake.path(path)], REWARDS_SCHEMA)
    n_episodes = pq.ParquetFile(lake.fs.open(lake.path(eps), "rb")).metadata.num_rows
    details = {"episodes": n_episodes, "reward_config_hash": cfg.rewards.config_hash()}
    if problems:
        return _finish(lake, run_id, "gate_rewards", [], problems, details)
    df = _read_run_file(cfg, lake, "quality/rewards.sql", path)
    g = cfg.gates
    details |= {"rewards": len(df), "mean_reward": float(df["reward"].mean()) if len(df) else None}
    checks = _ids("event_id") + [
        Check("ExpectTableRowCountToEqual", {"value": n_episodes}, "one reward per episode"),
        Check("ExpectColumnValuesToNotBeNull", {"column": "reward"}, "reward present and not NaN"),
        Check("ExpectColumnValuesToBeInSet", {"column": "reward_not_finite", "value_set": [False]}, "reward finite"),
        Check("ExpectColumnValuesToBeBetween", {"column": "reward", "min_value": g.reward_min,
                                                 "max_value": g.reward_max}, "reward within gate bounds"),
        Check("ExpectColumnValuesToBeInSet", {"column": "broken_not_negative", "value_set": [False]},
              "broken tool calls have negative reward"),
        Check("ExpectColumnValuesToBeInSet",
              {"column": "reward_config_hash", "value_set": [cfg.rewards.config_hash()]},
              "rewards computed with the current [rewards] config"),
        *[Check("ExpectColumnValuesToNotBeNull", {"column": s}, f"signal {s} present") for s in SIGNALS],
    ]
    return _finish(lake, run_id, "gate_rewards", [validate(df, checks, "rewards")], [], details)
