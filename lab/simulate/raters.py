"""Sparse, noisy raters: a simulated user rates only some answers, and sometimes rates one the wrong way.

Why: a user who thumbs every answer by the very detector that scores the outcome (rl_core/features.py)
is a perfect rater, and a learning claim built on perfect raters says little about real ones, who rate few
answers and not always as they meant. So each explicit rating (a `thumbs` event: a preference's, the
session's) passes through the user's rater: an answer is rated at all with probability `rate_share` (all its
thumbs together: the user rates the answer or does not), and each rating given is flipped with probability
`flip`. The implicit signals (an edit kept or reverted, a dissatisfied follow-up) are what the user did, and
pass untouched.

Seeded per user (its own stream, apart from the session's): a run repeats whatever order the users' threads
run in, and the session's own random draws are the same with or without noise. rate_share 1 and flip 0 (the
defaults) draw nothing: every rating passes, as before raters were noisy.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from lab.simulate import feedback as fb


@dataclass
class Rated:
    """What the rater did to one answer's thumbs: the values sent, and how many it dropped and flipped."""

    given: list[bool] = field(default_factory=list)
    dropped: int = 0
    flipped: int = 0


class Rater:
    """One user's rater: rate(events) keeps or drops an answer's thumbs together, then flips each kept one."""

    def __init__(self, rate_share: float = 1.0, flip: float = 0.0, seed: int | str = 0):
        if not 0 < rate_share <= 1:
            raise ValueError(f"rate_share must be in (0, 1], got {rate_share!r}")
        if not 0 <= flip < 0.5:
            raise ValueError(f"flip must be in [0, 0.5), got {flip!r} (at 0.5 a rating says nothing)")
        self.rate_share, self.flip = rate_share, flip
        self.rng = random.Random(f"rater/{seed}")  # a str seed: the same stream on every run and platform

    @property
    def exact(self) -> bool:
        """Rates every answer and never errs (no random draw at all)."""
        return self.rate_share >= 1 and self.flip <= 0

    def rates(self) -> bool:
        """Does the user rate this answer at all?"""
        return self.rate_share >= 1 or self.rng.random() < self.rate_share

    def flips(self) -> bool:
        """Is this rating the opposite of what the user meant?"""
        return self.flip > 0 and self.rng.random() < self.flip

    def rate(self, events: list[fb.Feedback]) -> tuple[list[fb.Feedback], Rated]:
        """The events with this answer's thumbs kept or dropped (together) and each kept one maybe flipped."""
        out = Rated()
        thumbs = [e for e in events if e.kind == "thumbs"]
        if not thumbs:
            return events, out
        if not self.rates():
            out.dropped = len(thumbs)
            return [e for e in events if e.kind != "thumbs"], out
        kept = []
        for e in events:
            if e.kind == "thumbs" and self.flips():
                e = dataclasses.replace(e, value_bool=not e.value_bool)  # the same feedback_id: same event
                out.flipped += 1
            if e.kind == "thumbs":
                out.given.append(bool(e.value_bool))
            kept.append(e)
        return kept, out


def rater_for(user_seed: int, rate_share: float = 1.0, flip: float = 0.0) -> Rater:
    """The rater of the user whose seed is user_seed (personas.User.seed)."""
    return Rater(rate_share, flip, user_seed)
