"""Register a cycle's trained checkpoint as a new version of the policy model, with its lineage.

Why lineage on the version: a version that serves users must answer "trained from what, on which
data, scored how, judged by what" from the registry alone. Tags (parent_version, data_window, run_id,
episodes, reward_config_hash, verdict.<name>) go on the version and its MLflow run (the trainer's run, which
already holds the train/* curves and summary); rl_core/registry/card.py then adds reward/* and eval/*, the
reports as artifacts and the description table, so the MLflow UI compares any two checkpoints side by side.

Inputs, all from the run's folder in the lake: train/summary.json (checkpoint path, base version,
trainer metrics, the trainer's MLflow run id if it logged one), harvest.json (window, policy version),
episodes.parquet (count), rewards.parquet (reward_config_hash), verdicts/*.json. Registering the same
run twice returns the existing version (found by its run_id tag): reruns and retries are safe.

Registering is also the moment a run consumes its episodes (rl_core/ledger.py): the ledger records them
for the parent's lineage once the version exists (and again, idempotently, when a rerun finds it), and a run
whose episodes another run of the lineage already consumed is refused with EpisodesConsumed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pydantic import ValidationError

from rl_core import ledger
from rl_core.config import Config
from rl_core.ids import IdError, check_run_id, mlflow_filter_value
from rl_core.lake import Lake
from rl_core.registry import card, store
from rl_core.reports import read_verdicts
from rl_core.train.launch import summary_metrics


class RegisterError(ValueError):
    """The run's files do not describe a registrable checkpoint; the message names the file and field."""


def find_version(cfg: Config | store.Registry, run_id: str) -> int | None:
    """The version already registered for run_id (by its run_id tag), if any."""
    from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

    try:
        found = store.client(cfg).search_model_versions(
            f"name={mlflow_filter_value(store.Registry.of(cfg).model_name)} and tags.run_id = {mlflow_filter_value(run_id)}"
        )
    except MlflowException:
        return None
    versions = sorted(int(mv.version) for mv in found)
    return versions[0] if versions else None


def _count_rows(lake: Lake, relpath: str) -> int | None:
    if not lake.exists(relpath):
        return None
    with lake.fs.open(lake.path(relpath), "rb") as f:
        return pq.ParquetFile(f).metadata.num_rows


def _reward_hash(lake: Lake, relpath: str) -> str | None:
    if not lake.exists(relpath):
        return None
    hashes = set(lake.read_parquet(relpath).column("reward_config_hash").unique().to_pylist()) - {None}
    if len(hashes) > 1:
        raise RegisterError(f"{relpath}: reward_config_hash has {len(hashes)} values {sorted(hashes)}; expected one")
    return hashes.pop() if hashes else None


def lineage(cfg: Config, run_id: str) -> dict[str, Any]:
    """Everything register_run records, read from the run's files (raises RegisterError when unusable)."""
    lake = Lake(cfg.lake_root)
    run = lake.run(run_id)
    try:
        summary, harvest = lake.read_train_summary(run_id), lake.read_harvest(run_id)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise RegisterError(f"{run.train_summary}: not a trainer summary ({fields})") from None
    except ValueError as exc:  # a harvest.json that is not a harvest's (the message names the file)
        raise RegisterError(str(exc)) from None
    if summary is None:
        raise RegisterError(f"{lake.path(run.train_summary)}: no trainer summary (did `train` run for {run_id}?)")
    ckpt = summary.checkpoint or str(cfg.models_dir / "runs" / run_id / "checkpoint")
    if not Path(ckpt).is_dir():
        raise RegisterError(f"{run.train_summary}: checkpoint folder {ckpt} does not exist")
    parent = summary.base_version
    window = f"{harvest.start}/{harvest.end}" if harvest else ""
    episodes = _count_rows(lake, run.episodes)
    if episodes is None:
        episodes = harvest.n_episodes if harvest else summary.episodes
    reward_hash = _reward_hash(lake, run.rewards) or ""

    verdicts = read_verdicts(lake, run_id)
    metrics = summary_metrics(summary) | card.reward_metrics(card.read_rewards(lake, run_id))
    if "eval" in verdicts:
        metrics |= card.eval_metrics(verdicts["eval"].details)
    tags = {
        "kind": "cycle",
        "run_id": run_id,
        "parent_version": parent,
        "data_window": window,
        "episodes": "" if episodes is None else int(episodes),
        "reward_config_hash": reward_hash,
        **{f"verdict.{name}": "passed" if v.passed else "failed" for name, v in verdicts.items()},
    }
    return {"checkpoint": Path(ckpt), "tags": tags, "metrics": metrics,
            "mlflow_run_id": summary.mlflow_run_id or None}


def _existing_run(cfg: Config, mlflow_run_id: str | None) -> str | None:
    """The trainer's MLflow run when it exists in this tracking store (else a new run is made)."""
    from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

    if not mlflow_run_id:
        return None
    try:
        store.client(cfg).get_run(mlflow_run_id)
    except MlflowException:
        return None
    return mlflow_run_id


def register_run(cfg: Config, run_id: str, tags: dict[str, str] | None = None) -> int:
    """The run's checkpoint as a new version of cfg.mlflow.model_name (or the version it already has), its
    episodes recorded as consumed. tags: more tags for the version and its MLflow run (e.g. the Airflow run);
    they never replace a lineage tag. Raises EpisodesConsumed when other runs already trained on them."""
    try:
        check_run_id(run_id)
    except IdError as exc:
        raise RegisterError(str(exc)) from None
    existing = find_version(cfg, run_id)
    if existing is not None:  # a rerun; it also records the episodes if a crash came between the two writes
        parent = store.get_version(cfg, existing).tags.get("parent_version")
        if parent:
            ledger.consume(cfg, run_id, existing, int(parent))
        return existing
    info = lineage(cfg, run_id)
    parent = int(info["tags"]["parent_version"])
    family = ledger.lineage_of(cfg, parent)
    if taken := ledger.consumed_by_others(cfg, run_id, family):
        raise ledger.EpisodesConsumed(run_id, family, taken)
    trainer_run = _existing_run(cfg, info["mlflow_run_id"])
    version = store.register_checkpoint(
        cfg,
        info["checkpoint"],
        run_name=run_id,
        tags={**(tags or {}), **info["tags"]},
        # the trainer's run already holds train/*; card.log_cycle adds reward/* and eval/* (not logged twice here)
        metrics={} if trainer_run else {k: v for k, v in info["metrics"].items() if k.startswith("train/")},
        run_id=trainer_run,
    )
    ledger.consume(cfg, run_id, version, parent)
    card.log_cycle(cfg, run_id, version)
    return version
