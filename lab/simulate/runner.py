"""The bounded simulation run: N users, at most M interactions, at most R requests/s, C at a time, T seconds.

Why bounded in every direction: the simulator doubles as a load generator, so it must never run away
(count, time), never hammer the gateway beyond a rate, and never leave the machine (loopback URLs only).
Each user gets a fixed share of the interaction budget and its own seeded random stream, so a run is
reproducible whatever order the threads happen to run in.
"""

from __future__ import annotations

import ipaddress
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlparse

from lab.airflow import airflow_env
from lab.simulate import feedback as fb
from lab.simulate import heldout
from lab.simulate.bank import SimTask, load_bank, select, tasks_for
from lab.simulate.personas import User, make_users, orgs_from_config
from lab.simulate.raters import rater_for
from lab.simulate.users import OUTCOMES, Chat, Feedbacks, Reply, SessionResult, run_session
from rl_core.config import Config
from rl_core.runtime.procs import exit_on_sigterm, stop
from rl_core.serving import gateway as gw


@dataclass(frozen=True)
class SimSpec:
    users: int
    interactions: int
    rate: float  # requests per second, at most
    concurrency: int
    max_seconds: float
    seed: int
    max_turns: int = 4
    max_tokens: int = 96
    temperature: float = 0.8

    def __post_init__(self) -> None:
        for name in ("users", "interactions", "concurrency", "max_turns", "max_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"simulate.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("rate", "max_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"simulate.{name} must be > 0, got {getattr(self, name)!r}")

    @classmethod
    def from_config(cls, cfg: Config, **over) -> SimSpec:
        s = cfg.simulate
        base = dict(users=s.users, interactions=s.interactions, rate=s.rate, concurrency=s.concurrency,
                    max_seconds=s.max_seconds, seed=s.seed, max_turns=s.max_turns, max_tokens=s.max_tokens,
                    temperature=s.temperature)
        base.update({k: v for k, v in over.items() if v is not None})
        return cls(**base)


@dataclass
class SimReport:
    interactions: int = 0
    sessions: int = 0
    successes: int = 0
    feedback: int = 0
    errors: int = 0
    error_examples: list[str] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    versions: dict[int, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    stopped_by: str = "budget"  # budget | time
    requests: list[dict] = field(default_factory=list)  # inside a plan: every request's record (users.request_record)

    def add(self, r: SessionResult) -> None:
        self.interactions += r.interactions
        self.sessions += 1
        self.successes += r.success
        self.feedback += r.feedback
        self.latencies_ms += r.latencies_ms
        for k, v in r.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v
        for v in r.versions:
            self.versions[v] = self.versions.get(v, 0) + 1
        self.requests += r.requests

    def table(self) -> str:
        lat = sorted(self.latencies_ms) or [0.0]
        rows = [("interactions", self.interactions), ("sessions", self.sessions),
                ("sessions solved", self.successes), ("feedback events", self.feedback),
                ("errors", self.errors), ("elapsed s", f"{self.elapsed_s:.1f}"),
                ("requests/s", f"{self.interactions / max(self.elapsed_s, 1e-9):.2f}"),
                ("latency p50 ms", f"{lat[len(lat) // 2]:.0f}"), ("latency p90 ms", f"{lat[int(len(lat) * 0.9)]:.0f}"),
                ("stopped by", self.stopped_by)]
        rows += [(f"turns: {k}", v) for k, v in self.outcomes.items()]
        rows += [(f"served by version {v}", n) for v, n in sorted(self.versions.items())]
        return "| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def check_loopback(base_url: str) -> None:
    """Refuse any URL that does not resolve to this machine only (the simulator never leaves it)."""
    host = urlparse(base_url).hostname
    if not host:
        raise ValueError(f"base_url {base_url!r} has no host")
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise ValueError(f"base_url {base_url!r}: cannot resolve {host}: {exc}") from None
    bad = sorted(a for a in addrs if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if bad:
        raise ValueError(f"base_url {base_url!r} resolves to {bad}: the simulator only talks to loopback")


def root_url(base_url: str) -> str:
    """The gateway's root: accepts "http://h:p" and the OpenAI-style "http://h:p/v1" alike."""
    url = base_url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


class RateLimiter:
    """At most `rate` acquisitions per second across threads (evenly spaced slots)."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate
        self.next = time.monotonic()
        self.lock = threading.Lock()

    def acquire(self) -> None:
        with self.lock:
            now = time.monotonic()
            slot = max(self.next, now)
            self.next = slot + self.interval
        if slot > now:
            time.sleep(slot - now)


class GatewayChat:
    """The served model through the gateway with the official openai SDK (model `auto`, user = user_id)."""

    def __init__(self, base_url: str, spec: SimSpec, limiter: RateLimiter | None = None, timeout: float = 120.0):
        import openai

        check_loopback(base_url)
        self._openai = openai
        self.base_url, self.spec, self.limiter, self.timeout = root_url(base_url), spec, limiter, timeout
        self._clients: dict[str, object] = {}
        self._lock = threading.Lock()

    def client(self, token: str):
        with self._lock:
            if token not in self._clients:
                self._clients[token] = self._openai.OpenAI(base_url=self.base_url + "/v1", api_key=token,
                                                           timeout=self.timeout, max_retries=2)
            return self._clients[token]

    def __call__(self, user: User, session_id: str, turn: int, messages: list[dict], tools: list[dict],
                 seed: int) -> Reply:
        if self.limiter:
            self.limiter.acquire()
        t0 = time.perf_counter()
        raw = self.client(user.org.token).chat.completions.with_raw_response.create(
            model="auto", messages=messages, tools=tools, user=user.user_id, max_tokens=self.spec.max_tokens,
            temperature=self.spec.temperature, seed=seed,
            extra_headers={"x-rtrl-session-id": session_id, "x-rtrl-turn-index": str(turn)})
        latency = (time.perf_counter() - t0) * 1000
        resp = raw.parse()
        msg = resp.choices[0].message
        calls = [c.model_dump() for c in (msg.tool_calls or [])]
        version = raw.headers.get("x-rtrl-model-version")
        return Reply(raw.headers["x-rtrl-event-id"], msg.content or "", calls, latency,
                     int(version) if version and version.isdigit() else None,
                     raw.headers.get("x-rtrl-adapter-version") or None)


class FeedbackPoster:
    """POST /v1/feedback with the user's org token; the whole turn's events in one durable batch."""

    def __init__(self, base_url: str, timeout: float = 30.0):
        import httpx

        check_loopback(base_url)
        self.http = httpx.Client(base_url=root_url(base_url), timeout=timeout)

    def __call__(self, user: User, events: list[fb.Feedback]) -> None:
        if not events:
            return
        r = self.http.post("/v1/feedback", json={"events": [e.body() for e in events]},
                           headers={"Authorization": f"Bearer {user.org.token}"})
        if r.status_code != 200:
            raise RuntimeError(f"POST /v1/feedback -> {r.status_code}: {r.text[:300]}")

    def close(self) -> None:
        self.http.close()


def budgets(users: list[User], total: int) -> list[int]:
    """Split the interaction budget over users: equal shares, the remainder to the first users."""
    base, extra = divmod(total, len(users))
    return [base + (i < extra) for i in range(len(users))]


def _run_user(user: User, budget: int, bank: list[SimTask], chat: Chat, post: Feedbacks, spec: SimSpec,
              deadline: float, report: SimReport, lock: threading.Lock, tick,
              plan: heldout.CyclePlan | None = None) -> None:
    rng = random.Random(user.seed)
    rater = rater_for(user.seed, plan.rate_share, plan.flip) if plan else None
    tasks = tasks_for(bank, user.org.org_id)
    used = 0
    while used < budget and time.monotonic() < deadline:
        task = rng.choice(tasks)
        try:
            res = run_session(user, task, chat, post, budget=budget - used, max_turns=spec.max_turns, rng=rng,
                              deadline=deadline, rater=rater, record=plan is not None)
        except Exception as exc:  # a failed request ends this user's run, never the whole simulation
            with lock:
                report.errors += 1
                if len(report.error_examples) < 5:
                    report.error_examples.append(f"{user.user_id}: {type(exc).__name__}: {str(exc)[:200]}")
            return
        used += max(res.interactions, 1)
        for r in res.requests:  # what the update never saw: a held-out task, a new user
            r["heldout"], r["new_user"] = bool(plan and r["task_id"] in plan.heldout), bool(plan and plan.users == "new")
        with lock:
            report.add(res)
        tick(res.interactions)


def simulate(cfg: Config, base_url: str | None = None, spec: SimSpec | None = None, *, chat: Chat | None = None,
             post: Feedbacks | None = None, bank: list[SimTask] | None = None, progress: bool = True) -> SimReport:
    """Run simulated users against the gateway at base_url (or through `chat`/`post` given explicitly). Inside
    heldout.planned(plan) (an experiment's cycle): the plan's bank, users and raters, and every request's record
    appended to plan.records."""
    from tqdm import tqdm

    spec = spec or SimSpec.from_config(cfg)
    plan = heldout.current()
    users = heldout.users_of(plan, spec.users, orgs_from_config(cfg), spec.seed)
    bank = bank or (plan.bank if plan else None) or select(load_bank(), cfg.simulate.tasks)
    empty = sorted({u.org.org_id for u in users if not tasks_for(bank, u.org.org_id)})
    if empty:
        raise ValueError(f"simulate.tasks: no task left for the users of {empty}")
    limiter = RateLimiter(spec.rate)
    owned = None
    if chat is None or post is None:
        if base_url is None:
            raise ValueError("simulate needs base_url (the gateway) unless chat and post are given")
        chat = chat or GatewayChat(base_url, spec, limiter)
        owned = post is None and FeedbackPoster(base_url)
        post = post or owned
    report, lock = SimReport(), threading.Lock()
    t0 = time.monotonic()
    deadline = t0 + spec.max_seconds
    bar = tqdm(total=spec.interactions, desc="simulate", unit="req", disable=not progress, file=sys.stderr)
    try:
        with ThreadPoolExecutor(max_workers=spec.concurrency, thread_name_prefix="sim-user") as pool:
            futures = [pool.submit(_run_user, u, b, bank, chat, post, spec, deadline, report, lock, bar.update, plan)
                       for u, b in zip(users, budgets(users, spec.interactions), strict=True) if b > 0]
            for f in futures:
                f.result()
    finally:
        bar.close()
        if owned:
            owned.close()
    report.elapsed_s = time.monotonic() - t0
    if plan is not None:
        plan.records += sorted(report.requests, key=lambda r: r["user_id"])  # stable: each user's in order
    report.stopped_by = "time" if time.monotonic() >= deadline and report.interactions < spec.interactions else "budget"
    return report


def first_turns(cfg: Config, tasks: list, ask: Callable, concurrency: int, log_name: str) -> list:
    """ask(task, user, chat, i) for every task, each put as a first turn by a seeded user of the task's org
    (any user for a shared task), to the champion served by a gateway of its own (one engine: a spare would
    only compete for the CPU). How bench/task_probe.py and bench/feature_census.py question a model."""
    spec = SimSpec.from_config(cfg)
    orgs = orgs_from_config(cfg)
    users = make_users(len(orgs) * 4, orgs, spec.seed)
    jobs = [(task, next(u for u in users[i % len(users):] + users if task.org in (None, u.org.org_id)), i)
            for i, task in enumerate(tasks)]
    with exit_on_sigterm():
        proc, url = gw.start_gateway(cfg, airflow_env(cfg) | {"RTRL_SERVING__PREWARM_SPARE": "false"},
                                     cfg.home_path / "logs" / log_name)
        try:
            chat = GatewayChat(url, spec)
            with ThreadPoolExecutor(concurrency) as pool:
                return list(pool.map(lambda j: ask(j[0], j[1], chat, j[2]), jobs))
        finally:
            stop(proc)
