"""Who the simulated users are: a persona (how they talk and how long they put up with a bad answer) and an
organisation (its bearer token and its coding conventions).

Why personas: the reward signals differ by user. A patient user answers three clarifying questions, a terse one
answers one and types three-word requests, a picky one reverts an edit that passes the tests but breaks the
organisation's convention. Preferences (the org's convention, the one every user shares) are answer features
(features.py) set in `[simulate]`; users show them only through feedback the gateway records.
Seeded: the same seed gives the same users with the same personas.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rl_core.config import Config
from rl_core.features import Answer, feature


@dataclass(frozen=True)
class Persona:
    name: str
    patience: int  # clarifying questions / bad answers tolerated before giving up
    terse: bool  # types short lower-case requests
    checks_conventions: bool  # reverts edits that break the org's conventions
    thumbs_prob: float  # chance of leaving a thumbs rating at the end of a session
    persist_hours: tuple[float, float]  # how long a kept edit is observed before it counts as persisted
    politeness: str  # appended to requests


PERSONAS: dict[str, Persona] = {
    "patient": Persona("patient", 3, False, False, 0.5, (1.0, 3.0), " Thanks!"),
    "terse": Persona("terse", 1, True, False, 0.1, (0.5, 2.0), ""),
    "picky": Persona("picky", 2, False, True, 0.8, (2.0, 5.0), " Follow our conventions."),
}


@dataclass(frozen=True)
class Pref:
    """A wish about answers: feature (rl_core/features.py) present (want) or absent."""

    feature: str
    want: bool = True
    needs: str | None = None  # and only in an answer that has this feature too (code_block: no cut-off code)

    def holds(self, answer: Answer) -> bool:
        if self.needs and not feature(self.needs).check(answer):
            return False
        return feature(self.feature).check(answer) == self.want

    def complaint(self) -> str:
        f = feature(self.feature)
        return f.describe if self.want else f"do not {f.describe}"


def _pref(p: Pref | str | None) -> Pref | None:
    """A Pref from config, a bare feature name (wanted), or "none"/None."""
    if p is None or p == "none":
        return None
    return p if isinstance(p, Pref) else Pref(feature(p).name)


@dataclass(frozen=True)
class Org:
    """An organisation: its token (the gateway derives org_id from it), its convention, and the preference
    every user shares (`[simulate] preference`), both expressed only through recorded feedback."""

    org_id: str
    token: str
    convention: Pref | None = None  # also accepts a feature name ("type_hints") for convenience
    shared: Pref | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "convention", _pref(self.convention))
        object.__setattr__(self, "shared", _pref(self.shared))

    @property
    def prefs(self) -> list[Pref]:
        return [p for p in (self.shared, self.convention) if p is not None]

    def violations(self, source: str) -> list[str]:
        """Convention breaches of an edited file, as a reviewer would say them (empty when fine). Only a
        convention judged on code counts here: a picky user reverts the edit for it."""
        c = self.convention
        if c is None or not feature(c.feature).on_code or not source.strip():
            return []
        return [] if c.holds(Answer(f"```python\n{source}\n```")) else [c.complaint()]


def orgs_from_config(cfg: Config) -> list[Org]:
    """The simulated orgs (cfg.simulate.orgs), each with a token from cfg.serving.tokens that maps to it, its
    convention (cfg.simulate.conventions) and the shared preference (cfg.simulate.preference)."""
    by_org = {org: tok for tok, org in sorted(cfg.serving.tokens.items())}
    missing = [o for o in cfg.simulate.orgs if o not in by_org]
    if missing:
        raise ValueError(f"simulate.orgs {missing} have no bearer token in serving.tokens; add one per org")
    s = cfg.simulate
    shared = Pref(s.preference.feature, s.preference.want, s.preference.needs) if s.preference else None
    conv = {o: Pref(p.feature, p.want, p.needs) for o, p in s.conventions.items()}
    return [Org(o, by_org[o], conv.get(o), shared) for o in s.orgs]


@dataclass(frozen=True)
class User:
    user_id: str
    org: Org
    persona: Persona
    seed: int  # this user's own random stream: its run is reproducible whatever the other users do


def make_users(n: int, orgs: list[Org], seed: int) -> list[User]:
    """n users spread round-robin over orgs, personas drawn from the seed."""
    if n <= 0:
        raise ValueError(f"users must be > 0, got {n}")
    if not orgs:
        raise ValueError("at least one org is needed")
    rng = random.Random(seed)
    names = sorted(PERSONAS)
    users = []
    for i in range(n):
        org = orgs[i % len(orgs)]
        users.append(User(f"{org.org_id}-u{i:03d}", org, PERSONAS[rng.choice(names)], rng.randrange(2**31)))
    return users
