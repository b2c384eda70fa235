"""Compaction isolates a bad record (issue 44): rows one org got acknowledged that cannot be written (values
beyond their Parquet type, a null in a required column, a timestamp that is not one, a row that is not an
object) go to quarantine/ with their reason; every other org's events land, the segments are retired, a
second pass is clean, and /healthz, /metrics and `rtrl collect status` show the count and the last error."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone

import pyarrow.parquet as pq
from fastapi.testclient import TestClient

from lab.testing.synth import feedback_row, interaction_row
from rl_core.collect import wal
from rl_core.collect.collector import Collector
from rl_core.collect.compact import compact
from rl_core.lake import Lake

T = datetime(2026, 12, 2, 9, 40, tzinfo=timezone.utc)  # the traffic spans the 09:00 and 10:00 partitions
EVIL = "org-evil"
# what an older gateway or a /v1/interactions bug could have acknowledged: field overrides -> reason fragment
HOSTILE = [({"turn_index": 2**40}, "turn_index: ArrowInvalid"),
           ({"completion_token_ids": [1, 2**40, 3]}, "completion_token_ids: ArrowInvalid"),
           ({"model_version": 2**70}, "model_version: "), ({"session_id": None}, "session_id: required but null"),
           ({"ts_request": "yesterday"}, "ValueError: Invalid isoformat")]


def lake_ids(lake: Lake, table: str, col: str) -> list[str]:
    return [v for p in lake.list_files(f"raw/{table}") for v in pq.read_table(p, columns=[col])[col].to_pylist()]


def quarantined(lake: Lake, table: str = "") -> list[dict]:
    """Rows of quarantine/<table>/ (every table if none), read as plain Parquet."""
    return [r for p in lake.list_files(f"quarantine/{table}".rstrip("/")) for r in pq.read_table(p).to_pylist()]


def log_traffic(col: Collector) -> tuple[list[dict], list[dict], dict[str, tuple[dict, str]]]:
    """30 good interactions of three orgs (each with feedback), a hostile row of org-evil after every 6th.
    Returns the good interactions, their feedback and the hostile rows (event_id -> (overrides, reason))."""
    good, fb, futures, evil = [], [], [], {}
    for i in range(30):
        r = interaction_row(T + timedelta(minutes=i), org_id=("org-a", "org-b", "org-c")[i % 3], user_id=f"u{i % 4}")
        good.append(r)
        futures.append(col.log_interaction(r))
        if i % 6 == 5:
            overrides, fragment = HOSTILE[i // 6]
            bad = interaction_row(T + timedelta(minutes=i), org_id=EVIL, **overrides)
            evil[bad["event_id"]] = (overrides, fragment)
            futures.append(col.log_interaction(bad))
    for r in good:
        fb.append(feedback_row(r, "thumbs", value_bool=True))
        futures.append(col.log_feedback([fb[-1]]))
    evil_fb = feedback_row(good[0], "edit_persisted", org_id=EVIL, value_float="many hours")
    futures.append(col.log_feedback([evil_fb]))
    futures.append(col.wal.submit("feedback", [1, 2, 3]))  # not even an object
    for f in futures:
        f.result(timeout=30)
    return good, fb, evil


def test_hostile_rows_are_quarantined_and_every_other_row_lands(cfg):
    lake = Lake(cfg.lake_root)
    col = Collector.from_config(cfg, background=False)
    try:
        good, fb, evil = log_traffic(col)
        r = col.compact_now()
        assert r.rows_written == {"interactions": 30, "feedback": 30}, r
        assert r.quarantined == {"interactions": len(HOSTILE), "feedback": 2} and r.segments >= 1
        assert sorted(lake_ids(lake, "interactions", "event_id")) == sorted(x["event_id"] for x in good)
        assert sorted(lake_ids(lake, "feedback", "feedback_id")) == sorted(x["feedback_id"] for x in fb)
        assert wal.sealed_segments(cfg.wal_dir) == [] and wal.open_segments(cfg.wal_dir) == [], "segments retired"

        q = {x["event_id"]: x for x in quarantined(lake, "interactions")}
        assert set(q) == set(evil) and {x["org_id"] for x in q.values()} == {EVIL}
        for eid, (overrides, fragment) in evil.items():
            assert fragment in q[eid]["reason"], (overrides, q[eid]["reason"])
            raw = json.loads(q[eid]["row_json"])  # the row as the WAL held it
            assert all(raw[k] == v for k, v in overrides.items()) and q[eid]["segment"].startswith("seg-")
        assert all("/quarantine/interactions/date=2026-" in p for p in lake.list_files("quarantine/interactions"))
        qf = quarantined(lake, "feedback")
        assert sorted(x["org_id"] or "-" for x in qf) == ["-", EVIL] and all(x["reason"] for x in qf)
        # harvest lists raw/ partitions only: no quarantined file is ever read as data
        window = lake.list_window("interactions", T - timedelta(hours=1), T + timedelta(hours=2))
        assert window and not any("quarantine" in p for p in window)

        again = col.compact_now()
        assert again.rows_written == {"interactions": 0, "feedback": 0} and again.quarantined == {"interactions": 0,
                                                                                                  "feedback": 0}
        h = col.health()
        assert h["quarantined"] == len(HOSTILE) + 2 and h["last_quarantine_error"].startswith("feedback: ")
        assert h["last_compaction_error"] is None and h["wal_sealed_backlog"] == 0
    finally:
        col.close()


def test_quarantine_shows_in_healthz_metrics_and_collect_status(cfg, capsys):
    from rl_core.cli import main
    from rl_core.serving.app import create_app
    from rl_core.serving.router import Router

    col = Collector.from_config(cfg, background=False)
    try:
        log_traffic(col)
        col.wal.roll()
        assert main(["collect", "compact"]) == 0  # another process's compaction: the gateway catches up
        assert "quarantined        5 interactions, 2 feedback" in capsys.readouterr().out
        col.compact_now()
        router = Router(factory=None, checkpoint_for=None, alias_source=dict, challenger_share=0.1)  # no champion yet
        with TestClient(create_app(cfg, router, col)) as http:
            health = http.get("/healthz")
            metrics = http.get("/metrics").text
        assert health.status_code == 503  # not ready: no champion; the data plane is reported all the same
        c = health.json()["collect"]
        assert c["quarantined"] == 7 and c["last_quarantine_error"].startswith("feedback: ") and c["last_quarantined_at"]
        assert "rtrl_quarantined_rows 7.0" in metrics
        assert 'rtrl_collect_last_error_info{error="feedback: ' in metrics and 'source="quarantine"' in metrics
    finally:
        col.close()
    assert main(["collect", "status"]) == 0
    out = capsys.readouterr().out
    assert "quarantined 7 rows" in out and "last error  feedback: " in out
    assert main(["collect", "status", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["quarantined"] == 7 and st["sealed"] == 0 and st["last_error"].startswith("feedback: ")


def test_one_bad_row_among_many_keeps_the_rest_in_one_file_and_a_rerun_adds_nothing(tmp_path):
    """The fast path converts a partition at once; a bad row is bisected out, the good rows stay in order in
    one file; a pass rerun after a crash (segments still there) writes neither rows nor quarantine twice."""
    lake, d = Lake(str(tmp_path / "lake")), tmp_path / "wal"
    w = wal.WriteAheadLog(d, segment_max_bytes=1 << 30, segment_max_age_s=3600)
    t0 = T.replace(minute=0)  # one hour partition
    rows = [interaction_row(t0 + timedelta(seconds=i), org_id="org-a") for i in range(2000)]
    rows.insert(1234, interaction_row(t0, org_id=EVIL, prompt_token_ids=[-(2**33)]))
    for r in rows:
        w.submit("interactions", r)
    w.close()
    shutil.copytree(d, tmp_path / "wal-copy")
    r = compact(d, lake)
    assert r.rows_written["interactions"] == 2000 and r.quarantined["interactions"] == 1 and len(r.files) == 1
    t = pq.read_table(r.files[0])
    assert t["ts_request"].to_pylist() == sorted(t["ts_request"].to_pylist())
    shutil.rmtree(d)
    shutil.copytree(tmp_path / "wal-copy", d)  # as if the pass died before deleting its segments
    again = compact(d, lake)
    assert again.rows_written["interactions"] == 0 and again.duplicates == 2000
    assert len(quarantined(lake)) == 1, "the rerun rewrote the same quarantine file"


def test_quarantine_holds_nothing_of_a_forgotten_user(cfg):
    """`rtrl forget` removes a user's quarantined rows; a forgotten user's bad row arriving later is dropped,
    never quarantined."""
    from rl_core.forget import forget

    lake = Lake(cfg.lake_root)
    col = Collector.from_config(cfg, background=False)
    try:
        bad = [interaction_row(T, org_id="org-a", user_id=u, turn_index=2**40) for u in ("mallory", "trent")]
        col.log_interactions(bad).result(timeout=30)
        col.compact_now()
        assert sorted(r["user_id"] for r in quarantined(lake)) == ["mallory", "trent"]
        forget(lake, "org-a", "mallory", wal_dir=cfg.wal_dir)
        assert [r["user_id"] for r in quarantined(lake)] == ["trent"]
        col.log_interaction(interaction_row(T, org_id="org-a", user_id="mallory", ts_request="never")).result(30)
        res = col.compact_now()
        assert res.forgotten == 1 and res.quarantined == {"interactions": 0, "feedback": 0}
        assert [r["user_id"] for r in quarantined(lake)] == ["trent"]
    finally:
        col.close()
