"""The long-lived gateway of `rtrl experiment` (rl_core/serving/gateway.py): a real `rtrl serve` subprocess
that follows an alias move without a restart, and whose acknowledged events reach the lake once its live
WAL segment seals by age, while it keeps running."""

from __future__ import annotations

import time

import pytest


@pytest.mark.timeout(300)
def test_long_lived_gateway_follows_aliases_and_seals_its_wal(registered, tmp_path):
    import openai
    import pyarrow.parquet as pq

    from lab.cycle import airflow_env
    from rl_core.collect.compact import compact
    from rl_core.collect.wal import open_segments
    from rl_core.lake import Lake
    from rl_core.registry import store
    from rl_core.runtime.procs import stop
    from rl_core.serving import gateway as gw

    cfg = registered
    env = airflow_env(cfg) | {"RTRL_SERVING__SEGMENT_MAX_AGE_S": "2", "RTRL_SERVING__ALIAS_POLL_S": "0.5",
                              "RTRL_SERVING__COMPACT_INTERVAL_S": "3600"}  # compaction is the test's to run
    proc, url = gw.start_gateway(cfg, env, tmp_path / "gateway.log")
    try:
        assert gw.wait_in_sync(cfg, url, 30) == {"champion": 1}
        store.set_alias(cfg, "challenger", 1, reason="test: the gateway must follow without a restart")
        assert gw.wait_in_sync(cfg, url, 30) == {"champion": 1, "challenger": 1}
        assert proc.poll() is None

        token = next(iter(cfg.serving.tokens))
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=token)
        r = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=4, user="u-1")
        event_id = r.headers["x-rtrl-event-id"]
        assert open_segments(cfg.wal_dir), "the event sits in the live segment right after its ack"
        t0 = time.monotonic()
        gw.wait_wal_sealed(cfg.wal_dir, 30)
        assert time.monotonic() - t0 < 10
        assert not open_segments(cfg.wal_dir) and proc.poll() is None
        compact(cfg.wal_dir, Lake(cfg.lake_root))
        files = Lake(cfg.lake_root).list_files("raw/interactions")
        ids = {e for f in files for e in pq.read_table(f)["event_id"].to_pylist()}
        assert event_id in ids, "compacted while the gateway runs"
    finally:
        stop(proc)


def test_wait_in_sync_names_both_sides_when_it_gives_up(registered):
    from rl_core.serving import gateway as gw

    with pytest.raises(TimeoutError, match="unreachable.*the registry says"):
        gw.wait_in_sync(registered, "http://127.0.0.1:9", 1)  # nothing listens on port 9 (discard)


def test_wait_wal_sealed_refuses_a_live_open_segment_and_seals_an_orphan(tmp_path):
    from rl_core.collect.wal import OPEN_SUFFIX, WriteAheadLog, open_segments, sealed_segments
    from rl_core.serving import gateway as gw

    wal = WriteAheadLog(tmp_path / "live", segment_max_age_s=3600)  # a writer that will not roll by itself
    try:
        wal.append("interactions", {"event_id": "e1"})
        with pytest.raises(TimeoutError, match="still open"):
            gw.wait_wal_sealed(tmp_path / "live", 0.5)
        assert open_segments(tmp_path / "live"), "waiting never seals a segment its writer still holds"
    finally:
        wal.close()
    orphan_dir = tmp_path / "orphan"
    orphan_dir.mkdir()
    (orphan_dir / f"seg-20261203T000000000000-1-deadbeef{OPEN_SUFFIX}").write_text("")  # a crashed writer's
    gw.wait_wal_sealed(orphan_dir, 5)
    assert not open_segments(orphan_dir) and len(sealed_segments(orphan_dir)) == 1
