"""A checkpoint's card in MLflow: what a person comparing two versions looks for, on the version's run and page.

Why: the MLflow UI is where an operator compares checkpoints and decides; the lake holds the truth, but nobody
reads Parquet to judge a promotion. So every number that decides is a metric on the version's run, under one
prefix per source and never under two names:

    train/*    the trainer's per-step curves (rl_core/train/trainer.py) and its summary (train/kl_mean, ...)
    reward/*   the training episodes' rewards: mean, spread, each component's mean
    eval/*     the eval suite: the candidate's rates, the parent's pass rate, the deltas per category
    monitor/*  the reward-hacking rates once the version served, and their rise over its parent
    ab/*       the A/B comparison with the champion: each metric's difference, interval and p-value

The reports behind them are artifacts of the same run (eval/, verdicts/, monitors/, charts/*.png), and the
version's description opens with a short table (parent, window, episodes, reward, KL, eval deltas, verdicts,
monitors, A/B) above the alias history that rl_core/registry/store.py appends. Nothing here moves an alias.
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
from rl_core.registry import store
from rl_core.reports import Verdict, read_verdicts
from rl_core.schema import SIGNALS


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


def eval_metrics(details: dict[str, Any]) -> dict[str, float]:
    """eval/*: from the eval verdict's details (candidate_* and baseline_* aggregates of evals.compare)."""
    out: dict[str, Any] = {}
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


def _charts(run_id: str, rewards_table: pa.Table | None, metrics: dict[str, float], out: Path) -> None:
    """charts/reward_hist.png (the episodes' rewards) and charts/eval_deltas.png (pass-rate delta per category)."""
    import matplotlib  # heavy: imported only when a card is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if rewards_table is not None:
        rewards = rewards_table["reward"].to_pylist()
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.hist([r for r in rewards if r is not None], bins=20, color="#3b7dd8")
        ax.set(title=f"{run_id}: episode rewards (n={len(rewards)})", xlabel="reward", ylabel="episodes")
        fig.tight_layout()
        fig.savefig(out / "reward_hist.png", dpi=110)
        plt.close(fig)
    deltas = {k.removeprefix("eval/delta_pass_rate").lstrip("_") or "all": v
              for k, v in metrics.items() if k.startswith("eval/delta_pass_rate")}
    if deltas:
        fig, ax = plt.subplots(figsize=(6, 0.45 * len(deltas) + 1.4))
        names = sorted(deltas)
        ax.barh(names, [deltas[n] for n in names], color=["#2a9d55" if deltas[n] >= 0 else "#d1495b" for n in names])
        ax.axvline(0, color="black", lw=0.8)
        ax.set(title=f"{run_id}: eval pass-rate delta vs parent", xlabel="candidate - parent")
        fig.tight_layout()
        fig.savefig(out / "eval_deltas.png", dpi=110)
        plt.close(fig)


def log_cycle(cfg: Config, run_id: str, version: int) -> None:
    """At registration: reward/* and eval/* metrics, the eval report, the verdicts and the charts on the version's
    run, then the description table. Safe to repeat (a rerun logs the same values and files again)."""
    lake = Lake(cfg.lake_root)
    mlflow_run = run_of(cfg, version)
    verdicts = read_verdicts(lake, run_id)
    rewards = read_rewards(lake, run_id)  # read once: the metrics and the histogram
    metrics = reward_metrics(rewards) | (eval_metrics(verdicts["eval"].details) if "eval" in verdicts else {})
    c = store.client(cfg)
    c.update_run(mlflow_run, name=f"v{version}-{run_id}")  # the version first: the runs table cuts long names
    _log_batch(c, mlflow_run, metrics)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for sub in ("eval", "verdicts", "charts"):
            (root / sub).mkdir()
        for name, v in verdicts.items():
            (root / "verdicts" / f"{name}.json").write_text(v.model_dump_json(indent=2))
        for name in ("report.md", "comparison.json", "results.parquet"):
            rel = f"{lake.run(run_id).eval}/{name}"
            if lake.exists(rel):
                with lake.fs.open(lake.path(rel), "rb") as f:
                    (root / "eval" / name).write_bytes(f.read())
        _charts(run_id, rewards, metrics, root / "charts")
        for sub in ("eval", "verdicts", "charts"):
            if any((root / sub).iterdir()):
                c.log_artifacts(mlflow_run, str(root / sub), sub)
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
        store.set_version_tags(cfg, int(v), {"monitor.verdict": status, "monitor.run": d.get("run_id", "")})
        describe(cfg, int(v))


def log_ab(cfg: Config, result) -> None:
    """After an A/B analysis (rl_core/ab/verdict.ABResult): ab/* on the challenger's run, tag ab.decision."""
    if result.challenger_version is None:
        return
    version = int(result.challenger_version)
    c = store.client(cfg)
    mlflow_run = run_of(cfg, version)
    values = {f"ab/{m.name}_{f}": getattr(m, f) for m in result.metrics.values() for f in ("diff", "lo", "hi", "p_value")}
    _log_batch(c, mlflow_run, _finite(values))
    store.set_version_tags(cfg, version, {"ab.decision": result.decision, "ab.champion": result.champion_version})
    describe(cfg, version)


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def table(tags: dict[str, str], m: dict[str, float]) -> str:
    """The description's table: one row per thing a person checks before trusting a version."""
    verdicts = ", ".join(f"{k.removeprefix('verdict.')} {'✓' if v == 'passed' else '✗'}"
                         for k, v in sorted(tags.items()) if k.startswith("verdict."))
    deltas = ", ".join(f"{k.removeprefix('eval/delta_pass_rate').lstrip('_') or 'all'} {v:+.3f}"
                       for k, v in sorted(m.items()) if k.startswith("eval/delta_pass_rate"))
    rises = ", ".join(f"{k.removeprefix('monitor/').removesuffix('_rise')} {v:+.3f}"
                      for k, v in sorted(m.items()) if k.startswith("monitor/") and k.endswith("_rise"))
    ab = tags.get("ab.decision")
    rows = [
        ("parent", f"v{tags['parent_version']}" if tags.get("parent_version", "").isdigit() else "none (base model)"),
        ("kind", tags.get("kind", "")),
        ("run", tags.get("run_id", "")),
        ("window", tags.get("data_window", "")),
        ("episodes", tags.get("episodes", "")),
        ("reward mean ± sd", f"{_fmt(m.get('reward/mean'), '+.3f')} ± {_fmt(m.get('reward/std'))}"),
        ("KL mean / max", f"{_fmt(m.get('train/kl_mean'), '.4f')} / {_fmt(m.get('train/kl_max'), '.4f')}"),
        ("eval pass rate (parent)", f"{_fmt(m.get('eval/pass_rate'))} ({_fmt(m.get('eval/parent_pass_rate'))})"),
        ("eval pass-rate deltas", deltas or "—"),
        ("verdicts", verdicts or "—"),
        ("monitors", f"{tags.get('monitor.verdict', 'not yet served')}" + (f" ({rises})" if rises else "")),
        ("A/B", f"{ab} vs v{tags.get('ab.champion')} (reward {_fmt(m.get('ab/reward_diff'), '+.3f')}, "
                f"p {_fmt(m.get('ab/reward_p_value'))})" if ab else "—"),
    ]
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def describe(cfg: Config, version: int) -> str:
    """Rewrite the version's description: the table, then the History section kept as it was."""
    mv = store.get_version(cfg, version)
    metrics = store.client(cfg).get_run(mv.run_id).data.metrics if mv.run_id else {}
    old = mv.description or ""
    history = old[old.index(store.HISTORY):] if store.HISTORY in old else ""
    text = f"{table(dict(mv.tags or {}), metrics)}\n\n{history}".rstrip() + "\n"
    store.client(cfg).update_model_version(cfg.mlflow.model_name, str(version), description=text)
    return text

