"""The durable log: group-committed WAL segments, compaction into the lake exactly once, crash leftovers."""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from datetime import datetime, timedelta, timezone

import pyarrow.parquet as pq
import pytest

from rl_core.collect import wal
from rl_core.collect.compact import compact
from rl_core.collect.index import EventIndex
from rl_core.collect.wal import WriteAheadLog
from rl_core.lake import Lake

T0 = datetime(2026, 12, 2, 10, 15, tzinfo=timezone.utc)


def interaction(event_id: str | None = None, ts: datetime = T0, org: str = "org-a") -> dict:
    return {"event_id": event_id or str(uuid.uuid4()), "org_id": org, "user_id": "u1", "session_id": "s1",
            "turn_index": 0, "ts_request": ts, "ts_response": ts + timedelta(seconds=1), "requested_model": "auto",
            "model_version": 1, "adapter_version": None, "arm": "champion", "messages": "[]",
            "prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5], "completion_logprobs": [-0.5, -1.25],
            "completion_text": "hi", "tool_calls": None, "finish_reason": "stop", "latency_ms": 12.0,
            "ttft_ms": 3.0, "temperature": 1.0, "top_p": 1.0}


def feedback(event_id: str, feedback_id: str | None = None, ts: datetime = T0) -> dict:
    return {"feedback_id": feedback_id or str(uuid.uuid4()), "event_id": event_id, "org_id": "org-a", "ts": ts,
            "kind": "thumbs", "value_bool": True, "value_float": None, "text": None}


def lake_ids(lake: Lake, table: str, col: str) -> list[str]:
    out = []
    for p in lake.list_files(f"raw/{table}"):
        out += pq.read_table(p).column(col).to_pylist()
    return out


def test_concurrent_appends_are_group_committed_and_readable(tmp_path):
    w = WriteAheadLog(tmp_path / "wal", segment_max_bytes=1 << 30, segment_max_age_s=3600)
    ids = [str(uuid.uuid4()) for _ in range(1600)]

    def worker(chunk: list[str]) -> None:
        for e in chunk:
            w.append("feedback", feedback(e))

    threads = [threading.Thread(target=worker, args=(ids[i::16],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert w.stats.appended == len(ids)
    assert w.stats.fsyncs < len(ids), "group commit: one fsync covers several appends"
    path = w.current_path
    got = [r["event_id"] for _, r in wal.read_segment(path)]
    assert sorted(got) == sorted(ids)
    w.close()
    assert wal.open_segments(tmp_path / "wal") == [] and len(wal.sealed_segments(tmp_path / "wal")) == 1


def test_segments_roll_by_size_and_age(tmp_path):
    w = WriteAheadLog(tmp_path / "wal", segment_max_bytes=2000, segment_max_age_s=3600)
    for _ in range(20):
        w.append("interactions", interaction())
    assert len(wal.sealed_segments(tmp_path / "wal")) >= 5
    w.close()
    w2 = WriteAheadLog(tmp_path / "wal2", segment_max_bytes=1 << 30, segment_max_age_s=0.2)
    w2.append("interactions", interaction())
    deadline = datetime.now() + timedelta(seconds=5)
    while not wal.sealed_segments(tmp_path / "wal2") and datetime.now() < deadline:
        threading.Event().wait(0.1)
    assert len(wal.sealed_segments(tmp_path / "wal2")) == 1, "an idle segment is sealed once it is old enough"
    w2.close()


def test_unknown_kind_is_refused(tmp_path):
    w = WriteAheadLog(tmp_path / "wal")
    with pytest.raises(ValueError, match="unknown event kind 'clicks'"):
        w.append("clicks", {"x": 1})
    w.close()


def test_compaction_stores_each_event_once_by_hour_and_deletes_segments(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    w = WriteAheadLog(tmp_path / "wal", segment_max_bytes=3000, segment_max_age_s=3600)
    e1, e2, e3 = (str(uuid.uuid4()) for _ in range(3))
    fid = str(uuid.uuid4())
    w.append("interactions", interaction(e1))
    w.append("interactions", interaction(e1))  # a retried event: stored once
    w.append("interactions", interaction(e2, ts=T0 + timedelta(hours=1)))
    w.append("interactions", interaction(e3))
    w.append("feedback", feedback(e1, fid))
    w.append("feedback", feedback(e1, fid))  # duplicate feedback_id
    w.append("feedback", feedback(e2, ts=T0 + timedelta(hours=2)))
    w.close()
    r = compact(tmp_path / "wal", lake)
    assert r.rows_written == {"interactions": 3, "feedback": 2}
    assert r.duplicates == 2
    assert sorted(lake_ids(lake, "interactions", "event_id")) == sorted([e1, e2, e3])
    fb = lake_ids(lake, "feedback", "feedback_id")
    assert len(fb) == 2 and len(set(fb)) == 2 and fid in fb
    assert len(lake.list_files(Lake.partition("interactions", T0))) == 1
    assert len(lake.list_files(Lake.partition("interactions", T0 + timedelta(hours=1)))) == 1
    assert len(lake.list_files(Lake.partition("feedback", T0 + timedelta(hours=2)))) == 1
    t = pq.read_table(lake.list_files(Lake.partition("interactions", T0))[0])
    row = t.to_pylist()[0]
    assert row["completion_logprobs"] == [-0.5, -1.25] and row["ts_request"].tzinfo is not None
    assert wal.sealed_segments(tmp_path / "wal") == []
    assert compact(tmp_path / "wal", lake).segments == 0


def test_crash_between_lake_write_and_segment_delete_writes_nothing_twice(tmp_path):
    """A compactor killed after writing Parquet but before deleting: the rerun dedupes against the lake."""
    lake = Lake(str(tmp_path / "lake"))
    w = WriteAheadLog(tmp_path / "wal")
    ids = [str(uuid.uuid4()) for _ in range(5)]
    for e in ids:
        w.append("interactions", interaction(e))
    w.close()
    seg = wal.sealed_segments(tmp_path / "wal")[0]
    backup = tmp_path / "backup.jsonl"
    shutil.copy(seg, backup)
    assert compact(tmp_path / "wal", lake).rows_written["interactions"] == 5
    shutil.copy(backup, seg)  # the segment "survived" the crash
    again = compact(tmp_path / "wal", lake)
    assert again.rows_written["interactions"] == 0 and again.duplicates == 5 and again.segments == 1
    assert sorted(lake_ids(lake, "interactions", "event_id")) == sorted(ids)


def test_torn_tail_and_orphan_segment_of_a_dead_writer(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    d = tmp_path / "wal"
    d.mkdir()
    good = str(uuid.uuid4())
    orphan = d / "seg-20261202T101500000000-99999-deadbeef.open"
    line = wal.encode("interactions", interaction(good))
    orphan.write_bytes(line + line[: len(line) // 2])  # the second write was torn by the crash
    live = WriteAheadLog(d)
    live_id = str(uuid.uuid4())
    live.append("interactions", interaction(live_id))
    r = compact(d, lake)
    assert r.orphans_sealed == 1, "the dead writer's segment is sealed and compacted"
    assert lake_ids(lake, "interactions", "event_id") == [good], "the torn line was never acknowledged"
    assert live.current_path is not None and live.current_path.exists(), "a live writer's segment is left alone"
    live.close()
    compact(d, lake)
    assert sorted(lake_ids(lake, "interactions", "event_id")) == sorted([good, live_id])


def test_a_compactor_at_the_worst_moment_never_takes_a_new_segment_for_an_orphan(tmp_path, monkeypatch):
    """A compaction or forget pass that runs right after a writer creates its segment, before it has the
    lock, must not seal it: the writer would go on writing acknowledged events into a file the compactor
    owns (and may delete). Caught in CI as a FileNotFoundError when the writer later sealed its segment."""
    lake = Lake(str(tmp_path / "lake"))
    d = tmp_path / "wal"
    real_flock, stolen = wal.fcntl.flock, []

    def flock_after_a_compactor_ran(fd, op):
        if op == wal.fcntl.LOCK_EX:  # the writer's blocking lock on a segment it has just created
            stolen.extend(p for p in wal.open_segments(d) if wal.try_seal_orphan(p) is not None)
        return real_flock(fd, op)

    monkeypatch.setattr(wal.fcntl, "flock", flock_after_a_compactor_ran)
    log = WriteAheadLog(d, segment_max_bytes=1)  # every commit seals its segment, the next opens one
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for i in ids:
        log.append("interactions", interaction(i))  # raises if the writer lost its segment
    log.close()
    monkeypatch.setattr(wal.fcntl, "flock", real_flock)
    assert stolen == [], "no live writer's segment was taken for a dead one's"
    compact(d, lake)
    assert sorted(lake_ids(lake, "interactions", "event_id")) == sorted(ids)


def test_event_index_knows_lake_and_wal_events_per_org(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    w = WriteAheadLog(tmp_path / "wal")
    in_lake, in_wal = str(uuid.uuid4()), str(uuid.uuid4())
    w.append("interactions", interaction(in_lake, org="org-a"))
    w.close()
    compact(tmp_path / "wal", lake)
    w = WriteAheadLog(tmp_path / "wal")
    w.append("interactions", interaction(in_wal, org="org-b"))
    idx = EventIndex.build(lake, tmp_path / "wal")
    assert idx.known(in_lake, "org-a") and idx.known(in_wal, "org-b")
    assert not idx.known(in_wal, "org-a"), "another org's event is unknown to this org"
    assert not idx.known(str(uuid.uuid4()), "org-a")
    w.close()


def test_collect_compact_cli(cfg, capsys):
    from rl_core.cli import main

    w = WriteAheadLog(cfg.wal_dir)
    e = str(uuid.uuid4())
    w.append("interactions", interaction(e))
    w.append("feedback", feedback(e))
    w.close()
    assert main(["collect", "status"]) == 0
    assert "sealed   1" in capsys.readouterr().out
    assert main(["collect", "compact", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["rows_written"] == {"interactions": 1, "feedback": 1}
    assert lake_ids(Lake(cfg.lake_root), "interactions", "event_id") == [e]
    assert not os.listdir(cfg.wal_dir) or all(n.startswith(".") for n in os.listdir(cfg.wal_dir))
