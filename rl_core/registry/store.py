"""MLflow as the model registry: checkpoint folders as versions of one registered model, aliases as pointers.

The embedded default is MLflow over SQLite (no server); production points tracking_uri at a server.
Stages are deprecated in MLflow 3: only aliases (`champion`, `challenger`) are used. Every alias move
sets fixed-key version tags (`alias.<alias>.set_at` / `.set_reason` / `.previous` / `.removed_at`: the latest
move, so tag lists stay short and filterable; the reasons of removals are in the history) and appends one line to
the version's description under "History", so the whole story is readable on the version's page. It also
records the move on the registered model as the tag `<alias>` = `v<N>` (`none` once removed): what the models
list shows for each alias (its own alias column shows only the highest version, so the champion hid behind
"+1"), and rtrl's record that rl_core/registry/drift.py compares with MLflow's aliases.

Experiments by purpose: checkpoints (training runs, the base, planted variants) in `mlflow.experiment`,
A/B analyses in `<experiment>-ab`, simulated learning experiments in `<experiment>-learning`, each cycle's
outcome in `<experiment>-cycles`; each is a classic ML experiment with the runs table's deciding columns as a
shared view (rl_core/registry/layout.py). A version's run is named `v<N>-<name>` (`v2-cycle-20261202T1000`,
`v1-base-<model>`), the version first because the runs table cuts long names.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from rl_core.config import Config
from rl_core.ids import mlflow_filter_value
from rl_core.registry import layout
from rl_core.schema import now_utc

CHECKPOINT_ARTIFACT = "checkpoint"
HISTORY = "**History**"  # the description's history section starts at this line (rl_core/registry/card.py writes above it)
PURPOSES = {"train": "", "ab": "-ab", "learning": "-learning", "cycles": "-cycles"}  # experiment name suffix per purpose


@dataclass(frozen=True)
class Registry:
    """The registry as one value: where it is (tracking URI, artifact root), the experiment, which registered model,
    and the local folder that caches downloaded checkpoints. Every function here takes one (or a Config, read
    once into one), so an org's adapters are the same registry under their own model name (`for_model`),
    not a copy of the whole config."""

    tracking_uri: str
    artifact_root: str  # resolved: a URL, or a local folder
    artifact_root_setting: str  # [mlflow] artifact_root as configured (unset on a server: the server places them)
    experiment: str
    model_name: str
    models_dir: Path

    @classmethod
    def of(cls, src: Config | Registry) -> Registry:
        if isinstance(src, Registry):
            return src
        return cls(src.tracking_uri, src.artifact_root, src.mlflow.artifact_root, src.mlflow.experiment,
                   src.mlflow.model_name, src.models_dir)

    def for_model(self, model_name: str) -> Registry:
        return replace(self, model_name=model_name)


def client(cfg: Config | Registry | Registry):
    """An MlflowClient on the registry's tracking/registry URI (the folder for SQLite is created)."""
    import mlflow  # lazy: heavy (mlflow)
    from mlflow import MlflowClient

    uri = Registry.of(cfg).tracking_uri
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the home, usually
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def experiment_id(cfg: Config | Registry, purpose: str = "train") -> str:
    """The id of the experiment for purpose (PURPOSES), created with artifacts under the artifact root.
    On a tracking server (http) with no URL configured as the root, the server places the artifacts (its
    --artifacts-destination, proxied: workers and the gateway need no credentials for the store); a local
    folder there would be a path on whichever worker registered the checkpoint, which no other machine sees."""
    reg = Registry.of(cfg)
    c = client(reg)
    name = reg.experiment + PURPOSES[purpose]
    tags = layout.experiment_tags(purpose)
    exp = c.get_experiment_by_name(name)
    if exp is not None:  # one made before these tags existed gets them once
        for k, v in tags.items():
            if (exp.tags or {}).get(k) != v:
                c.set_experiment_tag(exp.experiment_id, k, v)
        return exp.experiment_id
    if reg.tracking_uri.startswith(("http://", "https://")) and "://" not in reg.artifact_root_setting:
        return c.create_experiment(name, tags=tags)
    root = reg.artifact_root
    if "://" not in root:
        Path(root).mkdir(parents=True, exist_ok=True)
        root = Path(root).resolve().as_uri()
    return c.create_experiment(name, artifact_location=f"{root}/{name}", tags=tags)


def ensure_registered_model(cfg: Config | Registry, description: str = "rtrl policy checkpoints") -> None:
    from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

    c = client(cfg)
    try:
        c.get_registered_model(Registry.of(cfg).model_name)
    except MlflowException:
        c.create_registered_model(Registry.of(cfg).model_name, description=description)


def register_checkpoint(
    cfg: Config | Registry,
    ckpt_dir: str | Path,
    *,
    run_name: str,
    tags: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    run_id: str | None = None,
) -> int:
    """Log the folder as artifacts of an MLflow run (a new one unless run_id) and make it a new version.

    Returns the version number. Tags go on both the run and the version, so the UI can compare runs and
    the registry page shows lineage. The run is then named `v<N>-<run_name>`.
    """
    import mlflow  # lazy: heavy (mlflow)

    c = client(cfg)
    exp = experiment_id(cfg)
    tags = {k: str(v) for k, v in (tags or {}).items()}
    if run_id is None:
        run = c.create_run(exp, run_name=run_name, tags=tags)
        run_id = run.info.run_id
    else:
        for k, v in tags.items():
            c.set_tag(run_id, k, v)
    for k, v in (params or {}).items():
        c.log_param(run_id, k, v)
    for k, v in (metrics or {}).items():
        c.log_metric(run_id, k, float(v))
    c.log_artifacts(run_id, str(ckpt_dir), CHECKPOINT_ARTIFACT)
    c.set_terminated(run_id)
    ensure_registered_model(cfg)
    artifact_uri = mlflow.get_run(run_id).info.artifact_uri
    mv = c.create_model_version(
        Registry.of(cfg).model_name, source=f"{artifact_uri}/{CHECKPOINT_ARTIFACT}", run_id=run_id, tags=tags
    )
    c.update_run(run_id, name=version_run_name(int(mv.version), run_name))
    return int(mv.version)


def version_run_name(version: int, name: str) -> str:
    """`v<N>-<name>`: the one name format of a version's run (the version first: the runs table cuts names)."""
    return name if name.startswith(f"v{version}-") else f"v{version}-{name}"


def stamp() -> str:
    """Now, UTC, sortable (the value of the `*_at` tags and the history lines)."""
    return now_utc().strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def append_history(cfg: Config | Registry, version: int, line: str, once: bool = False) -> None:
    """Append `- <time> <line>` to the version's description, under its History section (with once: unless the
    history has that line already, so a retried task does not repeat it)."""
    c = client(cfg)
    name = Registry.of(cfg).model_name
    text = c.get_model_version(name, str(version)).description or ""
    if once and any(old.endswith(f" {line}") for old in text.splitlines()):
        return
    if HISTORY not in text:
        text = f"{text.rstrip()}\n\n{HISTORY}\n" if text.strip() else f"{HISTORY}\n"
    c.update_model_version(name, str(version), description=f"{text.rstrip()}\n- {stamp()} {line}\n")


def set_version_tags(cfg: Config | Registry, version: int, tags: dict[str, Any]) -> None:
    c = client(cfg)
    for k, v in tags.items():
        c.set_model_version_tag(Registry.of(cfg).model_name, str(version), k, str(v)[:4000])


def set_alias(cfg: Config | Registry, alias: str, version: int, reason: str) -> None:
    """Point alias at version and record the move (time, reason, previous holder) on both versions and on the
    registered model (the tag `<alias>`)."""
    c = client(cfg)
    name = Registry.of(cfg).model_name
    previous = version_for_alias(cfg, alias)
    c.set_registered_model_alias(name, alias, str(version))
    record_move(cfg, alias, version)
    at = stamp()
    set_version_tags(cfg, version, {f"alias.{alias}.set_at": at, f"alias.{alias}.set_reason": reason})
    append_history(cfg, version, f"`{alias}` set: {reason}")
    if previous is not None and previous != version:
        set_version_tags(cfg, version, {f"alias.{alias}.previous": previous})
        set_version_tags(cfg, previous, {f"alias.{alias}.removed_at": at})
        append_history(cfg, previous, f"`{alias}` moved to version {version}: {reason}")


def delete_alias(cfg: Config | Registry, alias: str, reason: str) -> int | None:
    """Remove an alias; returns the version that held it (None if none did)."""
    c = client(cfg)
    name = Registry.of(cfg).model_name
    held = version_for_alias(cfg, alias)
    if held is None:
        return None
    c.delete_registered_model_alias(name, alias)
    record_move(cfg, alias, None)
    set_version_tags(cfg, held, {f"alias.{alias}.removed_at": stamp()})
    append_history(cfg, held, f"`{alias}` removed: {reason}")
    return held


NO_HOLDER = "none"  # the record's value once rtrl removed the alias


def record_move(cfg: Config | Registry, alias: str, version: int | None) -> None:
    """rtrl's record of its latest move of alias: the registered model's tag `<alias>` = `v<N>` (or `none`)."""
    value = NO_HOLDER if version is None else f"v{int(version)}"
    client(cfg).set_registered_model_tag(Registry.of(cfg).model_name, alias, value)


def recorded_aliases(cfg: Config | Registry) -> dict[str, int | None] | None:
    """rtrl's record of its latest move of each alias it ever moved (None as the version once it removed it);
    None when the model has no record at all (made before moves were recorded, or not yet registered)."""
    from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

    try:
        tags = client(cfg).get_registered_model(Registry.of(cfg).model_name).tags or {}
    except MlflowException:
        return None
    out: dict[str, int | None] = {}
    for key, value in tags.items():
        if value == NO_HOLDER:
            out[key] = None
        elif value.startswith("v") and value[1:].isdigit():
            out[key] = int(value[1:])
    return out or None


def version_for_alias(cfg: Config | Registry, alias: str) -> int | None:
    from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

    try:
        mv = client(cfg).get_model_version_by_alias(Registry.of(cfg).model_name, alias)
    except MlflowException:
        return None
    return int(mv.version)


def aliases(cfg: Config | Registry) -> dict[str, int]:
    from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

    try:
        rm = client(cfg).get_registered_model(Registry.of(cfg).model_name)
    except MlflowException:
        return {}
    return {a: int(v) for a, v in (rm.aliases or {}).items()}


def known_versions(cfg: Config | Registry) -> list[int]:
    """Every version number of the registered model, ascending (empty before `rtrl init`)."""
    found = client(cfg).search_model_versions(f"name={mlflow_filter_value(Registry.of(cfg).model_name)}")
    return sorted(int(v.version) for v in found)


def get_version(cfg: Config | Registry, version: int):
    return client(cfg).get_model_version(Registry.of(cfg).model_name, str(version))


def checkpoint_path(cfg: Config | Registry, version: int) -> Path:
    """A local folder holding the version's HF checkpoint (the artifact folder itself when it is local)."""
    mv = get_version(cfg, version)
    src = mv.source
    parsed = urlparse(src)
    if parsed.scheme == "file":
        local = Path(unquote(parsed.path))
        if local.is_dir():
            return local
    if parsed.scheme == "" and Path(src).is_dir():
        return Path(src)
    import mlflow  # lazy: heavy (mlflow)

    reg = Registry.of(cfg)  # per model: an adapter's v1 is not the policy's v1
    dst = reg.models_dir / "cache" / reg.model_name / f"v{version}"
    if (dst / "config.json").is_file():
        return dst
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    got = Path(mlflow.artifacts.download_artifacts(artifact_uri=src, dst_path=str(tmp)))
    os.replace(got if got != tmp else tmp, dst)
    return dst
