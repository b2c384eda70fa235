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

    from rl_core.collect.compact import compact
    from rl_core.collect.wal import open_segments
    from rl_core.cycle import airflow_env
    from rl_core.lake import Lake
    from rl_core.procs import stop
    from rl_core.registry import store
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
