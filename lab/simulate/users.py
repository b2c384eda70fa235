"""One simulated user session: ask for a task, run the assistant's tool calls on a working copy, judge any edit
with the task's hidden tests in the sandbox, and post what a real user's actions would leave behind.

Why through the real HTTP API: the simulator must exercise exactly what production does (auth, routing by
user, event ids in headers, durable logging), so it talks to the gateway with the official `openai` SDK as
model `auto` and posts feedback to /v1/feedback. The chat call is a small protocol (`Chat`) so the planted
reward-hack policies (hacks.py) can answer instead of the served model while everything else stays the same.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from evals import sandbox
from evals.judge import judge
from evals.tools import Workspace, openai_tools
from lab.simulate import feedback as fb
from lab.simulate.bank import SimTask
from lab.simulate.personas import User
from lab.simulate.raters import Rated, Rater
from rl_core import toolcalls
from rl_core.features import CODE_BLOCK_RE, Answer, features_of
from rl_core.rewards.followup import dissatisfied
from rl_core.schema import now_utc

TEST_LIMITS = sandbox.Limits(timeout_s=5.0, memory_mb=512)
OUTCOMES = ("edit_passed", "edit_failed", "edit_convention", "broken_tool", "clarifying", "evasive", "tool_only")


@dataclass
class Reply:
    event_id: str
    text: str
    tool_calls: list[dict[str, Any]]
    latency_ms: float
    model_version: int | None = None
    adapter_version: str | None = None  # the org adapter that answered (x-rtrl-adapter-version), None: no adapter


class Chat(Protocol):
    def __call__(self, user: User, session_id: str, turn: int, messages: list[dict], tools: list[dict],
                 seed: int) -> Reply: ...


class Feedbacks(Protocol):
    def __call__(self, user: User, events: list[fb.Feedback]) -> None: ...


@dataclass
class SessionResult:
    user_id: str
    task_id: str
    session_id: str
    interactions: int = 0
    success: bool = False
    outcomes: dict[str, int] = field(default_factory=dict)
    feedback: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)  # one record per request (request_record)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def is_clarifying(text: str) -> bool:
    """A turn that asks instead of acting, as a user hears it: a short question without code. Looser than the
    rewards' regex classifier on purpose: users answer any question; the reward decides what it was."""
    t = text.strip()
    return bool(t) and "?" in t and "```" not in t and len(t) < 600


def request_text(user: User, task: SimTask) -> str:
    """How this user phrases the task (terse users drop punctuation and politeness), after the task's files,
    which the IDE attaches as fenced code blocks (as Cursor attaches open files). Measured on SmolLM2-135M:
    with the files attached this way it fixes some easy tasks; without them it never sees the code."""
    if user.persona.terse:
        ask = task.task.prompt.lower().rstrip(".!")
    else:
        ask = task.task.prompt[0].upper() + task.task.prompt[1:] + "." + user.persona.politeness
    files = [f"{path}:\n```python\n{text.rstrip()}\n```\n" for path, text in sorted(task.task.files.items())]
    return "".join(files) + ask


def request_record(user: User, task: SimTask, sid: str, turn: int, reply: Reply, outcome: str,
                   followup: str | None, rated: Rated) -> dict:
    """What one request came to, as the user saw it (the protocol's raw per-request outcomes): the outcome, the
    edit kept (persisted) or reverted, the follow-up and whether the rewards' lexicon calls it dissatisfied (as
    `rtrl ab` does), the thumbs sent (after the rater) and what the rater dropped or flipped, the latency, the
    version and the org adapter (None: none) that answered and the answer's features."""
    return {"event_id": reply.event_id, "user_id": user.user_id, "task_id": task.id, "session_id": sid,
            "turn": turn, "outcome": outcome, "edit_persisted": outcome == "edit_passed",
            "edit_reverted": outcome in ("edit_failed", "edit_convention"), "followup": followup,
            "dissatisfied": bool(followup) and bool(dissatisfied(pa.array([followup]))[0].as_py()),
            "thumbs": list(rated.given), "thumbs_dropped": rated.dropped, "thumbs_flipped": rated.flipped,
            "latency_ms": round(reply.latency_ms, 1), "model_version": reply.model_version,
            "adapter_version": reply.adapter_version,
            "features": sorted(k for k, v in features_of(reply.text, reply.tool_calls).items() if v)}


def run_session(user: User, task: SimTask, chat: Chat, post: Feedbacks, *, budget: int, max_turns: int,
                rng: random.Random, deadline: float | None = None, rater: Rater | None = None,
                record: bool = False) -> SessionResult:
    """Drive one session until success, the user gives up, max_turns or the interaction budget is spent.
    rater: the user's explicit ratings pass through it (raters.py; None: every rating, as meant).
    record: keep each request's record in res.requests (an experiment's cycle; not a load test's millions)."""
    sid = str(uuid.UUID(int=rng.getrandbits(128)))
    res = SessionResult(user.user_id, task.id, sid)
    tools = openai_tools(task.task.tools)
    messages: list[dict] = [{"role": "user", "content": request_text(user, task)}]
    strikes, asked = 0, 0
    root = Path(tempfile.mkdtemp(prefix="rtrl-sim-"))
    last: Reply | None = None
    last_t = now_utc()
    try:
        ws = Workspace(root, dict(task.task.files), list(task.task.tools), TEST_LIMITS)
        for turn in range(max_turns):
            if res.interactions >= budget or (deadline is not None and time.monotonic() > deadline):
                break
            reply = chat(user, sid, turn, messages, tools, rng.randrange(2**31))
            last, last_t = reply, now_utc()
            res.interactions += 1
            res.latencies_ms.append(reply.latency_ms)
            if reply.model_version is not None:
                res.versions.append(reply.model_version)
            events, outcome, say, tool_msgs = react(user, task, ws, reply, last_t, rng, asked)
            events, rated = rater.rate(events) if rater else (events, _given(events))
            res.count(outcome)
            asked += outcome == "clarifying"
            res.success = outcome == "edit_passed"
            strikes += outcome not in ("edit_passed", "tool_only")
            messages.append({"role": "assistant", "content": reply.text,
                             **({"tool_calls": reply.tool_calls} if reply.tool_calls else {})})
            messages += tool_msgs
            gave_up = strikes > user.persona.patience
            text = None
            if say is not None or gave_up:
                text = rng.choice(fb.GIVE_UP) if gave_up else say
                events.append(fb.followup(reply.event_id, last_t, text, rng))
                messages.append({"role": "user", "content": text})
            if record:
                res.requests.append(request_record(user, task, sid, turn, reply, outcome, text, rated))
            post(user, events)
            res.feedback += len(events)
            if res.success or gave_up:
                break
        if last is not None:
            end = fb.session_end(last.event_id, last_t + timedelta(seconds=1), success=res.success,
                                 persona=user.persona, rng=rng)
            end, rated = rater.rate(end) if rater else (end, _given(end))
            if res.requests:
                _add_rating(res.requests[-1], rated)
            post(user, end)
            res.feedback += len(end)
        return res
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _given(events: list[fb.Feedback]) -> Rated:
    """The thumbs of events as sent, with no rater in between."""
    return Rated([bool(e.value_bool) for e in events if e.kind == "thumbs"])


def _add_rating(record: dict, rated: Rated) -> None:
    """The session's closing rating counts on the request it rates (the last one)."""
    record["thumbs"] += rated.given
    record["thumbs_dropped"] += rated.dropped
    record["thumbs_flipped"] += rated.flipped


def react(user: User, task: SimTask, ws: Workspace, reply: Reply, t: datetime, rng: random.Random,
          asked: int) -> tuple[list[fb.Feedback], str, str | None, list[dict]]:
    """(feedback events, outcome, the user's next message or None, tool messages) for one assistant turn: how this
    user judges a reply (also bench/task_probe.py's judge, so the probe and the simulator never disagree).
    A user who holds preferences (the shared one, the org's convention) also rates the answer by each: a
    thumbs up when it has what they want, down when not. No random draw: seeded sessions stay as they were."""
    events, outcome, say, tool_msgs = _judge(user, task, ws, reply, t, rng, asked)
    answer = Answer(reply.text, reply.tool_calls)
    rated = [fb.preference(reply.event_id, t, p.holds(answer), n) for n, p in enumerate(user.org.prefs, start=1)]
    return events + rated, outcome, say, tool_msgs


def _judge(user: User, task: SimTask, ws: Workspace, reply: Reply, t: datetime, rng: random.Random,
           asked: int) -> tuple[list[fb.Feedback], str, str | None, list[dict]]:
    """The task's verdict on one turn: tool results, the edit applied and tested, or what the user says."""
    events: list[fb.Feedback] = []
    tool_msgs: list[dict] = []
    edited, broken = False, []
    for n, call in enumerate(reply.tool_calls):
        name, args = call["function"]["name"], call["function"].get("arguments") or "{}"
        result = ws.execute(name, args) if name != toolcalls.INVALID else None
        content = result.content if result else f"error: the tool call is not valid JSON: {args[:80]}"
        events.append(fb.tool_result(reply.event_id, t, bool(result and result.ok), n, error=content))
        tool_msgs.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": content})
        if result is None or not result.valid:
            broken.append(content)
        elif name in ("write_file", "apply_patch") and result.ok:
            edited = True
    if not edited and not reply.tool_calls:
        code = CODE_BLOCK_RE.search(reply.text)
        if code:  # the user pastes the answer's code over the file it is about
            ws.execute("write_file", json.dumps({"path": task.target, "content": code.group(1)}))
            edited = True
    if edited:
        files = ws.snapshot()
        run = judge(files, task.task.hidden_tests, TEST_LIMITS)
        violations = user.org.violations(files.get(task.target, ""))
        more, say = fb.edit_feedback(reply.event_id, t, passed=run.passed, violations=violations,
                                     error=run.summary, persona=user.persona, rng=rng)
        outcome = "edit_passed" if say is None else ("edit_convention" if run.passed else "edit_failed")
        return events + more, outcome, say, tool_msgs
    if broken:
        return events, "broken_tool", fb.BROKEN_TOOL.format(error=broken[0][:120]), tool_msgs
    if reply.tool_calls:
        return events, "tool_only", None, tool_msgs  # read/run_tests: the assistant continues next turn
    if is_clarifying(reply.text):
        return events, "clarifying", fb.clarify_answer(task.answer, asked), tool_msgs
    return events, "evasive", rng.choice(fb.EVASIVE), tool_msgs
