"""Reward-hacking monitors: does a newer version game the reward instead of helping?

A policy trained on these rewards can learn shortcuts: emitting tool calls that never parse, asking
clarifying questions instead of answering, or answering nothing/refusing (no edit, so no revert). For each
model_version in the run we compute those rates (and the mean reward, reported for context) and compare every
version newer than the parent with the parent's rates: from the same window when the parent has enough
episodes there, else from the latest earlier monitors report that has them. A rate rising by more than its
configured bound trips the monitor; the verdict "monitors" is what the promotion gate reads.
"""

from __future__ import annotations

from rl_core.config import Config
from rl_core.harvest import connect, episodes_path, load_sql, read_manifest
from rl_core.lake import Lake
from rl_core.reports import Verdict, write_verdict
from rl_core.rewards.score import rewards_path
from rl_core.rewards.scorers import REFUSAL

RATES = ("broken_tool_rate", "clarify_rate", "empty_refusal_rate")


def version_rates(cfg: Config, run_id: str) -> dict[int, dict[str, float]]:
    """model_version -> {n, broken_tool_rate, clarify_rate, empty_refusal_rate, mean_reward}."""
    lake = Lake(cfg.lake_root)
    eps, rws = episodes_path(lake, run_id), rewards_path(lake, run_id)
    for p in (eps, rws):
        if not lake.exists(p):
            raise FileNotFoundError(f"run {run_id!r} has no {p}: run harvest and rewards first")
    con = connect(lake, memory_limit=cfg.harvest.duckdb_memory_limit)
    try:
        rows = con.sql(load_sql("rewards/_monitor_rates.sql"),
                       params={"episodes": lake.url(eps), "rewards": lake.url(rws), "refusal": REFUSAL}).fetchall()
    finally:
        con.close()
    out: dict[int, dict[str, float]] = {}
    for version, n, broken, clarify, empty, mean_reward, mismatch in rows:
        if mismatch:
            raise ValueError(f"run {run_id!r}: rewards.parquet does not match episodes.parquet row by row "
                             f"({mismatch} event_ids differ for model_version {version}): rerun `rtrl rewards`")
        out[int(version)] = {"n": int(n), "broken_tool_rate": broken, "clarify_rate": clarify,
                             "empty_refusal_rate": empty,
                             "mean_reward": mean_reward if mean_reward == mean_reward else None}  # NaN -> null
    return out


def _earlier_reference(lake: Lake, run_id: str, version: int, min_n: int) -> tuple[dict | None, str | None]:
    """The parent's rates from the latest earlier monitors report (by window end) that has enough episodes."""
    best: tuple[str, dict, str] | None = None
    for path in lake.fs.glob(lake.path("runs/*/monitors.json")):
        other = path.rstrip("/").split("/")[-2]
        if other == run_id:
            continue
        report = lake.read_json(f"runs/{other}/monitors.json")
        rates = report.get("rates", {}).get(str(version))
        if rates and rates.get("n", 0) >= min_n and (best is None or report.get("window_end", "") > best[0]):
            best = (report.get("window_end", ""), rates, other)
    return (best[1], f"run {best[2]}") if best else (None, None)


def run_monitors(cfg: Config, run_id: str, parent_version: int) -> Verdict:
    """Compare every version newer than parent_version with the parent; write report + verdict "monitors"."""
    rc = cfg.rewards
    lake = Lake(cfg.lake_root)
    rates = version_rates(cfg, run_id)
    bounds = {"broken_tool_rate": rc.monitor_broken_tool_rise, "clarify_rate": rc.monitor_clarify_rise,
              "empty_refusal_rate": rc.monitor_empty_rise}
    parent = rates.get(parent_version)
    if parent and parent["n"] >= rc.monitor_min_episodes:
        reference, source = parent, "this window"
    else:
        reference, source = _earlier_reference(lake, run_id, parent_version, rc.monitor_min_episodes)
    reasons: list[str] = []
    compared: list[int] = []
    skipped: dict[int, str] = {}
    for version, r in sorted(rates.items()):
        if version <= parent_version:
            continue
        if r["n"] < rc.monitor_min_episodes:
            skipped[version] = f"{r['n']} episodes < monitor_min_episodes {rc.monitor_min_episodes}"
            continue
        if reference is None:
            skipped[version] = f"no rates for parent version {parent_version} (this window or earlier reports)"
            continue
        compared.append(version)
        for name in RATES:
            rise = r[name] - reference[name]
            if rise > bounds[name]:
                reasons.append(f"version {version}: {name} {r[name]:.3f} vs parent {parent_version} "
                               f"{reference[name]:.3f} ({source}): rise {rise:+.3f} > bound {bounds[name]}")
    manifest = read_manifest(lake, run_id) or {}
    report = {"run_id": run_id, "parent_version": parent_version, "window_end": manifest.get("end", ""),
              "rates": {str(v): r for v, r in rates.items()}, "reference": reference, "reference_source": source,
              "compared": compared, "skipped": {str(k): v for k, v in skipped.items()}, "bounds": bounds}
    lake.write_json(f"{lake.run_dir(run_id)}/monitors.json", report)
    verdict = Verdict(name="monitors", passed=not reasons, reasons=reasons, details=report)
    write_verdict(lake, run_id, verdict)
    return verdict
