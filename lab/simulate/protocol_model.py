"""A protocol file's model (the `[protocol]` table of experiments/*/*.toml) and its checks at load time.

Every field a protocol added after the first ones has a default that reproduces what protocols did before it:
an old protocol file loads to the same effective settings and runs as it did (tests/test_protocol_heldout.py).
The later fields, by what they change:
  held-out requests (lab/simulate/heldout.py): bank, heldout, split_seed, new_users, baseline, measure_users,
  measure_interactions;
  raters (lab/simulate/raters.py): rate_share, flip;
  the primary test `edit_persisted_rate` and the non-inferiority guards (lab/simulate/outcomes.py):
  noninferior, guard_test (with guard_tolerance, which the replay guard has had since it was added);
  an org protocol measured live with a control arm ([orgs] ab_share < 1; lab/simulate/org_live.py) may set
  guard too (each org's adapter arm against its base arm).
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lab.simulate.experiment import preferred_features
from lab.simulate.heldout import Design, load_named_bank, split_bank
from lab.simulate.outcomes import OUTCOME_METRICS
from rl_core.config import load_config
from rl_core.features import FEATURES


class Protocol(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    question: str
    registered: str  # the date it was written, before any run it reports
    seeds: list[int] = Field(min_length=1)
    cycles: int = Field(2, ge=2)
    interactions: int = Field(gt=0)
    users: int = Field(gt=1)
    challenger_share: float = Field(1.0, gt=0, le=1)
    train_from: Literal["champion", "latest"] = "latest"
    measure_last: bool = True
    dag: Literal["cycle", "orgs"] = "cycle"  # what trains between cycles: the policy, or the org adapters
    feature: str  # the preferred feature whose rate must move (checked against the config's preferences)
    choice: str = ""  # how the feature was chosen (from the census, before any update), in words
    # the DiDs: lab/simulate/org_protocol.py; edit_persisted_rate: each user's rate of edits persisting,
    # measured cycle - first, paired t 95% CI (lab/simulate/outcomes.py); feature_rate: each user's rate of
    # answers with `feature`, measured from the answers themselves (not through sparse ratings), paired t 95% CI
    primary: Literal["mean_reward", "feature_did", "replay_did", "edit_persisted_rate", "feature_rate"] = "mean_reward"
    # live: the last cycle is measured on live simulated traffic; replay (orgs only): instead of a last live
    # cycle, the trained cycle's requests are replayed to the base version and to each org's adapter,
    # replay_samples times each (lab/simulate/replay.py)
    measure: Literal["live", "replay"] = "live"
    replay_samples: int = Field(4, ge=1, le=32)
    guard: str | None = None  # replay: a feature no adapter may lose (each org's mean change above -guard_tolerance)
    guard_tolerance: float = Field(0.05, gt=0, le=1)
    # how a guard is judged: "point" (the mean change above -guard_tolerance; the old protocols') or
    # "noninferiority" (the 95% CI's bound on the bad side within guard_tolerance)
    guard_test: Literal["point", "noninferiority"] = "point"
    # per-user metrics that must not get worse by more than guard_tolerance, as non-inferiority tests on the
    # paired CI (outcomes.OUTCOME_METRICS or an answer feature); each is a check `noninferior_<name>`
    noninferior: list[str] = []
    # held-out requests (heldout.py): the task bank users ask ("": the simulator's own; "{repo}/bench/band": the
    # band tasks), the share of it held out of every trained cycle and served only in the measured one, the
    # split's seed (None: the run's seed), new users in the measured cycle, and a baseline cycle in which v1
    # serves the measured cycle's requests before anything trains (nothing trains on it)
    bank: str = ""
    heldout: float = Field(0.0, ge=0, lt=1)
    split_seed: int | None = None
    new_users: bool = False
    baseline: bool = False
    # the baseline and measured cycles' size, when more requests are measured than trained on (heldout.py): users
    # (the trained cycle's users first, then users the update never saw) and interactions; None: `users`,
    # `interactions` (every cycle the same size, as before)
    measure_users: int | None = Field(None, gt=1)
    measure_interactions: int | None = Field(None, gt=0)
    # raters (raters.py): the chance a user rates an answer at all, and that a rating is flipped
    rate_share: float = Field(1.0, gt=0, le=1)
    flip: float = Field(0.0, ge=0, lt=0.5)
    success: str  # the rule, in words, as registered
    max_minutes: float | None = None  # each seed's run must end within this (a check: within_minutes)
    min_seeds_excluding_zero: int = Field(2, ge=0)  # orgs: see org_protocol.pooled_orgs
    # orgs: how seeds pool: "users" (every seed's users as one sample) or "seeds_random" (each seed's DiD, the seed
    # a random effect: org_protocol.random_effects)
    pool: Literal["users", "seeds_random"] = "users"
    config: dict[str, dict] = {}  # rtrl.toml sections -> keys: applied to every run as RTRL_<S>__<K>

    @property
    def design(self) -> Design:
        """The held-out design and the raters, as heldout.plans reads them."""
        return Design(self.bank, self.heldout, self.new_users, self.baseline, self.rate_share, self.flip,
                      self.split_seed, self.measure_users, self.measure_interactions)

    @property
    def held_out(self) -> bool:
        """Does the measured cycle serve anything the update never saw (tasks or users)?"""
        return self.heldout > 0 or self.new_users


def load_protocol(path: Path) -> Protocol:
    """The protocol at path, validated; its config overrides are validated by the Config model too."""
    try:
        proto = Protocol(**tomllib.loads(path.read_text())["protocol"])
    except (KeyError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: not a protocol file (a [protocol] table is needed): {exc}") from None
    cfg = load_config(environ={**os.environ, **env_of(proto, proto.seeds[0])})
    prefs = preferred_features(cfg)
    if proto.feature not in prefs:
        raise ValueError(f"{path}: protocol.feature {proto.feature!r} is not a preference of its config ({prefs})")
    wants = {p.want for p in cfg.simulate.conventions.values() if p.feature == proto.feature}
    if proto.dag == "orgs" and wants != {True, False}:
        raise ValueError(f"{path}: an orgs protocol needs one org that wants {proto.feature!r} and one that rejects it")
    if (proto.measure == "replay") != (proto.primary == "replay_did") or (
            proto.measure == "replay" and (proto.dag != "orgs" or proto.cycles != 2)):
        raise ValueError(f"{path}: protocol.measure = \"replay\" goes with primary = \"replay_did\", dag = \"orgs\" "
                         "and cycles = 2 (cycle 1 live and trained, cycle 2 the replay)")
    # a guard compares each org's adapter with its base: on the replay, or live with a control arm ([orgs] ab_share)
    arm = proto.measure == "replay" or (proto.dag == "orgs" and cfg.orgs.ab_share < 1)
    if proto.guard is not None and (not arm or proto.guard not in FEATURES):
        raise ValueError(f"{path}: protocol.guard {proto.guard!r} needs measure = \"replay\" (or dag = \"orgs\", "
                         f"measure = \"live\" and [orgs] ab_share < 1: a control arm) and a known answer feature "
                         f"({', '.join(sorted(FEATURES))})")
    check_design(path, proto, cfg.simulate.tasks, sorted({*cfg.simulate.orgs}))
    return proto


def check_design(path: Path, proto: Protocol, task_ids: list[str], orgs: list[str]) -> None:
    """The later fields' rules (module docstring): what goes with what, and a bank that loads and splits."""
    def bad(msg: str) -> ValueError:
        return ValueError(f"{path}: {msg}")

    custom = proto.held_out or proto.baseline or bool(proto.bank)
    if custom and (proto.measure != "live" or not proto.measure_last):
        raise bad("protocol.bank, heldout, new_users and baseline need measure = \"live\" and measure_last = true "
                  "(the held-out requests are served only in the measured last cycle)")
    sized = proto.measure_users is not None or proto.measure_interactions is not None
    if sized and not (proto.baseline and proto.held_out):
        raise bad("protocol.measure_users and measure_interactions size the baseline and measured cycles: they need "
                  "baseline = true and heldout > 0 or new_users = true")
    if proto.measure_users is not None and proto.measure_users < proto.users:
        raise bad(f"protocol.measure_users {proto.measure_users} < users {proto.users}: the measured cycles serve the "
                  "trained cycle's users and more, never fewer")
    if proto.new_users and not proto.baseline:
        raise bad("protocol.new_users needs baseline = true: new users have no earlier cycle to be paired with, "
                  "so v1 serves them in the baseline cycle")
    if proto.baseline and not proto.held_out:
        raise bad("protocol.baseline needs heldout > 0 or new_users = true (it serves v1 the measured requests)")
    if proto.primary in ("edit_persisted_rate", "feature_rate") and (proto.dag != "cycle" or proto.measure != "live"):
        raise bad(f"protocol.primary = \"{proto.primary}\" needs dag = \"cycle\" and measure = \"live\"")
    unknown = [m for m in proto.noninferior if m not in OUTCOME_METRICS and m not in FEATURES]
    if unknown or (proto.noninferior and proto.measure != "live"):
        raise bad(f"protocol.noninferior {unknown or proto.noninferior}: each must be one of "
                  f"{', '.join(OUTCOME_METRICS)} or an answer feature, with measure = \"live\"")
    if proto.guard_test == "noninferiority" and proto.guard is None:
        raise bad("protocol.guard_test = \"noninferiority\" judges protocol.guard, which is not set")
    if not custom:
        return
    try:
        bank = load_named_bank(proto.bank, task_ids)
    except ValueError as exc:  # TaskError included: names the file, line and field
        raise bad(f"protocol.bank {proto.bank!r}: {exc}") from None
    split = split_bank(bank, proto.heldout, proto.seeds[0] if proto.split_seed is None else proto.split_seed)
    for org in orgs:
        for part, tasks in (("training", split.train), ("held-out", split.heldout if proto.heldout > 0 else bank)):
            if not any(t.org in (None, org) for t in tasks):
                raise bad(f"protocol.heldout {proto.heldout}: the {part} part of {proto.bank or 'the bank'} has no "
                          f"task for the users of {org}")


def env_of(proto: Protocol, seed: int) -> dict[str, str]:
    """The environment a seed's run is configured by (the config overrides, the seed, the experiment's sizes)."""
    env = {f"RTRL_{sec.upper()}__{key.upper()}": v if isinstance(v, str) else json.dumps(v)
           for sec, keys in proto.config.items() for key, v in keys.items()}
    return env | {"RTRL_SIMULATE__SEED": str(seed), "RTRL_SIMULATE__USERS": str(proto.users),
                  "RTRL_SERVING__CHALLENGER_SHARE": str(proto.challenger_share)}
