"""What a simulated user says and does after each assistant turn, as feedback events on a simulated clock.

Why a clock: real outcomes arrive late (an edit counts as persisted only after it survived hours). The
simulator stamps each event with ts = response time + a simulated delay, so the lake holds the same shape
of data as production while no test waits hours. Why fixed phrases: the reward pipeline's follow-up
classifier must see realistic satisfied/dissatisfied text; impatience grows with every question asked.
Feedback ids are uuid5 of (event, kind, n): posting the same session twice stores each event once.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from lab.simulate.personas import Persona

NAMESPACE = uuid.UUID("5b0c7d5e-7a53-4f1e-9d7b-2f7f6c1e9a01")

CLARIFY_ANSWERS = (
    "{answer}.",
    "As I said, {answer}. Please just do it.",
    "I already told you: {answer}. Stop asking and fix it!",
    "Again: {answer}. Why is this so hard?",
)
FAILED = (
    "That's wrong, the tests still fail: {error}",
    "No, this doesn't work. {error}",
    "Still broken, that didn't fix it: {error}",
)
EVASIVE = (
    "That doesn't answer my question. Please just change the code.",
    "I asked you to fix the code, not to explain. Useless.",
    "That's not helpful, can you actually edit the file?",
)
CONVENTION = "Reverted: please follow our conventions, {what}."
BROKEN_TOOL = "Your tool call was broken ({error}), nothing happened. Try again."
GIVE_UP = ("Forget it, I'll do it myself.", "Never mind, this is a waste of time.")
THANKS = ("Thanks, that works.", "Great, tests pass now.", "Perfect, thank you!")


@dataclass
class Feedback:
    """One feedback event as POSTed to /v1/feedback (org comes from the bearer token, never from here)."""

    event_id: str
    kind: str
    ts: datetime
    value_bool: bool | None = None
    value_float: float | None = None
    text: str | None = None
    n: int = 0  # disambiguates two events of one kind on one turn
    feedback_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.feedback_id = str(uuid.uuid5(NAMESPACE, f"{self.event_id}/{self.kind}/{self.n}"))

    def body(self) -> dict[str, Any]:
        out = {"feedback_id": self.feedback_id, "event_id": self.event_id, "kind": self.kind,
               "ts": self.ts.isoformat()}
        for k in ("value_bool", "value_float", "text"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


def clarify_answer(answer: str, times_asked: int) -> str:
    """The answer to the model's n-th clarifying question (0-based), more impatient each time."""
    return CLARIFY_ANSWERS[min(times_asked, len(CLARIFY_ANSWERS) - 1)].format(answer=answer.rstrip("."))


def edit_feedback(event_id: str, t: datetime, *, passed: bool, violations: list[str], error: str,
                  persona: Persona, rng: random.Random) -> tuple[list[Feedback], str | None]:
    """An applied edit: persisted after hours when tests pass (and conventions hold for a picky user),
    else reverted within minutes. Returns the events and the user's follow-up text (None when happy)."""
    events = [Feedback(event_id, "edit_applied", t + timedelta(seconds=rng.uniform(2, 20)))]
    if passed and not (persona.checks_conventions and violations):
        hours = round(rng.uniform(*persona.persist_hours), 3)
        events.append(Feedback(event_id, "edit_persisted", t + timedelta(hours=hours), value_float=hours))
        return events, None
    events.append(Feedback(event_id, "edit_reverted", t + timedelta(minutes=rng.uniform(1, 30))))
    if passed:  # tests pass, conventions broken
        text = CONVENTION.format(what="; ".join(violations))
    else:
        text = rng.choice(FAILED).format(error=_short(error) or "it fails")
    return events, text


def preference(event_id: str, t: datetime, liked: bool, n: int) -> Feedback:
    """A thumbs on one answer for one preference the user holds: up when the answer has what they want.
    n >= 1 (n 0 is the session-end rating), so each preference is its own event."""
    return Feedback(event_id, "thumbs", t + timedelta(seconds=30 + n), value_bool=liked, n=n)


def tool_result(event_id: str, t: datetime, ok: bool, n: int, error: str = "") -> Feedback:
    return Feedback(event_id, "tool_result", t + timedelta(milliseconds=200 + 50 * n), value_bool=ok,
                    text=None if ok else _short(error), n=n)


def followup(event_id: str, t: datetime, text: str, rng: random.Random) -> Feedback:
    """The user's next message, recorded as feedback on the turn it answers (design.md, feedback kinds)."""
    return Feedback(event_id, "followup_message", t + timedelta(seconds=rng.uniform(5, 90)), text=text)


def session_end(event_id: str, t: datetime, *, success: bool, persona: Persona,
                rng: random.Random) -> list[Feedback]:
    """End of a session: maybe a thumbs rating (up iff it worked), then session_end."""
    events = []
    if rng.random() < persona.thumbs_prob:
        events.append(Feedback(event_id, "thumbs", t + timedelta(minutes=1), value_bool=success))
    events.append(Feedback(event_id, "session_end", t + timedelta(minutes=2), value_bool=success))
    return events


def _short(error: str, limit: int = 160) -> str:
    lines = [x for x in (error or "").strip().splitlines() if x.strip()]
    return (lines[-1] if lines else "")[:limit]
