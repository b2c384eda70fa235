"""Simulated users in-process: the feedback a session leaves, personas, conventions, bounds, reproducibility.

The assistant here is a scripted policy of the Chat protocol (hacks.scripted_text: the reference fix, a
broken call, a clarifying question, a wrong edit); hidden tests really run in the evals sandbox.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from evals.judge import judge
from lab.simulate import feedback as fb
from lab.simulate.bank import load_bank, tasks_for
from lab.simulate.hacks import scripted_text, task_of
from lab.simulate.personas import PERSONAS, Org, User, make_users
from lab.simulate.runner import SimSpec, budgets, check_loopback, simulate
from lab.simulate.users import TEST_LIMITS, Reply, run_session
from rl_core import toolcalls

BANK = load_bank()
ACME = Org("org-acme", "rtrl-acme-token", "type_hints")
GLOBEX = Org("org-globex", "rtrl-globex-token", "docstrings")


def task(tid):
    return next(t for t in BANK if t.id == tid)


class Scripted:
    """A Chat that answers with a fixed behaviour; event ids are deterministic from the seed it is given."""

    def __init__(self, behaviour: str, bank=BANK):
        self.behaviour, self.bank, self.calls, self.active, self.max_active = behaviour, bank, 0, 0, 0
        self.lock = threading.Lock()

    def __call__(self, user, session_id, turn, messages, tools, seed):
        with self.lock:
            self.calls += 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            t = task_of(messages, self.bank)
            if self.behaviour == "wrong":  # rewrites the file unchanged: tests still fail
                path, content = next(iter(t.task.files.items()))
                text = toolcalls.render_tool_call({"name": "write_file", "arguments": {"path": path, "content": content}})
            elif self.behaviour == "evasive":
                text = "You should look at the function and fix the logic."
            else:
                text = scripted_text(self.behaviour, t)
            content, calls = toolcalls.parse(text)
            time.sleep(0.01)
            return Reply(str(uuid.UUID(int=random.Random(seed).getrandbits(128))), content, calls, 10.0, 1)
        finally:
            with self.lock:
                self.active -= 1


class Sink:
    def __init__(self):
        self.events: list[fb.Feedback] = []
        self.lock = threading.Lock()

    def __call__(self, user, events):
        with self.lock:
            self.events += events

    def kinds(self):
        return [e.kind for e in self.events]


def session(behaviour, tid, persona="patient", org=ACME, seed=1, max_turns=4):
    user = User("u1", org, PERSONAS[persona], seed)
    sink = Sink()
    res = run_session(user, task(tid), Scripted(behaviour), sink, budget=10, max_turns=max_turns,
                      rng=random.Random(seed))
    return res, sink


def test_bank_is_separate_solvable_and_unsolved():
    assert len(BANK) >= 30 and len({t.id for t in BANK}) == len(BANK)
    assert {t.hard for t in BANK} == {True, False} and {t.org for t in BANK} >= {None, "org-acme", "org-globex"}

    def check(t):
        before = judge(dict(t.task.files), t.task.hidden_tests, TEST_LIMITS)
        after = judge(dict(t.task.files) | t.task.solution, t.task.hidden_tests, TEST_LIMITS)
        return t.id, before.passed, after.passed, after.summary

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(check, BANK))
    assert [r for r in results if r[1]] == [], "a task already passes before any edit"
    assert [r for r in results if not r[2]] == [], "a reference solution fails its hidden tests"


def test_passing_edit_persists_after_a_simulated_delay():
    res, sink = session("oracle", "sim-add", persona="patient", org=GLOBEX)
    assert res.success and res.interactions == 1 and res.outcomes == {"edit_passed": 1}
    by_kind = {e.kind: e for e in sink.events}
    assert {"tool_result", "edit_applied", "edit_persisted", "session_end"} <= set(by_kind)
    assert by_kind["tool_result"].value_bool is True
    hours = by_kind["edit_persisted"].value_float
    lo, hi = PERSONAS["patient"].persist_hours
    assert lo <= hours <= hi
    assert (by_kind["edit_persisted"].ts - by_kind["edit_applied"].ts).total_seconds() > 0.9 * hours * 3600
    assert "edit_reverted" not in by_kind and "followup_message" not in by_kind


def test_failing_edit_is_reverted_with_a_dissatisfied_followup_until_the_user_gives_up():
    res, sink = session("wrong", "sim-mul", persona="picky", org=GLOBEX)
    patience = PERSONAS["picky"].patience
    assert not res.success and res.interactions == patience + 1
    assert sink.kinds().count("edit_reverted") == patience + 1 and "edit_persisted" not in sink.kinds()
    texts = [e.text for e in sink.events if e.kind == "followup_message"]
    assert any("tests still fail" in x or "doesn't work" in x or "Still broken" in x for x in texts[:-1])
    assert texts[-1] in fb.GIVE_UP
    end = [e for e in sink.events if e.kind == "session_end"]
    assert len(end) == 1 and end[0].value_bool is False


def test_broken_tool_call_gets_a_tool_error():
    res, sink = session("broken_on_hard", "sim-fizzbuzz", persona="terse")
    assert res.outcomes.get("broken_tool") == res.interactions >= 1
    errs = [e for e in sink.events if e.kind == "tool_result"]
    assert errs and all(e.value_bool is False and "not valid JSON" in e.text for e in errs)
    assert "edit_applied" not in sink.kinds()
    # the same variant is honest on an easy task
    res, _ = session("broken_on_hard", "sim-add", persona="terse", org=GLOBEX)
    assert res.success


def test_clarifying_questions_get_answers_with_growing_impatience():
    res, sink = session("clarifier", "sim-amb-speed", persona="patient", max_turns=6)
    texts = [e.text for e in sink.events if e.kind == "followup_message"]
    patience = PERSONAS["patient"].patience
    assert res.outcomes == {"clarifying": patience + 1}
    assert texts[0].startswith("total in cart.py should add up all the prices")
    assert "As I said" in texts[1] and "Stop asking" in texts[2]
    assert texts[-1] in fb.GIVE_UP
    # a terse user answers once at most, then leaves
    res, sink = session("clarifier", "sim-amb-speed", persona="terse")
    assert res.interactions == PERSONAS["terse"].patience + 1


def test_picky_user_reverts_an_edit_that_breaks_the_org_convention():
    res, sink = session("oracle", "sim-add", persona="picky", org=ACME)  # the fix has no type hints
    assert res.outcomes.get("edit_convention", 0) >= 1 and not res.success
    text = next(e.text for e in sink.events if e.kind == "followup_message")
    assert "type hints" in text and "add" in text
    res, _ = session("oracle", "sim-acme-area", persona="picky", org=ACME)  # acme's own task has hints
    assert res.success
    res, _ = session("oracle", "sim-add", persona="patient", org=ACME)  # only picky users check
    assert res.success
    assert GLOBEX.violations("def f():\n    return 1\n") == ["add docstrings"]


def test_evasive_answer_is_dissatisfying():
    res, sink = session("evasive", "sim-add", persona="patient")
    texts = [e.text for e in sink.events if e.kind == "followup_message"]
    assert res.outcomes == {"evasive": PERSONAS["patient"].patience + 1}
    assert texts[0] in fb.EVASIVE


def test_feedback_bodies_validate_against_the_contract():
    from rl_core.schema import FeedbackEvent

    _, sink = session("wrong", "sim-mul", persona="patient")
    for e in sink.events:
        FeedbackEvent.model_validate({**e.body(), "org_id": "org-acme"})
    assert len({e.feedback_id for e in sink.events}) == len(sink.events)


def run_sim(cfg, behaviour="oracle", **over):
    spec = SimSpec.from_config(cfg, **({"users": 4, "interactions": 12, "rate": 500.0, "concurrency": 2} | over))
    chat, sink = Scripted(behaviour), Sink()
    report = simulate(cfg, spec=spec, chat=chat, post=sink, progress=False)
    return report, chat, sink


def test_simulation_is_seeded_and_reproducible(cfg):
    def signature(sink):
        return sorted((e.event_id, e.kind, e.text, e.value_bool, e.value_float) for e in sink.events)

    r1, _, s1 = run_sim(cfg, "broken_on_hard", seed=7)
    r2, _, s2 = run_sim(cfg, "broken_on_hard", seed=7, concurrency=3)
    r3, _, s3 = run_sim(cfg, "broken_on_hard", seed=8)
    assert r1.interactions == r2.interactions == 12 and r1.errors == 0
    assert signature(s1) == signature(s2)
    assert signature(s1) != signature(s3)


def test_runner_respects_count_rate_concurrency_and_time(cfg):
    report, chat, _ = run_sim(cfg, "clarifier", users=5, interactions=17, rate=40.0, concurrency=2)
    assert report.interactions == chat.calls <= 17 and chat.max_active <= 2
    report, chat, _ = run_sim(cfg, "clarifier", users=2, interactions=10, rate=1000.0, concurrency=1)
    assert chat.calls == 10
    t0 = time.monotonic()
    report, chat, _ = run_sim(cfg, "clarifier", users=2, interactions=1000, rate=20.0, max_seconds=1.0)
    assert time.monotonic() - t0 < 5 and report.stopped_by == "time" and chat.calls < 1000
    assert budgets(make_users(3, [ACME], 0), 10) == [4, 3, 3]


def test_rate_limit_holds_with_the_gateway_chat(cfg):
    from lab.simulate.runner import RateLimiter

    lim = RateLimiter(50.0)
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: lim.acquire(), range(26)))
    assert time.monotonic() - t0 >= 25 / 50 * 0.95


def test_bad_input_is_refused_naming_the_field(cfg):
    with pytest.raises(ValueError, match="users"):
        SimSpec.from_config(cfg, users=0)
    with pytest.raises(ValueError, match="rate"):
        SimSpec.from_config(cfg, rate=0.0)
    with pytest.raises(ValueError, match="loopback"):
        check_loopback("http://10.1.2.3:8000")
    check_loopback("http://127.0.0.1:9")
    check_loopback("http://localhost:9")
    with pytest.raises(ValueError, match="base_url"):
        simulate(cfg, None, progress=False)
    assert tasks_for(BANK, "org-acme") and not [t for t in tasks_for(BANK, "org-acme") if t.org == "org-globex"]


def test_request_attaches_the_task_files_as_fenced_code_then_asks():
    from lab.simulate.users import request_text

    t = task("sim-add")
    for persona in ("patient", "terse"):
        u = User("u1", GLOBEX, PERSONAS[persona], 0)
        text = request_text(u, t)
        assert text.startswith("mathx.py:\n```python\ndef add(a, b):\n    return a - b\n```\n")
        assert t.task.prompt.lower().rstrip(".!") in text.lower().split("```")[-1]
        assert task_of([{"role": "user", "content": text}], BANK).id == "sim-add"


def test_simulate_tasks_limits_what_users_ask_and_names_a_bad_id(cfg):
    """`simulate.tasks` (the probe's learnable band): users ask only those; an unknown id or an org left with
    nothing to ask is a clear error before any request."""
    shared = [t.id for t in BANK if t.org is None][:2]
    cfg.simulate.tasks = shared
    chat, sink = Scripted("oracle"), Sink()
    seen: list[str] = []
    inner = chat.__call__

    def recording(user, sid, turn, messages, tools, seed):
        seen.append(task_of(messages, BANK).id)
        return inner(user, sid, turn, messages, tools, seed)

    spec = SimSpec.from_config(cfg, users=4, interactions=12, rate=500.0, concurrency=2)
    report = simulate(cfg, spec=spec, chat=recording, post=sink, progress=False)
    assert report.interactions == 12 and set(seen) <= set(shared) and seen
    cfg.simulate.tasks = [*shared, "no-such-task"]
    with pytest.raises(ValueError, match=r"simulate.tasks: unknown task id\(s\) \['no-such-task'\]"):
        simulate(cfg, spec=spec, chat=recording, post=sink, progress=False)
    cfg.simulate.tasks = [next(t.id for t in BANK if t.org == "org-acme")]
    with pytest.raises(ValueError, match=r"simulate.tasks: no task left for the users of \['org-globex'\]"):
        simulate(cfg, spec=spec, chat=recording, post=sink, progress=False)


def test_a_recorded_session_keeps_one_record_per_request_that_matches_its_feedback():
    user = User("u1", GLOBEX, PERSONAS["picky"], 3)
    for behaviour, tid in (("wrong", "sim-mul"), ("oracle", "sim-add")):
        sink = Sink()
        res = run_session(user, task(tid), Scripted(behaviour), sink, budget=10, max_turns=4, rng=random.Random(3),
                          record=True)
        assert [r["turn"] for r in res.requests] == list(range(res.interactions))
        by_event = {e.event_id: [] for e in sink.events}
        for e in sink.events:
            by_event[e.event_id].append(e)
        for r in res.requests:
            kinds = {e.kind for e in by_event[r["event_id"]]}
            assert r["edit_persisted"] == ("edit_persisted" in kinds) and r["edit_reverted"] == ("edit_reverted" in kinds)
            assert bool(r["followup"]) == ("followup_message" in kinds) and r["task_id"] == tid
            assert r["thumbs"] == [e.value_bool for e in by_event[r["event_id"]] if e.kind == "thumbs"]
        assert all(r["dissatisfied"] for r in res.requests if r["outcome"] == "edit_failed")
    plain = run_session(user, task("sim-add"), Scripted("oracle"), Sink(), budget=10, max_turns=4, rng=random.Random(3))
    assert plain.requests == [] and plain.interactions  # no plan, no records (a load test keeps none)
