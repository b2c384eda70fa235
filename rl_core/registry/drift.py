"""Alias moves made outside rtrl: found, recorded, and refused until an operator settles them.

Why: MLflow's UI moves aliases without rtrl (the alias pencil on a version, "Promote model"), skipping the gates,
the history and the rollback chain; the serving gateway follows the aliases within one poll, so such a move
serves users at once. rtrl records each move it makes (rl_core/registry/store.record_move: the registered
model's tag `<alias>` = `v<N>`, `none` once removed); `check` compares that record with MLflow's aliases.

A difference is drift. `check` records it where an operator looks: the registered model's tag
`drift.<alias>` (`expected v3, found v5 since <time>`), a line in the holding version's History, and one
warning in the log (logger `rl_core.registry.drift`) naming alias, expected and actual version; `rtrl registry`
prints it and the cycle's outcome line carries it. A drift that disappears (the alias moved back) has its tag
removed. A model with aliases but no record at all (registered before rtrl recorded its moves) has its current
aliases recorded once, as they are.

Policy: refuse, do not adopt. While an alias has drifted, rtrl refuses every move that puts a version in front
of users (deploy's challenger, promote, a rollback to the previous champion, any `point`) and every move of the
drifted alias itself; removing a challenger that did not drift (the monitors' take-off, an A/B rollback) still
goes through, since it only takes a model off traffic. Adopting silently would make an ungated version part of
rtrl's lineage and rollback chain; reverting silently would fight an operator who moved it in an emergency. The
operator settles it with `rtrl registry --adopt` (record MLflow's aliases as rtrl's, with a History line) or
`rtrl registry --revert` (move them back to rtrl's record, each move recorded like any other).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rl_core.config import Config
from rl_core.registry import store

log = logging.getLogger(__name__)
DRIFT_TAG = "drift.{alias}"


@dataclass(frozen=True)
class Drift:
    alias: str
    expected: int | None  # rtrl's last recorded move (None: rtrl removed it, or never set it)
    actual: int | None  # what MLflow's alias says now (None: the alias is gone)

    def describe(self) -> str:
        exp = "no holder" if self.expected is None else f"v{self.expected}"
        act = "no holder (alias deleted)" if self.actual is None else f"v{self.actual}"
        return f"alias {self.alias!r} moved outside rtrl: expected {exp}, found {act}"


class AliasDrift(RuntimeError):
    """An alias move refused because aliases were moved outside rtrl (the message says how to settle it)."""

    def __init__(self, action: str, drifts: list[Drift]):
        self.drifts = drifts
        super().__init__(f"{action} refused: " + "; ".join(d.describe() for d in drifts)
                         + " (settle it with `rtrl registry --adopt` or `rtrl registry --revert`)")


def _fmt(v: int | None) -> str:
    return store.NO_HOLDER if v is None else f"v{v}"


def differences(cfg: Config | store.Registry) -> list[Drift]:
    """MLflow's aliases against rtrl's record (pure read; adopts a model that has no record yet)."""
    actual: dict[str, int | None] = dict(store.aliases(cfg))
    recorded = store.recorded_aliases(cfg)
    if recorded is None:
        for alias, version in actual.items():
            store.record_move(cfg, alias, version)
        if actual:
            log.info("no record of alias moves on %s yet: recorded the current aliases %s", store.Registry.of(cfg).model_name,
                     {a: f"v{v}" for a, v in actual.items()})
        return []
    found = [Drift(a, recorded.get(a), actual.get(a)) for a in sorted(set(recorded) | set(actual))]
    return [d for d in found if d.expected != d.actual]


def check(cfg: Config | store.Registry) -> list[Drift]:
    """Find drift and record it (tag, History line, log warning) once per distinct drift; clear settled ones."""
    drifts = differences(cfg)
    c, name = store.client(cfg), store.Registry.of(cfg).model_name
    tags = _model_tags(cfg)
    drifted = {d.alias for d in drifts}
    for key in [k for k in tags if k.startswith("drift.") and k.removeprefix("drift.") not in drifted]:
        c.delete_registered_model_tag(name, key)
        log.info("alias drift settled: %s (%s)", key.removeprefix("drift."), tags[key])
    for d in drifts:
        key = DRIFT_TAG.format(alias=d.alias)
        seen = f"expected {_fmt(d.expected)}, found {_fmt(d.actual)}"
        if tags.get(key, "").startswith(seen):
            continue  # recorded already: one warning and one History line per drift, not one per check
        c.set_registered_model_tag(name, key, f"{seen} since {store.stamp()}")
        log.warning("ALIAS DRIFT on %s: %s", name, d.describe())
        if d.actual is not None:
            store.append_history(cfg, d.actual, f"`{d.alias}` set outside rtrl (rtrl's record: "
                                                f"{_fmt(d.expected)}); rtrl refuses alias moves until it is settled")
    return drifts


def _model_tags(cfg: Config | store.Registry) -> dict[str, str]:
    from mlflow.exceptions import MlflowException  # lazy: heavy (mlflow)

    try:
        return dict(store.client(cfg).get_registered_model(store.Registry.of(cfg).model_name).tags or {})
    except MlflowException:  # no model yet (before `rtrl init`)
        return {}


def recorded_drift(cfg: Config | store.Registry) -> dict[str, str]:
    """The drift tags as `check` last wrote them: alias -> `expected vA, found vB since <time>`."""
    return {k.removeprefix("drift."): v for k, v in _model_tags(cfg).items() if k.startswith("drift.")}


def guard(cfg: Config | store.Registry, action: str, moves: tuple[str, ...] = (), adds: bool = True) -> None:
    """Raise AliasDrift when rtrl must not make this move: any drift when it `adds` a version to traffic, else a
    drift of one of the aliases it `moves`."""
    drifts = check(cfg)
    blocking = drifts if adds else [d for d in drifts if d.alias in moves]
    if blocking:
        raise AliasDrift(action, blocking)


def adopt(cfg: Config | store.Registry, reason: str) -> list[Drift]:
    """Record MLflow's current aliases as rtrl's (each drifted version's History says so); returns what was adopted."""
    drifts = differences(cfg)
    for d in drifts:
        store.record_move(cfg, d.alias, d.actual)
        held = d.actual if d.actual is not None else d.expected
        if held is not None:
            store.append_history(cfg, held, f"`{d.alias}` outside move adopted ({_fmt(d.expected)} -> "
                                            f"{_fmt(d.actual)}): {reason}")
        log.warning("alias drift adopted on %s: %s (%s)", store.Registry.of(cfg).model_name, d.describe(), reason)
    check(cfg)  # clears the drift tags
    return drifts


def revert(cfg: Config | store.Registry, reason: str) -> list[Drift]:
    """Move each drifted alias back to rtrl's record, recorded like any rtrl move; returns what was reverted."""
    drifts = differences(cfg)
    for d in drifts:
        why = f"revert outside move ({_fmt(d.actual)} -> {_fmt(d.expected)}): {reason}"
        if d.expected is None:
            store.delete_alias(cfg, d.alias, why)
        else:
            store.set_alias(cfg, d.alias, d.expected, why)
        log.warning("alias drift reverted on %s: %s (%s)", store.Registry.of(cfg).model_name, d.describe(), reason)
    check(cfg)
    return drifts
