"""Data-quality gates between the stages of a cycle: raw window, episodes, rewards.

Each gate checks the files' schema against the contract, builds a small per-row DataFrame with DuckDB
(sql/quality/*.sql: ids, counts, derived flags; never the token lists themselves), validates it with a
Great Expectations suite, saves the GX result JSON to runs/<run_id>/quality/<gate>.json, writes its
verdict, and raises GateFailed listing every failing expectation with counts and examples. Training on
bad data is worse than not training, so a failing gate stops the cycle; nothing downstream runs.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from rl_core.config import Config
from rl_core.duck import bind_files, connect, load_sql
from rl_core.harvest import episodes_path, read_manifest, utc
from rl_core.lake import Lake
from rl_core.quality.gx import Check, Outcome, validate
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
                     "validations": [o.result for o in outcomes]})
    verdict = Verdict(name=name, passed=not reasons, reasons=reasons, details=details)
    write_verdict(lake, run_id, verdict)
    if reasons:
        raise GateFailed(verdict)
    return verdict


def _read_run_file(cfg: Config, lake: Lake, sql_name: str, path: str):
    """One of sql/quality/'s queries over one of the run's files, as a DataFrame."""
    con = connect(lake, memory_limit=cfg.harvest.duckdb_memory_limit)
    try:
        return con.sql(load_sql(sql_name), params={"path": lake.url(path)}).df()
    finally:
        con.close()


def known_versions(cfg: Config) -> list[int]:
    """Every version of the registered model (a version outside this list was logged wrongly)."""
    return store.known_versions(cfg)


def gate_raw(cfg: Config, start: datetime, end: datetime, run_id: str,
             known: list[int] | None = None) -> Verdict:
    """Raw interactions in [start, end) and feedback up to end + grace (verdict "gate_raw"); only the org's rows
    when the run is an org adapter's (its harvest manifest names the org)."""
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
    con = connect(lake, memory_limit=cfg.harvest.duckdb_memory_limit)
    try:
        bind_files(con, lake, "interactions", ifiles, INTERACTIONS_SCHEMA)
        bind_files(con, lake, "feedback", ffiles, FEEDBACK_SCHEMA)
        org = (read_manifest(lake, run_id) or {}).get("org_id")  # an org adapter's run judges its org's rows
        idf = con.sql(load_sql("quality/raw_interactions.sql"), params={"start": start, "end": end, "org_id": org}).df()
        fdf = con.sql(load_sql("quality/raw_feedback.sql"),
                      params={"start": start, "grace_end": grace_end, "org_id": org}).df()
    finally:
        con.close()
    details |= {"interactions": len(idf), "feedback": len(fdf)}
    icheck = _ids("event_id") + [
        Check("ExpectTableRowCountToBeBetween", {"min_value": 1}, "the window has interactions"),
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
    fcheck = _ids("feedback_id") + [
        Check("ExpectColumnValuesToNotBeNull", {"column": "event_id"}, "feedback names its interaction"),
        Check("ExpectColumnValuesToBeInSet", {"column": "kind", "value_set": list(FEEDBACK_KINDS)},
              "feedback kind is known"),
        Check("ExpectColumnValuesToBeInSet", {"column": "value_invalid", "value_set": [False]},
              "feedback value_float finite"),
    ]
    outcomes = [validate(idf, icheck, "raw_interactions"), validate(fdf, fcheck, "raw_feedback", "feedback_id")]
    return _finish(lake, run_id, "gate_raw", outcomes, [], details)


def gate_episodes(cfg: Config, run_id: str) -> Verdict:
    """runs/<run_id>/episodes.parquet (verdict "gate_episodes")."""
    lake = Lake(cfg.lake_root)
    path = episodes_path(lake, run_id)
    if not lake.exists(path):
        raise FileNotFoundError(f"run {run_id!r} has no {path}: run `rtrl harvest` first")
    manifest = read_manifest(lake, run_id) or {}
    problems = schema_problems(lake, [lake.path(path)], EPISODES_SCHEMA)
    details = {"policy_version": manifest.get("policy_version")}
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
    if manifest.get("org_id"):  # an org adapter's run: one org by construction, and only that org
        checks.append(Check("ExpectColumnValuesToBeInSet", {"column": "org_id", "value_set": [manifest["org_id"]]},
                            "only the adapter's own organisation"))
    else:  # the shared policy must not be dominated by one org
        checks.append(Check("ExpectColumnMaxToBeBetween", {"column": "org_share", "max_value": g.max_org_share},
                            "no single org above max_org_share"))
    if manifest.get("policy_version") is not None:
        checks.append(Check("ExpectColumnValuesToBeInSet",
                            {"column": "policy_version", "value_set": [manifest["policy_version"]]},
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
