"""`rtrl forget` beside other work and across crashes (issue 44): two forgets, compaction passes and feedback
in flight interleaved leave nothing of either user anywhere (lake, WAL, the gateway's event index) and lose
nothing of anyone else; a forget killed part-way is finished by the next compaction or forget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq

from lab.testing.synth import feedback_row, interaction_row
from rl_core.cli import main
from rl_core.collect import wal
from rl_core.collect.collector import Collector
from rl_core.collect.index import EventIndex
from rl_core.forget import load_registry
from rl_core.lake import Lake

REPO = Path(__file__).resolve().parent.parent
T = datetime(2026, 12, 2, 9, 10, tzinfo=timezone.utc)
FORGOTTEN = [("org-a", "alice"), ("org-b", "bob")]
OTHERS = [("org-a", "carol"), ("org-b", "dave"), ("org-c", "erin")]
ROUNDS = 5  # of traffic in flight during the forgets (each uses one of a subject's first 10 interactions)


class Traffic:
    """What the gateway acknowledged, by subject: interactions and feedback (ids)."""

    def __init__(self, col: Collector):
        self.col, self.lock, self.n = col, threading.Lock(), 0
        self.events: dict[tuple[str, str], list[str]] = {s: [] for s in FORGOTTEN + OTHERS}
        self.feedback: dict[tuple[str, str], list[str]] = {s: [] for s in FORGOTTEN + OTHERS}

    def interaction(self, org: str, user: str) -> dict:
        with self.lock:
            self.n += 1
            r = interaction_row(T + timedelta(seconds=7 * self.n), org_id=org, user_id=user, session_id=f"{user}-s")
        self.col.log_interaction(r).result(timeout=30)
        self.events[(org, user)].append(r["event_id"])
        return r

    def feedback_on(self, org: str, user: str, event: dict, check_index: bool = True) -> None:
        """As /v1/feedback does: only for an interaction the index knows (404 otherwise), unless told not to
        check (a gateway whose index has not caught up with the forget yet)."""
        if check_index and not self.col.index.known(event["event_id"], org):
            return
        fb = feedback_row(event, "edit_applied", value_bool=True)
        self.col.log_feedback([fb]).result(timeout=30)
        self.feedback[(org, user)].append(fb["feedback_id"])


def lake_col(lake: Lake, root: str, col: str) -> set[str]:
    return {v for p in lake.list_files(root) for v in pq.read_table(p, columns=[col])[col].to_pylist()}


def wal_rows(wal_dir: Path) -> list[tuple[str, dict]]:
    out = []
    for seg in [*wal.open_segments(wal_dir), *wal.sealed_segments(wal_dir)]:
        out += list(wal.read_segment(seg))
    return out


def run_threads(targets: list, timeout: float = 120) -> None:
    errors: list[BaseException] = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # surfaced below, with the thread's name
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guard(fn), name=fn.__name__) for fn in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    assert not [t.name for t in threads if t.is_alive()], "a thread did not finish in time"
    assert not errors, errors


def test_two_forgets_compaction_and_feedback_in_flight(cfg, monkeypatch):
    monkeypatch.setenv("RTRL_SERVING__SEGMENT_MAX_BYTES", "4000")  # many sealed segments
    from rl_core.config import load_config

    cfg = load_config()
    lake = Lake(cfg.lake_root)
    col = Collector.from_config(cfg, background=False)
    tr = Traffic(col)
    first = {s: [tr.interaction(*s) for _ in range(6)] for s in FORGOTTEN + OTHERS}
    for s, evs in first.items():
        for e in evs[:4]:
            tr.feedback_on(*s, e)
    col.compact_now()  # some in the lake ...
    for s, evs in first.items():  # ... some in sealed segments and in the live one
        evs += [tr.interaction(*s) for _ in range(4)]
        tr.feedback_on(*s, evs[4])

    def forget_alice():
        assert main(["forget", "--org", "org-a", "--user", "alice", "--reason", "test"]) == 0

    def forget_bob():
        assert main(["forget", "--org", "org-b", "--user", "bob", "--reason", "test"]) == 0

    def compactions():
        for _ in range(6):
            col.compact_now()

    def in_flight():
        for round_ in range(ROUNDS):
            for s in FORGOTTEN + OTHERS:
                e = tr.interaction(*s)
                tr.feedback_on(*s, e)
                tr.feedback_on(*s, first[s][5 + round_])

    run_threads([forget_alice, forget_bob, compactions, in_flight])
    # after the forgets: feedback for the forgotten users' interactions from a gateway whose index has not
    # caught up (it bypasses the 404), and for others' as usual
    for s in FORGOTTEN + OTHERS:
        tr.feedback_on(*s, first[s][0], check_index=s in OTHERS)
    col.close()  # final compaction, then the index syncs with the registry

    gone_events = {e for s in FORGOTTEN for e in tr.events[s]}
    gone_feedback = {f for s in FORGOTTEN for f in tr.feedback[s]}
    kept_events = {e for s in OTHERS for e in tr.events[s]}
    kept_feedback = {f for s in OTHERS for f in tr.feedback[s]}
    assert len(gone_events) == 2 * (10 + ROUNDS) and len(kept_feedback) >= 3 * (5 + 2 * ROUNDS)
    lake_events, lake_fb = lake_col(lake, "raw/interactions", "event_id"), lake_col(lake, "raw/feedback", "event_id")
    assert lake_events == kept_events, "nothing of the forgotten users, nothing of anyone else lost"
    assert lake_col(lake, "raw/feedback", "feedback_id") == kept_feedback and gone_feedback
    assert not lake_fb & gone_events and not lake.list_files("quarantine")
    users = lake_col(lake, "raw/interactions", "user_id")
    assert users == {u for _, u in OTHERS}
    assert not [r for _, r in wal_rows(cfg.wal_dir) if r.get("event_id") in gone_events]
    assert not [e for e in gone_events if col.index.org_of(e)], "the gateway's index forgot them"
    assert all(col.index.org_of(e) for e in kept_events)
    rebuilt = EventIndex.build(lake, cfg.wal_dir)  # a restarted gateway
    assert not [e for e in gone_events if rebuilt.org_of(e)] and all(rebuilt.org_of(e) for e in kept_events)
    assert [(e["org_id"], e["user_id"], e["status"]) for e in load_registry(lake)] in (
        [("org-a", "alice", "done"), ("org-b", "bob", "done")], [("org-b", "bob", "done"), ("org-a", "alice", "done")])
    tombstones = set(lake.read_json("forget/tombstones.json")["event_ids"])
    assert gone_events <= tombstones and not tombstones & kept_events, "late feedback on their events is dropped"


def forget_cli(fault: str | None, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **({"RTRL_FAULT": f"forget:{fault}"} if fault else {}))
    return subprocess.run([sys.executable, "-m", "rl_core.cli", "forget", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_forget_killed_part_way_is_finished_by_the_next_compaction_or_forget(cfg):
    lake = Lake(cfg.lake_root)
    col = Collector.from_config(cfg, background=False)
    tr = Traffic(col)
    for s in [*FORGOTTEN, *OTHERS]:
        for _ in range(3):
            tr.feedback_on(*s, tr.interaction(*s))
    col.compact_now()
    for s in [*FORGOTTEN, *OTHERS]:
        tr.feedback_on(*s, tr.interaction(*s))
    col.close(final_compaction=False)  # alice's and bob's last interactions wait in a sealed segment

    killed = forget_cli("registered", "--org", "org-a", "--user", "alice")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert [(e["user_id"], e["status"]) for e in load_registry(lake)] == [("alice", "pending")]
    assert "alice" in lake_col(lake, "raw/interactions", "user_id"), "killed before any rewrite"
    assert main(["collect", "status", "--json"]) == 0  # the operator sees it pending (printed, not parsed here)
    assert main(["collect", "compact"]) == 0  # the next compaction resumes it
    assert [(e["user_id"], e["status"]) for e in load_registry(lake)] == [("alice", "done")]
    alice = set(tr.events[("org-a", "alice")])
    assert "alice" not in lake_col(lake, "raw/interactions", "user_id")
    assert not lake_col(lake, "raw/feedback", "event_id") & alice
    assert len(lake.fs.find(lake.path("forget/requests"))) == 1, "its report, once done"

    col = Collector.from_config(cfg, background=False)  # more traffic, left in a sealed segment
    tr.col = col
    for s in [*FORGOTTEN, *OTHERS]:
        tr.feedback_on(*s, tr.interaction(*s))
    col.close(final_compaction=False)

    # killed after its interactions were rewritten, before their feedback: the next forget finishes it first
    killed = forget_cli("raw-interactions", "--org", "org-b", "--user", "bob")
    assert killed.returncode == -9, killed.stderr[-2000:]
    bob = set(tr.events[("org-b", "bob")])
    assert "bob" not in lake_col(lake, "raw/interactions", "user_id")
    assert lake_col(lake, "raw/feedback", "event_id") & bob, "its feedback was not rewritten yet"
    done = forget_cli(None, "--org", "org-c", "--user", "nobody")
    assert done.returncode == 0, done.stderr[-2000:]
    assert [(e["user_id"], e["status"]) for e in load_registry(lake)] == [("alice", "done"), ("bob", "done"),
                                                                         ("nobody", "done")]
    assert not lake_col(lake, "raw/feedback", "event_id") & (alice | bob)
    assert not [r for _, r in wal_rows(cfg.wal_dir) if r.get("event_id") in alice | bob]
    others = {e for s in OTHERS for e in tr.events[s]}
    assert others <= lake_col(lake, "raw/interactions", "event_id") | {r["event_id"] for k, r in wal_rows(cfg.wal_dir)
                                                                       if k == "interactions"}
    reports = {r["user_id"]: r for r in (json.loads(Path(p).read_text()) for p in lake.fs.find(lake.path("forget/requests")))}
    assert set(reports) == {"alice", "bob", "nobody"} and reports["bob"]["wal_rows_removed"] == 2  # + its feedback
