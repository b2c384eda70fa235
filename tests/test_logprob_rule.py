"""One logprob rule (issue 42): rl_core.schema.logprob_problem, applied at every boundary a logged turn crosses.

Each hostile value (NaN, +inf, -inf, a finite float64 float32 cannot hold, a positive value, None, a string,
too few or too many values) is refused with an error naming completion_logprobs: by the event model (and so
/v1/interactions and the gateway's own rows), by compaction of the WAL (quarantined with its reason), and by the
quality SQL (bad_logprobs(), BAD_LOGPROBS_SQL), which must count exactly the rows the Python rule refuses. The
trainer's reader keeps its own check (rl_core/train/, another team's): its cases here say where it still differs.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import http_interaction
from pydantic import ValidationError

from lab.testing.synth import interaction_row
from rl_core.collect import wal
from rl_core.collect.compact import compact
from rl_core.duck import connect, load_sql
from rl_core.lake import Lake
from rl_core.schema import EPISODES_SCHEMA, LOGPROB_MAX, InteractionEvent, check_logprobs, logprob_problem

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)
TOKENS = [4, 5]
# logprobs for the two TOKENS that break the rule -> what the error must say
HOSTILE = [
    ([-0.2, math.nan], "completion_logprobs[1] = nan"),
    ([-0.2, math.inf], "completion_logprobs[1] = inf"),
    ([-math.inf, -0.2], "completion_logprobs[0] = -inf"),
    ([-0.2, -1e39], "completion_logprobs[1] = -1e+39"),  # finite in float64, -inf once stored as float32
    ([-0.2, 0.5], "completion_logprobs[1] = 0.5"),
    ([1e-6, -0.2], "completion_logprobs[0] = 1e-06"),  # no tolerance above LOGPROB_MAX: see logprob_problem
    ([-0.2], "completion_logprobs has 1 entries but completion_token_ids has 2"),
    ([-0.2, -0.3, -0.4], "completion_logprobs has 3 entries but completion_token_ids has 2"),
]
GOOD = [[-0.2, -0.3], [0.0, -0.0], [-1e-30, -80.0], [-3.4e38, -1.0]]


def test_logprob_max_is_zero():
    assert LOGPROB_MAX == 0.0


@pytest.mark.parametrize("values, needle", HOSTILE + [([None, -0.2], "[0] = None"), ([-0.2, "x"], "[1] = 'x'"),
                                                      ([True, -0.2], "[0] = True")])
def test_the_rule_names_the_field_and_the_value(values, needle):
    assert needle in (logprob_problem(values, len(TOKENS)) or "")
    with pytest.raises(ValueError, match="completion_logprobs"):
        check_logprobs("completion_logprobs", values, len(TOKENS))


@pytest.mark.parametrize("values", GOOD)
def test_what_the_rule_accepts(values):
    assert logprob_problem(values, len(TOKENS)) is None and check_logprobs("f", values) == values


def _event(**over) -> dict:
    return dict(user_id="u1", session_id="s1", ts_request=T0, ts_response=T0 + timedelta(seconds=1),
                requested_model="auto", model_version=1, arm="champion", messages=[], org_id="org-a",
                prompt_token_ids=[1, 2], completion_token_ids=TOKENS, completion_logprobs=[-0.2, -0.3]) | over


@pytest.mark.parametrize("values, needle", HOSTILE)
def test_event_model_refuses(values, needle):
    """The model /v1/interactions validates and the gateway builds its own rows with."""
    with pytest.raises(ValidationError) as e:
        InteractionEvent(**_event(completion_logprobs=values))
    assert needle in str(e.value)


@pytest.mark.parametrize("values, needle", HOSTILE[:3])
def test_gateway_refuses_to_log_an_engines_bad_logprobs(values, needle):
    """An engine answering NaN: a 500 naming the field, never a logged row or a traceback."""
    from rl_core.serving.protocol import ApiError
    from rl_core.serving.routes.chat import _engine_row

    turn = SimpleNamespace(event_id=str(uuid.uuid4()), org="org-a", user="u1", session="s1", turn_index=0,
                           ts_request=T0, t0=0.0, req=SimpleNamespace(model="auto", tools=None),
                           messages=[{"role": "user", "content": "hi"}], ids=[1, 2],
                           sampling=SimpleNamespace(temperature=1.0, top_p=1.0))
    lease = SimpleNamespace(version=1, adapter_version=None, arm="champion")
    with pytest.raises(ApiError) as e:
        _engine_row(turn, lease, TOKENS, values, "ok", None, "stop", 1.0)
    assert e.value.status == 500 and "interaction.completion_logprobs" in e.value.message and needle in e.value.message


def test_compaction_quarantines_each_hostile_row_with_its_reason(tmp_path):
    """Rows written to the WAL past the models (an older gateway): float32 would hold NaN, +inf and 0.5, so
    before issue 42 they landed and gate_raw later refused the org's window; now each stays out of raw/."""
    lake, d = Lake(str(tmp_path / "lake")), tmp_path / "wal"
    w = wal.WriteAheadLog(d, segment_max_bytes=1 << 30, segment_max_age_s=3600)
    good = [interaction_row(T0 + timedelta(seconds=i), completion_token_ids=TOKENS, completion_logprobs=lp)
            for i, lp in enumerate(GOOD)]
    bad = {}
    for i, (values, needle) in enumerate(HOSTILE):
        row = interaction_row(T0 + timedelta(seconds=i), completion_token_ids=TOKENS, completion_logprobs=values)
        bad[row["event_id"]] = needle
        w.submit("interactions", row)
    for row in good:
        w.submit("interactions", row)
    w.close()
    r = compact(d, lake)
    assert r.rows_written["interactions"] == len(good) and r.quarantined["interactions"] == len(bad)
    landed = [e for p in lake.list_files("raw/interactions") for e in pq.read_table(p)["event_id"].to_pylist()]
    assert sorted(landed) == sorted(g["event_id"] for g in good)
    held = {q["event_id"]: q["reason"] for p in lake.list_files("quarantine/interactions")
            for q in pq.read_table(p).to_pylist()}
    assert held.keys() == bad.keys()
    for eid, needle in bad.items():
        assert held[eid].startswith("ValueError: completion_logprobs") and needle in held[eid], held[eid]


def test_quality_sql_counts_what_the_rule_refuses(tmp_path):
    """SQL cannot call Python: bad_logprobs() (BAD_LOGPROBS_SQL) must agree with logprob_problem row by row."""
    cases = [values for values, _ in HOSTILE] + GOOD + [[None, -0.2]]
    n = len(cases)
    cols = {f.name: [None] * n for f in EPISODES_SCHEMA} | {
        "event_id": [f"e{i}" for i in range(n)], "completion_token_ids": [TOKENS] * n,
        "completion_logprobs": cases}
    lake = Lake(str(tmp_path / "lake"))
    lake.write_parquet("runs/r/episodes.parquet", pa.table(cols, schema=EPISODES_SCHEMA))
    path = lake.url("runs/r/episodes.parquet")
    con = connect(lake)
    try:
        df = con.sql(load_sql("quality/episodes.sql"), params={"path": path}).df()
    finally:
        con.close()
    stored = pa.table(cols, schema=EPISODES_SCHEMA)["completion_logprobs"].to_pylist()  # as float32 holds them
    for i, row in df.sort_values("event_id", key=lambda s: s.str[1:].astype(int)).reset_index().iterrows():
        sql_bad = row["n_bad_logprobs"] > 0 or row["n_logprobs"] != row["n_completion_tokens"]
        assert sql_bad == (logprob_problem(stored[i], len(TOKENS)) is not None), (cases[i], row.to_dict())


@pytest.mark.parametrize("values, needle", HOSTILE)
def test_trainer_refuses(values, needle):
    """rl_core/train/data.py's own check (sql/train/samples.sql's bad_logprobs(), the one rule), on episodes typed
    as the lake types them (-1e39 is -inf in float32)."""
    from rl_core.config import TrainConfig
    from rl_core.train.data import DataError, build_samples

    ep = pa.table({"event_id": ["e0"], "org_id": ["org-a"], "ts_request": [T0], "prompt_token_ids": [[1]],
                   "completion_token_ids": [TOKENS], "credit_weight": [1.0],
                   "completion_logprobs": pa.array([values], EPISODES_SCHEMA.field("completion_logprobs").type)})
    with pytest.raises(DataError, match="completion_logprobs"):
        build_samples(ep, pa.table({"event_id": ["e0"], "reward": [1.0]}), TrainConfig())


def test_v1_interactions_answers_400_naming_the_field(cfg):
    """The HTTP boundary for turns logged by another serving stack: a 400 naming the field, nothing stored."""
    from fastapi.testclient import TestClient

    from rl_core.collect.collector import Collector
    from rl_core.serving.app import create_app
    from rl_core.serving.router import Router

    col = Collector.from_config(cfg, background=False)
    router = Router(factory=None, checkpoint_for=None, alias_source=dict, challenger_share=0.1)
    try:
        with TestClient(create_app(cfg, router, col)) as http:
            for values, needle in HOSTILE:
                body = json.dumps(http_interaction(completion_token_ids=TOKENS, completion_logprobs=values))
                r = http.post("/v1/interactions", content=body, headers={
                    "authorization": "Bearer rtrl-acme-token", "content-type": "application/json"})
                err = r.json()["error"]
                assert r.status_code == 400 and "completion_logprobs" in err["message"], (values, r.text[:300])
                assert needle in err["message"] and err["param"].startswith("interaction"), err
            ok = http.post("/v1/interactions", json=http_interaction(), headers={
                "authorization": "Bearer rtrl-acme-token"})
            assert ok.status_code == 200, ok.text
        assert col.wal.stats.appended == 1, "only the valid turn reached the WAL"
    finally:
        col.close()
