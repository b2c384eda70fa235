"""A checkpoint's card in MLflow: what a person comparing two versions looks for, on the version's run and page.

Why: the MLflow UI is where an operator compares checkpoints and decides; the lake holds the truth, but nobody
reads Parquet to judge a promotion. So every number that decides is a metric on the version's run, under one
prefix per source and never under two names:

    train/*    the trainer's per-step curves (rl_core/train/trainer.py) and its summary (train/kl_mean, ...)
    reward/*   the training episodes' rewards: mean, spread, each component's mean
    eval/*     the eval suite: the candidate's rates, the parent's pass rate, the deltas per category
    monitor/*  the reward-hacking rates once the version served, and their rise over its parent
    ab/*       the A/B comparison with the champion: per-arm counts, each metric's difference, interval, p-value
    _decide/*  the few that decide, copied from the above (rl_core/registry/layout.VERSION_DECIDE): first in the
               compare view's sorted list and the runs table's columns (layout.py says why)

The reports behind them are artifacts of the same run (eval/, verdicts/, monitors/, charts/*.png, and the same
files at the run's root for the compare view: rl_core/registry/card_files.py), and the version's description
opens with a short table (parent, window, episodes, reward, KL, eval deltas with the interval, verdicts,
monitors, A/B with its counts and reason) above the alias history that rl_core/registry/store.py appends; the
run's description (tag mlflow.note.content) and its card.md hold the same. Nothing here moves an alias.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rl_core.config import Config
from rl_core.lake import Lake
from rl_core.registry import card_files, layout, store
from rl_core.reports import Verdict, read_verdicts
from rl_core.schema import SIGNALS

NOTE = "mlflow.note.content"  # a run's description in the MLflow UI


def _finite(d: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in d.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def read_rewards(lake: Lake, run_id: str) -> pa.Table | None:
    path = lake.run(run_id).rewards
    return lake.read_parquet(path) if lake.exists(path) else None


def reward_metrics(t: pa.Table | None) -> dict[str, float]:
    """reward/*: a run's scored episodes (its rewards.parquet); empty when the run has none."""
    if t is None:
        return {}
    if t.num_rows == 0:
        return {"reward/n": 0.0}
    out = {"reward/n": t.num_rows, "reward/mean": pc.mean(t["reward"]).as_py(),
           "reward/std": pc.stddev(t["reward"], ddof=1).as_py() if t.num_rows > 1 else 0.0}
    flags = {"broken_tool_call": "broken_tool_rate", "is_clarifying": "clarifying_rate"}
    out |= {f"reward/{name}": pc.mean(pc.cast(t[col], "float64")).as_py() for col, name in flags.items()
            if col in t.column_names}
    out |= {f"reward/{c}": pc.mean(t[c]).as_py() for c in SIGNALS if c in t.column_names}
    return _finite(out)


def eval_metrics(details: dict[str, Any], z: float = 1.96) -> dict[str, float]:
    """eval/*: from the eval verdict's details (candidate_* and baseline_* aggregates of evals.compare), the
    paired difference's interval (diff_* +- z * se_*) as eval/ci_lo_* and eval/ci_hi_*, and the minimum detectable
    change at the eval's power as eval/mde_*."""
    out: dict[str, Any] = {f"eval/{k}": v for k, v in details.items() if k.startswith("mde_")}
    for k, v in details.items():
        se = details.get(f"se_{k.removeprefix('diff_')}")
        if k.startswith("diff_") and isinstance(v, (int, float)) and isinstance(se, (int, float)):
            out[f"eval/ci_lo_{k.removeprefix('diff_')}"] = v - z * se
            out[f"eval/ci_hi_{k.removeprefix('diff_')}"] = v + z * se
    for k, v in details.items():
        if k.startswith("candidate_") and k != "candidate_cached":
            out[f"eval/{k.removeprefix('candidate_')}"] = v
        elif k.startswith("baseline_pass_rate"):
            name = k.removeprefix("baseline_")
            out[f"eval/parent_{name}"] = v
            cand = details.get(f"candidate_{name}")
            if isinstance(cand, (int, float)) and isinstance(v, (int, float)):
                out[f"eval/delta_{name}"] = cand - v
    return _finite(out)


def _log_batch(client, mlflow_run: str, metrics: dict[str, float]) -> None:
    """Every metric in one call (one store transaction, not one per metric)."""
    from mlflow.entities import Metric  # lazy: heavy (mlflow)

    ts = int(time.time() * 1000)
    client.log_batch(mlflow_run, metrics=[Metric(k, float(v), ts, 0) for k, v in metrics.items()])


def run_of(cfg: Config, version: int) -> str:
    return store.get_version(cfg, version).run_id


def log_cycle(cfg: Config, run_id: str, version: int) -> None:
    """At registration: reward/* and eval/* metrics, the eval report, the verdicts and the charts on the version's
    run (rl_core/registry/card_files.py), then the description. Safe to repeat (a rerun logs the same again)."""
    lake = Lake(cfg.lake_root)
    mlflow_run = run_of(cfg, version)
    verdicts = read_verdicts(lake, run_id)
    rewards = read_rewards(lake, run_id)  # read once: the metrics and the histogram
    metrics = reward_metrics(rewards)
    if "eval" in verdicts:
        metrics |= eval_metrics(verdicts["eval"].details, cfg.eval.z)
    c = store.client(cfg)
    _log_batch(c, mlflow_run, metrics)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        card_files.write_all(root, lake, run_id, verdicts, rewards, metrics)
        for sub in ("eval", "verdicts", "charts"):
            if any((root / sub).iterdir()):
                c.log_artifacts(mlflow_run, str(root / sub), sub)
        for name in layout.COMMON_FILES["train"]:
            if (root / name).is_file():
                c.log_artifact(mlflow_run, str(root / name))
    describe(cfg, version)


def log_monitors(cfg: Config, verdict: Verdict) -> None:
    """After the monitors judged a window: monitor/* rates and rises on each compared version's run, the report
    as monitors/<run_id>.json, the tag monitor.verdict, and the description table."""
    d = verdict.details
    reference = d.get("reference") or {}
    c = store.client(cfg)
    for v in d.get("compared", []):
        rates = d["rates"].get(str(v), {})
        mlflow_run = run_of(cfg, int(v))
        values = {f"monitor/{k}": rates.get(k) for k in rates if k.endswith("_rate") or k == "mean_reward"}
        values |= {f"monitor/{k}_rise": rates[k] - reference[k] for k in rates
                   if k.endswith("_rate") and isinstance(reference.get(k), (int, float)) and rates.get(k) is not None}
        values["monitor/n"] = rates.get("n")
        _log_batch(c, mlflow_run, _finite(values))
        c.log_text(mlflow_run, json.dumps(d, indent=2, sort_keys=True, default=str), f"monitors/{d.get('run_id')}.json")
        status = "tripped" if int(v) in d.get("tripped", []) else "passed"
        store.set_version_tags(cfg, int(v), {"monitor.verdict": status})  # which window: monitors/<run_id>.json
        describe(cfg, int(v))


def ab_summary(result) -> str:
    """`vs v<champion>: champion n=.., challenger n=..; <first reason>`: what an A/B decision rests on."""
    counts = ", ".join(f"{arm} n={int(result.n.get(arm, 0))}" for arm in ("champion", "challenger"))
    reason = f"; {result.reasons[0]}" if result.reasons else ""
    return f"vs v{result.champion_version}: {counts}{reason}"


def log_ab(cfg: Config, result) -> None:
    """After an A/B analysis (rl_core/ab/verdict.ABResult): ab/* (per-arm counts too) on the challenger's run,
    tags ab.decision and ab.summary (ab_summary)."""
    if result.challenger_version is None:
        return
    version = int(result.challenger_version)
    c = store.client(cfg)
    mlflow_run = run_of(cfg, version)
    values = {f"ab/{m.name}_{f}": getattr(m, f) for m in result.metrics.values() for f in ("diff", "lo", "hi", "p_value")}
    values |= {f"ab/n_{arm}": result.n.get(arm, 0) for arm in ("champion", "challenger")}
    _log_batch(c, mlflow_run, _finite(values))
    store.set_version_tags(cfg, version, {"ab.decision": result.decision, "ab.summary": ab_summary(result)})
    describe(cfg, version)


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def decide_metrics(m: dict[str, float], primary: str) -> dict[str, float]:
    """_decide/*: the deciding numbers (layout.VERSION_DECIDE) from the run's metrics, where it has them."""
    sources = {"1_reward_mean": "reward/mean", "1_reward_n": "reward/n", "2_kl_mean": "train/kl_mean",
               "2_kl_max": "train/kl_max", "3_eval_pass_rate": "eval/pass_rate", "3_eval_delta": "eval/delta_pass_rate",
               "3_eval_delta_lo": "eval/ci_lo_passed", "3_eval_delta_hi": "eval/ci_hi_passed",
               "3_eval_mde": "eval/mde_passed",
               "5_ab_n_champion": "ab/n_champion", "5_ab_n_challenger": "ab/n_challenger",
               "5_ab_primary_diff": f"ab/{primary}_diff", "5_ab_primary_p": f"ab/{primary}_p_value",
               "5_ab_reward_diff": "ab/reward_diff", "5_ab_reward_p": "ab/reward_p_value"}
    sources |= {name: f"monitor/{name.removeprefix('4_monitor_')}" for name in layout.VERSION_DECIDE
                if name.startswith("4_monitor_")}
    return {layout.decide_key(name): m[src] for name, src in sources.items() if src in m}


def _ab_row(tags: dict[str, str], m: dict[str, float]) -> str:
    ab = tags.get("ab.decision")
    if not ab:
        return "—"
    summary = tags.get("ab.summary") or f"vs v{tags.get('ab.champion')}"  # ab.champion: versions logged before
    return (f"{ab} {summary} (reward {_fmt(m.get('ab/reward_diff'), '+.3f')}, "
            f"p {_fmt(m.get('ab/reward_p_value'))})")


def table(tags: dict[str, str], m: dict[str, float]) -> str:
    """The description's table: one row per thing a person checks before trusting a version."""
    verdicts = ", ".join(f"{k.removeprefix('verdict.')} {'✓' if v == 'passed' else '✗'}"
                         for k, v in sorted(tags.items()) if k.startswith("verdict."))
    deltas = ", ".join(f"{k.removeprefix('eval/delta_pass_rate').lstrip('_') or 'all'} {v:+.3f}"
                       for k, v in sorted(m.items()) if k.startswith("eval/delta_pass_rate"))
    if "eval/ci_lo_passed" in m and "eval/ci_hi_passed" in m:
        deltas += f" (paired interval of all: [{m['eval/ci_lo_passed']:+.3f}, {m['eval/ci_hi_passed']:+.3f}]"
        deltas += f", detectable change {m['eval/mde_passed']:.3f})" if "eval/mde_passed" in m else ")"
    rises = ", ".join(f"{k.removeprefix('monitor/').removesuffix('_rise')} {v:+.3f}"
                      for k, v in sorted(m.items()) if k.startswith("monitor/") and k.endswith("_rise"))
    rows = [
        ("parent", f"v{tags['parent_version']}" if tags.get("parent_version", "").isdigit() else "none (base model)"),
        ("kind", tags.get("kind", "")),
        ("run", tags.get("run_id", "")),
        ("window", tags.get("data_window", "")),
        ("episodes", tags.get("episodes", "")),
        ("reward mean ± sd", f"{_fmt(m.get('reward/mean'), '+.3f')} ± {_fmt(m.get('reward/std'))}"),
        ("KL mean / max", f"{_fmt(m.get('train/kl_mean'), '.4f')} / {_fmt(m.get('train/kl_max'), '.4f')}"),
        ("eval pass rate (parent)", f"{_fmt(m.get('eval/pass_rate'))} ({_fmt(m.get('eval/parent_pass_rate'))})"),
        ("eval pass-rate deltas", deltas.strip() or "—"),
        ("verdicts", verdicts or "—"),
        ("monitors", f"{tags.get('monitor.verdict', 'not yet served')}" + (f" ({rises})" if rises else "")),
        ("A/B", _ab_row(tags, m)),
    ]
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def describe(cfg: Config, version: int) -> str:
    """Rewrite the version's description (the table, then the History section kept as it was); on its run: the
    _decide/* metrics, the same text as the run's description (tag mlflow.note.content) and as card.md."""
    c, name = store.client(cfg), cfg.mlflow.model_name
    mv = store.get_version(cfg, version)
    metrics = dict(c.get_run(mv.run_id).data.metrics) if mv.run_id else {}
    decide = decide_metrics(metrics, cfg.ab.primary)
    if mv.run_id and (changed := {k: v for k, v in decide.items() if metrics.get(k) != v}):
        _log_batch(c, mv.run_id, changed)
    old = mv.description or ""
    history = old[old.index(store.HISTORY):] if store.HISTORY in old else ""
    text = f"{table(dict(mv.tags or {}), metrics)}\n\n{history}".rstrip() + "\n"
    c.update_model_version(name, str(version), description=text)
    if mv.run_id:
        note = f"**{name} version {version}**\n\n{text}"
        c.set_tag(mv.run_id, NOTE, note[:8000])
        c.log_text(mv.run_id, note, "card.md")
    return text
