"""Sparse, noisy raters (lab/simulate/raters.py): the configured shares over many draws, the same draws for
the same user seed, nothing drawn by an exact rater, and in a whole simulation only the thumbs change."""

from __future__ import annotations

import random
import threading
import uuid
from datetime import UTC, datetime

import pytest

from lab.simulate import feedback as fb
from lab.simulate import heldout
from lab.simulate.bank import load_bank
from lab.simulate.hacks import scripted_text, task_of
from lab.simulate.raters import Rater, rater_for
from lab.simulate.runner import SimSpec, simulate
from lab.simulate.users import Reply
from rl_core import toolcalls

BANK = load_bank()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _answer(n: int) -> list[fb.Feedback]:
    """One answer's events: a tool result and two preference thumbs (one up, one down)."""
    e = f"e{n}"
    return [fb.tool_result(e, T0, True, 0), fb.preference(e, T0, True, 1), fb.preference(e, T0, False, 2)]


def test_rate_share_and_flip_give_the_configured_shares_over_many_answers():
    r = Rater(rate_share=0.3, flip=0.15, seed=11)
    rated = flipped = given = kept_other = 0
    n = 20_000
    for i in range(n):
        events, out = r.rate(_answer(i))
        kept_other += sum(e.kind == "tool_result" for e in events)
        rated += bool(out.given)
        given += len(out.given)
        flipped += out.flipped
        assert out.dropped in (0, 2) and (out.dropped == 2) == (not out.given)  # an answer's thumbs go together
        assert len(out.given) == sum(e.kind == "thumbs" for e in events)
    assert kept_other == n  # implicit signals always pass
    assert rated / n == pytest.approx(0.3, abs=0.015)  # SE ~0.003
    assert flipped / given == pytest.approx(0.15, abs=0.015)


def test_a_flipped_rating_is_the_same_event_with_the_opposite_value():
    r = Rater(rate_share=1.0, flip=0.49, seed=3)
    for i in range(200):
        events = _answer(i)
        out, rated = r.rate(events)
        if rated.flipped:
            break
    before = {e.feedback_id: e.value_bool for e in events if e.kind == "thumbs"}
    after = {e.feedback_id: e.value_bool for e in out if e.kind == "thumbs"}
    assert set(before) == set(after)  # same ids: a replayed post stores each rating once
    assert sum(before[k] != after[k] for k in before) == rated.flipped >= 1


def test_the_same_user_seed_rates_the_same_answers_and_an_exact_rater_draws_nothing():
    def run(seed: int) -> list[tuple]:
        r = rater_for(seed, 0.3, 0.15)
        return [(tuple(o.given), o.dropped, o.flipped) for o in (r.rate(_answer(i))[1] for i in range(300))]

    assert run(5) == run(5) and run(5) != run(6)
    exact = Rater()
    state = exact.rng.getstate()
    events = _answer(0)
    out, rated = exact.rate(events)
    assert out == events and rated.given == [True, False] and exact.rng.getstate() == state and exact.exact
    for bad in ({"rate_share": 0.0}, {"rate_share": 1.5}, {"flip": 0.5}, {"flip": -0.1}):
        with pytest.raises(ValueError):
            Rater(**bad)


class _Mixed:
    """A Chat that fixes the task (oracle) or writes a code block that fails it, by the seed's parity."""

    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self, user, session_id, turn, messages, tools, seed):
        t = task_of(messages, BANK)
        text = scripted_text("oracle", t) if seed % 2 else "```python\ndef nothing():\n    pass\n```"
        content, calls = toolcalls.parse(text)
        return Reply(str(uuid.UUID(int=random.Random(seed).getrandbits(128))), content, calls, 7.0, 1)


def _sim(cfg, plan: heldout.CyclePlan | None):
    posted: list[fb.Feedback] = []
    lock = threading.Lock()

    def post(user, events):
        with lock:
            posted.extend(events)

    spec = SimSpec.from_config(cfg, users=6, interactions=30, rate=1000.0, concurrency=2, seed=4)
    with heldout.planned(plan):
        report = simulate(cfg, spec=spec, chat=_Mixed(), post=post, progress=False)
    return report, posted


def test_noisy_raters_in_a_simulation_change_only_the_thumbs_and_every_request_is_recorded(cfg):
    from rl_core.config import Preference

    cfg.simulate.preference = Preference(feature="code_block", want=True)
    exact_plan, noisy_plan = heldout.CyclePlan(), heldout.CyclePlan(rate_share=0.3, flip=0.15)
    exact, exact_events = _sim(cfg, exact_plan)
    noisy, noisy_events = _sim(cfg, noisy_plan)
    _, again = _sim(cfg, heldout.CyclePlan(rate_share=0.3, flip=0.15))

    def sig(events, kinds):
        return sorted((e.feedback_id, e.kind, e.text, e.value_bool) for e in events if e.kind in kinds)

    others = {"tool_result", "edit_applied", "edit_persisted", "edit_reverted", "followup_message", "session_end"}
    assert sig(exact_events, others) == sig(noisy_events, others)  # the sessions are the same sessions
    assert sig(noisy_events, {"thumbs"}) == sig(again, {"thumbs"})  # and the noise repeats
    assert len(sig(noisy_events, {"thumbs"})) < len(sig(exact_events, {"thumbs"}))
    assert len(exact_plan.records) == exact.interactions == 30 == len(noisy_plan.records)
    rec = noisy_plan.records
    assert {r["event_id"] for r in rec} == {r["event_id"] for r in exact_plan.records}
    assert sum(r["thumbs_dropped"] for r in rec) > 0 and all(r["thumbs_dropped"] == 0 for r in exact_plan.records)
    assert {r["outcome"] for r in rec} >= {"edit_passed", "edit_failed"}
    failed = [r for r in rec if r["outcome"] == "edit_failed"]
    assert all(r["edit_reverted"] and not r["edit_persisted"] and r["followup"] for r in failed)
    assert any(r["dissatisfied"] for r in failed)  # "tests still fail": the rewards' lexicon says so
    assert all(r["edit_persisted"] and not r["followup"] for r in rec if r["outcome"] == "edit_passed")
    assert all(not r["heldout"] for r in rec)
