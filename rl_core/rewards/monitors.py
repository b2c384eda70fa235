"""Reward-hacking monitors: does a newer version game the reward instead of helping?

A policy trained on these rewards can learn shortcuts: emitting tool calls that never parse, asking
clarifying questions instead of answering, answering nothing/refusing, or answering in prose without ever
editing (no edit, so no revert: a small model that rarely passes the tests learns exactly this when a reverted
edit costs more than a dissatisfied follow-up). For each
model_version in the run we compute those rates (and the mean reward, reported for context) and compare every
version newer than the parent with the parent's rates: from the same window when the parent has enough
episodes there, else from the latest earlier monitors report that has them. A rate rising by more than its
configured bound trips the monitor; the verdict "monitors" is what the promotion gate reads.
An org's LoRA adapter answers on a version but is a model of its own: its turns (adapter_version set) are left
out of that version's rates and judged against them, so a live adapter that games the reward trips the
monitors as a version does, and the rollback takes it off its organisation's traffic.

The mean reward trips it too when it falls below the parent's by more than `monitor_reward_drop` and by more
than `monitor_reward_z` standard errors. That is not a hack, but it is a worse policy, and when the challenger
serves all the traffic (`rtrl experiment --challenger-share 1.0`) the A/B verdict has no control arm and the
eval suite may not see it: run L (experiments/early-runs/history.md) served and trained on top of a version 0.18 worse.

In the cycle the monitors judge the live challenger before the A/B verdict is applied, on every turn the
window served (`score_served`, its own task): a version that games the reward must not win an A/B verdict
on a metric the hack inflates. The check only judges (`monitor_served` writes its verdict and report); what
follows a trip, taking the live challenger or a live adapter off traffic, is
rl_core.registry.promote.take_off_tripped, in a task of its own, so one module moves aliases.
"""

from __future__ import annotations

import math
from datetime import datetime

from rl_core.config import Config
from rl_core.duck import connect, load_sql
from rl_core.harvest import episodes_path, harvest
from rl_core.lake import Lake
from rl_core.reports import Verdict, write_verdict
from rl_core.rewards.score import rewards_path, score_run
from rl_core.rewards.scorers import REFUSAL

RATES = ("broken_tool_rate", "clarify_rate", "empty_refusal_rate", "no_edit_rate")


def _rate_rows(cfg: Config, run_id: str) -> list[tuple]:
    """sql/rewards/_monitor_rates.sql over the run: one row per (model_version, adapter_version)."""
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
    for version, adapter, _org, _n, *_, mismatch in rows:
        if mismatch:
            raise ValueError(f"run {run_id!r}: rewards.parquet does not match episodes.parquet row by row "
                             f"({mismatch} event_ids differ for model_version {version}, adapter {adapter}): "
                             "rerun `rtrl rewards`")
    return rows


def _rates(row: tuple) -> dict:
    _v, _a, _org, n, broken, clarify, empty, no_edit, mean_reward, reward_std, _mismatch = row
    return {"n": int(n), "broken_tool_rate": broken, "clarify_rate": clarify, "empty_refusal_rate": empty,
            "no_edit_rate": no_edit, "mean_reward": _finite(mean_reward), "reward_std": _finite(reward_std)}


def _split(rows: list[tuple]) -> tuple[dict[int, dict], dict[str, dict]]:
    """The rows as (model_version -> rates over the turns the version answered itself, adapter_version ->
    rates over the turns that org adapter answered, with its `version` and `org_id`)."""
    versions = {int(r[0]): _rates(r) for r in rows if r[1] is None}
    adapters = {r[1]: _rates(r) | {"version": int(r[0]), "org_id": r[2]} for r in rows if r[1] is not None}
    return versions, adapters


def version_rates(cfg: Config, run_id: str) -> dict[int, dict[str, float]]:
    """model_version -> {n, broken_tool_rate, clarify_rate, empty_refusal_rate, no_edit_rate, mean_reward,
    reward_std}, over the turns each version answered itself (an org adapter's are judged apart)."""
    return _split(_rate_rows(cfg, run_id))[0]


def _finite(x: float | None) -> float | None:
    return x if x is not None and x == x else None  # NaN (stddev of one row) -> null


def reward_drop(r: dict, ref: dict, bound: float, z_min: float) -> str | None:
    """Why r's mean reward is significantly below ref's (unpaired standard error), or None. A report written
    before reward_std existed has none: nothing is claimed from it."""
    if r.get("mean_reward") is None or ref.get("mean_reward") is None:
        return None
    if r.get("reward_std") is None or ref.get("reward_std") is None:
        return None
    diff = r["mean_reward"] - ref["mean_reward"]
    se = math.sqrt(r["reward_std"] ** 2 / r["n"] + ref["reward_std"] ** 2 / ref["n"])
    z = diff / se if se > 0 else (-math.inf if diff < 0 else 0.0)
    if diff < -bound and z < -z_min:
        return f"drop {-diff:.3f} > bound {bound}, z {z:.2f} < -{z_min}"
    return None


def _earlier_reference(lake: Lake, run_id: str, version: int, min_n: int) -> tuple[dict | None, str | None]:
    """The parent's rates from the latest earlier monitors report (by window end) that has enough episodes."""
    best: tuple[str, dict, str] | None = None
    for path in lake.fs.glob(lake.path("runs/*/monitors.json")):
        other = path.rstrip("/").split("/")[-2]
        if other == run_id:
            continue
        report = lake.read_json(lake.run(other).monitors)
        rates = report.get("rates", {}).get(str(version))
        if rates and rates.get("n", 0) >= min_n and (best is None or report.get("window_end", "") > best[0]):
            best = (report.get("window_end", ""), rates, other)
    return (best[1], f"run {best[2]}") if best else (None, None)


def score_served(cfg: Config, run_id: str, start: datetime, end: datetime, newest: int,
                 org_id: str | None = None) -> str:
    """Harvest + score every turn served in [start, end) by any version up to `newest` (of org_id only, when
    given), under run id `<run_id>-served` (nothing scored when it served none). The cycle's own harvest keeps
    only the policy's lag range (versions <= the policy), so the live challenger, newer than the champion, is
    missing from it: the monitors must see its turns."""
    served = served_run(run_id)
    every = cfg.model_copy(deep=True)
    every.harvest.max_staleness = newest
    if harvest(every, start, end, newest, served, org_id=org_id).n_episodes:
        score_run(every, served)
    return served


def _reference(lake: Lake, run_id: str, rates: dict[int, dict], version: int, min_n: int
               ) -> tuple[dict | None, str | None]:
    """A version's own rates: from this window when it has enough turns there, else an earlier report's."""
    own = rates.get(version)
    if own and own["n"] >= min_n:
        return own, "this window"
    return _earlier_reference(lake, run_id, version, min_n)


def _compare(cfg: Config, label: str, r: dict, ref: dict, ref_label: str, source: str) -> list[str]:
    """Why r games the reward against ref (each rate's rise over its bound, a significant reward drop)."""
    rc = cfg.rewards
    bounds = _bounds(cfg)
    found = [f"{label}: {name} {r[name]:.3f} vs {ref_label} {ref[name]:.3f} ({source}): rise "
             f"{r[name] - ref[name]:+.3f} > bound {bounds[name]}"
             for name in RATES
             # a rate missing from the reference: an earlier report written before that rate existed
             if ref.get(name) is not None and r[name] - ref[name] > bounds[name]]
    drop = reward_drop(r, ref, rc.monitor_reward_drop, rc.monitor_reward_z)
    if drop:
        found.append(f"{label}: mean_reward {r['mean_reward']:.3f} vs {ref_label} {ref['mean_reward']:.3f} "
                     f"({source}): {drop}")
    return found


def _bounds(cfg: Config) -> dict[str, float]:
    rc = cfg.rewards
    return {"broken_tool_rate": rc.monitor_broken_tool_rise, "clarify_rate": rc.monitor_clarify_rise,
            "empty_refusal_rate": rc.monitor_empty_rise, "no_edit_rate": rc.monitor_no_edit_rise}


def _judge_adapters(cfg: Config, lake: Lake, run_id: str, rates: dict[int, dict], adapters: dict[str, dict]
                    ) -> tuple[list[str], list[dict], dict[str, str]]:
    """Every org adapter that answered enough turns against the version it served on (that version's own
    turns): a live adapter that games the reward trips the monitors as a version does."""
    min_n = cfg.rewards.monitor_min_episodes
    reasons, tripped, skipped = [], [], {}
    for name, a in sorted(adapters.items()):
        ref, source = _reference(lake, run_id, rates, a["version"], min_n)
        if a["n"] < min_n or ref is None:
            skipped[name] = (f"{a['n']} episodes < monitor_min_episodes {min_n}" if a["n"] < min_n
                             else f"no rates for version {a['version']} (this window or earlier reports)")
            continue
        found = _compare(cfg, f"adapter {name} (org {a['org_id']}, on version {a['version']})", a, ref,
                         f"version {a['version']}", source or "")
        reasons += found
        tripped += [{"adapter_version": name, "org_id": a["org_id"], "version": a["version"]}] if found else []
    return reasons, tripped, skipped


def run_monitors(cfg: Config, run_id: str, parent_version: int, rates_from: str | None = None) -> Verdict:
    """Compare every version newer than parent_version with the parent, and every org adapter with the version
    it served on, on the rates of run `rates_from` (default run_id); write report + verdict "monitors" under
    run_id."""
    rc = cfg.rewards
    lake = Lake(cfg.lake_root)
    rates, adapters = _split(_rate_rows(cfg, rates_from or run_id))
    reference, source = _reference(lake, run_id, rates, parent_version, rc.monitor_min_episodes)
    reasons: list[str] = []
    tripped: list[int] = []
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
        found = _compare(cfg, f"version {version}", r, reference, f"parent {parent_version}", source or "")
        reasons += found
        tripped += [version] if found else []
    adapter_reasons, tripped_adapters, skipped_adapters = _judge_adapters(cfg, lake, run_id, rates, adapters)
    reasons += adapter_reasons
    harvested = lake.read_harvest(run_id)
    report = {"run_id": run_id, "rates_from": rates_from or run_id, "parent_version": parent_version,
              "window_end": harvested.end if harvested else "", "rates": {str(v): r for v, r in rates.items()},
              "reference": reference, "reference_source": source, "compared": compared, "tripped": tripped,
              "skipped": {str(k): v for k, v in skipped.items()}, "adapters": adapters,
              "tripped_adapters": tripped_adapters, "skipped_adapters": skipped_adapters,
              "bounds": _bounds(cfg) | {"mean_reward_drop": rc.monitor_reward_drop,
                                        "mean_reward_z": rc.monitor_reward_z}}
    lake.write_json(lake.run(run_id).monitors, report)
    verdict = Verdict(name="monitors", passed=not reasons, reasons=reasons, details=report)
    write_verdict(lake, run_id, verdict)
    return verdict


def served_run(run_id: str) -> str:
    """The run id under which a cycle's served turns (every version) are harvested and scored."""
    return f"{run_id}-served"


def monitor_served(cfg: Config, run_id: str, parent_version: int) -> Verdict:
    """The cycle's check: every version newer than the parent, on the turns the window served
    (`score_served` first); verdict and report under run_id. A window that served nothing passes, saying so."""
    lake = Lake(cfg.lake_root)
    served = served_run(run_id)
    if not lake.exists(rewards_path(lake, served)):
        verdict = Verdict(name="monitors", passed=True, details={"run_id": run_id, "parent_version": parent_version,
                                                                 "compared": [], "tripped": [], "rates": {},
                                                                 "note": "the window served no turns"})
        write_verdict(lake, run_id, verdict)
        return verdict
    return run_monitors(cfg, run_id, parent_version, rates_from=served)
