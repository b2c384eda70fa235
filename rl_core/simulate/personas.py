"""Who the simulated users are: a persona (how they talk and how long they put up with a bad answer) and an
organisation (its bearer token and its coding conventions).

Why personas: the reward signals differ by user. A patient user answers three clarifying questions, a terse one
answers one and types three-word requests, a picky one reverts an edit that passes the tests but breaks the
organisation's conventions. Seeded: the same seed gives the same users with the same personas.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass


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
class Org:
    """An organisation: its token (the gateway derives org_id from it) and the convention it enforces."""

    org_id: str
    token: str
    convention: str  # "type_hints" | "docstrings" | "none"

    def violations(self, source: str) -> list[str]:
        """Convention breaches of an edited file, as sentences a reviewer would write (empty when fine)."""
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return []  # a syntax error is the tests' business, not the style reviewer's
        out = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            if self.convention == "type_hints" and (node.returns is None or any(a.annotation is None for a in node.args.args)):
                out.append(f"{node.name} has no type hints")
            if self.convention == "docstrings" and ast.get_docstring(node) is None:
                out.append(f"{node.name} has no docstring")
        return out


CONVENTIONS = {"org-acme": "type_hints", "org-globex": "docstrings"}


def orgs_from_config(cfg) -> list[Org]:
    """The simulated orgs (cfg.simulate.orgs), each with a token from cfg.serving.tokens that maps to it."""
    by_org = {org: tok for tok, org in sorted(cfg.serving.tokens.items())}
    missing = [o for o in cfg.simulate.orgs if o not in by_org]
    if missing:
        raise ValueError(f"simulate.orgs {missing} have no bearer token in serving.tokens; add one per org")
    return [Org(o, by_org[o], CONVENTIONS.get(o, "none")) for o in cfg.simulate.orgs]


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
