"""score_run: a run's episodes -> runs/<run_id>/rewards.parquet (one SQL file per signal + Python scorers).

Why this split: counting feedback and windowing over sessions is what SQL does best (sql/rewards/*.sql,
one file per signal so each reads alone); judging a tool call against its JSON schema or a follow-up's
tone is not, so rl_core/rewards/scorers.py does those over Arrow batches first and DuckDB joins the
result back by row position. The weights come from rtrl.toml [rewards] and the hash of that section is
stored in every row, so a reward can always be traced to the exact config that produced it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from rl_core.config import Config
from rl_core.duck import connect, load_sql, write_table
from rl_core.harvest import episodes_path
from rl_core.lake import Lake
from rl_core.rewards.scorers import score_batch
from rl_core.schema import REWARDS_SCHEMA, SIGNALS

BATCH_ROWS = 65_536


@dataclass
class RewardsResult:
    run_id: str
    path: str
    n_episodes: int
    mean_reward: float
    n_broken_tool_calls: int
    n_clarifying: int
    reward_config_hash: str


def rewards_path(lake: Lake, run_id: str) -> str:
    return lake.run(run_id).rewards


def check_weights(weights: dict[str, float]) -> None:
    """The [rewards] weights must name exactly the signals; a broken tool call must be able to cost."""
    unknown = sorted(set(weights) - set(SIGNALS))
    missing = sorted(set(SIGNALS) - set(weights))
    if unknown:
        raise ValueError(f"rewards.weights: unknown signal(s) {unknown}; signals are {list(SIGNALS)}")
    if missing:
        raise ValueError(f"rewards.weights: missing weight(s) for {missing}")
    if not weights["tool_call_validity"] > 0:
        raise ValueError("rewards.weights.tool_call_validity must be > 0 (broken tool calls must be negative), "
                         f"got {weights['tool_call_validity']}")


def signals_query() -> str:
    """All signal files as CTEs over `scored`, joined by rn, then sql/rewards/_combine.sql."""
    ctes = [f"{s} AS (\n{load_sql(f'rewards/{s}.sql').strip().rstrip(';')}\n)" for s in SIGNALS]
    cols = ", ".join(f"{s}.value AS {s}" for s in SIGNALS)
    joins = " ".join(f"JOIN {s} USING (rn)" for s in SIGNALS)
    ctes.append(f"signals AS (\nSELECT scored.rn, scored.event_id, scored.broken_tool_call, "
                f"scored.is_clarifying, {cols}\nFROM scored {joins}\n)")
    return "WITH " + ",\n".join(ctes) + "\n" + load_sql("rewards/_combine.sql")


def score_run(cfg: Config, run_id: str) -> RewardsResult:
    """Score runs/<run_id>/episodes.parquet; write rewards.parquet atomically (same episodes -> same file)."""
    rc = cfg.rewards
    check_weights(rc.weights)
    lake = Lake(cfg.lake_root)
    src = episodes_path(lake, run_id)
    if not lake.exists(src):
        raise FileNotFoundError(f"run {run_id!r} has no {src}: run `rtrl harvest` first")
    url = lake.url(src)
    con = connect(lake, memory_limit=cfg.harvest.duckdb_memory_limit)
    try:
        reader = con.sql(load_sql("rewards/_scorer_input.sql"), params={"path": url}).to_arrow_reader(BATCH_ROWS)
        batches = [score_batch(b) for b in reader]
        scores = pa.Table.from_batches(batches) if batches else _empty_scores()
        con.register("scores", scores)
        con.execute(load_sql("rewards/_scored.sql"), {"path": url})
        params = {f"w_{k}": float(v) for k, v in rc.weights.items()} | {
            "latency_budget_ms": rc.latency_budget_ms, "clarification_rate_max": rc.clarification_rate_max,
            "reward_clip": rc.reward_clip, "reward_config_hash": rc.config_hash(),
        }
        table = con.sql(signals_query(), params=params).to_arrow_table()
    finally:
        con.close()
    table = table.select(REWARDS_SCHEMA.names).cast(REWARDS_SCHEMA).combine_chunks()
    path = write_table(lake, rewards_path(lake, run_id), table)
    mean = pc.mean(table["reward"]).as_py() if table.num_rows else 0.0
    return RewardsResult(
        run_id=run_id, path=path, n_episodes=table.num_rows, mean_reward=float(mean if mean is not None else 0.0),
        n_broken_tool_calls=int(pc.sum(table["broken_tool_call"]).as_py() or 0),
        n_clarifying=int(pc.sum(table["is_clarifying"]).as_py() or 0), reward_config_hash=rc.config_hash(),
    )


def _empty_scores() -> pa.Table:
    return pa.table({"rn": pa.array([], pa.int64()), "has_tool_calls": pa.array([], pa.bool_()),
                     "broken_tool_call": pa.array([], pa.bool_()), "is_clarifying": pa.array([], pa.bool_()),
                     "empty_or_refusal": pa.array([], pa.bool_()), "dissatisfied": pa.array([], pa.bool_())})
