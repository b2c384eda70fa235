"""Every alias move: the one module that writes aliases (rtrl init, deploy, the A/B verdict, the monitors'
consequence, an operator's promote or rollback, an org adapter going live).

Each move is one MLflow alias write, recorded by store.set_alias / store.delete_alias as fixed-key
model-version tags (`alias.<alias>.set_at`, `.set_reason`, `.removed_at`, ...) and a line of the version's
description history, so the registry UI shows who held which alias, when and why. Orders are chosen so that a crash between two writes leaves a state that
serves correctly: promote points `champion` at the challenger first, then removes `challenger` (in
between both aliases name the same version, which serves the same weights). `expected=` guards against
acting on a stale decision (another deploy moved the alias since it was taken).

Every move first checks for alias drift (rl_core/registry/drift.py: aliases moved outside rtrl, in MLflow's
UI): a move that puts a version in front of users, or moves a drifted alias, is refused with AliasDrift until
an operator settles it (`rtrl registry --adopt` / `--revert`).

`restore_previous_champion` (`rtrl rollback`) orders the versions by their latest `alias.champion.set_at`
and moves `champion` to the last holder before the current one that was never rolled back (a version's
latest assignment is the only one that decides its place in that order). The serving
gateway polls the aliases (serving.alias_poll_s) and reloads, so it serves that version within one
poll interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_core.config import Config
from rl_core.ids import mlflow_filter_value
from rl_core.registry import drift, store
from rl_core.registry.adapters import LIVE_ALIAS, adapter_registry, live_adapter
from rl_core.reports import Verdict

ROLLED_BACK = "rolled_back"  # version tag: set when a version is removed from an alias by a rollback


class RegistryError(RuntimeError):
    """An alias move was refused (nothing to move, or the registry changed under the caller)."""


@dataclass
class AliasMove:
    stamp: str  # UTC, sortable (YYYY-mm-ddTHH:MM:SS.ffffffZ)
    alias: str
    version: int
    reason: str


def _all_versions(cfg: Config | store.Registry):
    c = store.client(cfg)
    return c.search_model_versions(f"name={mlflow_filter_value(store.Registry.of(cfg).model_name)}")


def history(cfg: Config | store.Registry, alias: str = "champion") -> list[AliasMove]:
    """Each version's latest assignment of `alias`, oldest first (its alias.<alias>.set_at version tag)."""
    moves = [
        AliasMove(tags[f"alias.{alias}.set_at"], alias, int(mv.version), tags.get(f"alias.{alias}.set_reason", ""))
        for mv in _all_versions(cfg)
        if f"alias.{alias}.set_at" in (tags := mv.tags or {})
    ]
    return sorted(moves, key=lambda m: (m.stamp, m.version))


def point(cfg: Config | store.Registry, alias: str, version: int, reason: str) -> None:
    """alias -> version (init's champion, deploy's challenger, an org's live adapter): recorded like every move."""
    drift.guard(cfg, f"setting {alias!r} to v{int(version)}")
    store.set_alias(cfg, alias, int(version), reason)


def take_off_tripped(cfg: Config, verdict: Verdict, dry_run: bool = False) -> str:
    """What a monitors trip means for traffic: a tripped version that is the live challenger is taken off
    (alias removed, tagged rolled_back), and so is a tripped org adapter that is its org's live one. Blocking
    descendants is not enough: it would keep serving its share, and its inflated reward could win the next
    A/B verdict. Returns what was done, in words."""
    if verdict.passed:
        return "nothing to take off traffic"
    done = []
    live = store.version_for_alias(cfg, "challenger")
    if live is not None and live in verdict.details.get("tripped", []):
        why = "; ".join(r for r in verdict.reasons if r.startswith(f"version {live}:"))
        if dry_run:
            done.append(f"dry run: challenger version {live} would be rolled back ({why})")
        else:
            drop_challenger(cfg, f"monitors tripped in {verdict.details.get('run_id', '?')}: {why}", expected=live)
            done.append(f"challenger version {live} rolled back (taken off traffic): {why}")
    for tripped in verdict.details.get("tripped_adapters", []):
        done += _take_off_adapter(cfg, verdict, tripped, dry_run)
    return "; ".join(done) or "nothing to take off traffic"


def _take_off_adapter(cfg: Config, verdict: Verdict, tripped: dict, dry_run: bool) -> list[str]:
    """The org's `live` alias removed when it still names the tripped adapter (tagged rolled_back)."""
    name, org = tripped["adapter_version"], tripped["org_id"]
    live = live_adapter(cfg, org)
    if live is None or live.adapter_version != name:
        return []  # no longer live: nothing serves it
    why = "; ".join(r for r in verdict.reasons if r.startswith(f"adapter {name} "))
    if dry_run:
        return [f"dry run: adapter {name} of {org} would be taken off traffic ({why})"]
    take_off_adapter(cfg, org, name, f"monitors tripped in {verdict.details.get('run_id', '?')}: {why}")
    return [f"adapter {name} of {org} taken off traffic (its base version serves the org): {why}"]


def take_off_adapter(cfg: Config, org_id: str, adapter_version: str, reason: str) -> int | None:
    """The org's `live` alias removed if it still names adapter_version (a monitors trip, an org A/B rollback), its
    version tagged rolled_back: the org's base version answers it again. Returns that version, None when the alias
    named another adapter (or none): nothing moves."""
    live = live_adapter(cfg, org_id)
    if live is None or live.adapter_version != adapter_version:
        return None
    areg = adapter_registry(cfg, org_id)
    drift.guard(areg, f"taking adapter {adapter_version} of {org_id} off traffic", moves=(LIVE_ALIAS,), adds=False)
    store.delete_alias(areg, LIVE_ALIAS, f"rollback: {reason}")
    _mark_rolled_back(areg, live.version, reason)
    return live.version


def _require(cfg: Config | store.Registry, alias: str, expected: int | None) -> int:
    held = store.version_for_alias(cfg, alias)
    if held is None:
        raise RegistryError(f"no version holds alias {alias!r}")
    if expected is not None and held != expected:
        raise RegistryError(f"alias {alias!r} is at version {held}, not the expected {expected}: refusing a stale move")
    return held


def promote(cfg: Config, reason: str, expected: int | None = None) -> int:
    """champion <- challenger, then the challenger alias is removed. Returns the new champion version."""
    drift.guard(cfg, "promote")
    version = _require(cfg, "challenger", expected)
    store.set_alias(cfg, "champion", version, f"promote: {reason}")
    store.delete_alias(cfg, "challenger", f"promoted to champion: {reason}")
    store.set_version_tags(cfg, version, {"promoted_at": store.stamp()})  # the reason: alias.champion.set_reason
    return version


def drop_challenger(cfg: Config, reason: str, expected: int | None = None) -> int:
    """Remove the challenger alias and tag its version rolled_back. Returns that version."""
    drift.guard(cfg, "dropping the challenger", moves=("challenger",), adds=False)
    version = _require(cfg, "challenger", expected)
    store.delete_alias(cfg, "challenger", f"rollback: {reason}")
    _mark_rolled_back(cfg, version, reason)
    return version


def _mark_rolled_back(cfg: Config | store.Registry, version: int, reason: str) -> None:
    store.set_version_tags(cfg, version, {ROLLED_BACK: "true", f"{ROLLED_BACK}_reason": reason})  # when: History
    store.append_history(cfg, version, f"rolled back: {reason}")


def rolled_back_versions(cfg: Config | store.Registry) -> set[int]:
    return {int(mv.version) for mv in _all_versions(cfg) if (mv.tags or {}).get(ROLLED_BACK) == "true"}


def previous_champion(cfg: Config) -> int | None:
    """The last champion before the current one that was never rolled back (None if there is none)."""
    current = store.version_for_alias(cfg, "champion")
    bad = rolled_back_versions(cfg)
    for move in reversed(history(cfg, "champion")):
        if move.version != current and move.version not in bad:
            return move.version
    return None


def restore_previous_champion(cfg: Config, reason: str) -> tuple[int, int]:
    """champion <- the previous champion; the demoted version is tagged rolled_back. Returns (from, to)."""
    drift.guard(cfg, "rollback")
    current = _require(cfg, "champion", None)
    target = previous_champion(cfg)
    if target is None:
        raise RegistryError(f"no previous champion recorded before version {current}: nothing to roll back to")
    store.set_alias(cfg, "champion", target, f"rollback from {current}: {reason}")
    _mark_rolled_back(cfg, current, reason)
    return current, target
