"""Hostile events (issue 44, items 2, 4 and 5): one validation boundary, one org's bad rows judged alone.

Each test is one class of hostile input that main used to take: a value the lake's Parquet types cannot hold
(answered 200, then every compaction pass raised ArrowInvalid for every org), a non-finite logprob (accepted,
then gate_raw refused every org's window), and a header or metadata value that failed only after the model had
generated (a 500 with a traceback; a streamed answer served and never logged). Now each is a 4xx naming its
field, given before anything is stored or generated, and the raw gate quarantines one org's bad rows.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import http_interaction as interaction
from conftest import served_gateway

from lab.testing.synth import generate, interaction_row, window
from rl_core.exclude import exclude
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.quality import gate_episodes, gate_raw
from rl_core.reports import GateFailed, read_verdict
from rl_core.schema import INTERACTIONS_SCHEMA

REPO = Path(__file__).resolve().parent.parent
TOKEN = "rtrl-acme-token"
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Write add(a, b)."}], "max_tokens": 4}


@pytest.fixture(scope="module")
def gw(tmp_path_factory, tiny_checkpoint):
    """One gateway for the module: the tiny model registered as v1 champion, served on a free port."""
    with served_gateway(tmp_path_factory, tiny_checkpoint, "hostile") as g:
        yield g


def post(gw, path: str, body=None, headers: dict | None = None, raw: bytes | None = None) -> httpx.Response:
    h = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json", **(headers or {})}
    return httpx.post(gw[1] + path, content=raw if raw is not None else json.dumps(body), headers=h, timeout=60)


def stored(gw) -> int:
    """Interactions the gateway holds anywhere: its WAL (open or sealed) and the lake."""
    from rl_core.collect import wal

    cfg = gw[0]
    n = sum(1 for seg in [*wal.sealed_segments(cfg.wal_dir), *wal.open_segments(cfg.wal_dir)]
            for k, _ in wal.read_segment(seg) if k == "interactions")
    return n + sum(pq.read_metadata(p).num_rows for p in Lake(cfg.lake_root).list_files("raw/interactions"))


def refused(r: httpx.Response, field: str, status: int = 400) -> None:
    assert r.status_code == status, (field, r.status_code, r.text[:300])
    err = r.json()["error"]
    assert field in err["message"] and field in (err["param"] or ""), (field, err)


def test_integers_the_lake_cannot_hold_are_refused_before_anything_is_stored(gw):
    """turn_index 2**40, model_version 2**70, a token id 2**40: a 400 naming the field, not a 200 that breaks
    every later compaction; the valid event after them lands in the lake."""
    before = stored(gw)
    refused(post(gw, "/v1/chat/completions", CHAT, {"x-rtrl-turn-index": str(2**40)}), "x-rtrl-turn-index")
    refused(post(gw, "/v1/chat/completions", CHAT | {"metadata": {"turn_index": str(2**40)}}), "metadata.turn_index")
    for over, field in [({"turn_index": 2**40}, "turn_index"), ({"model_version": 2**70}, "model_version"),
                        ({"completion_token_ids": [3, 2**40]}, "completion_token_ids"),
                        ({"prompt_token_ids": [-1, 2]}, "prompt_token_ids"),
                        ({"latency_ms": 1e300}, "latency_ms"), ({"temperature": 1e39}, "temperature")]:
        refused(post(gw, "/v1/interactions", interaction(**over)), f"interaction.{field}")
    assert stored(gw) == before, "a refused event stores nothing"
    ok = interaction()
    assert post(gw, "/v1/interactions", ok).status_code == 200
    gw[2].collector.compact_now()  # raised ArrowInvalid on main, for every org's events
    rows = [r for p in Lake(gw[0].lake_root).list_files("raw/interactions") for r in pq.read_table(p).to_pylist()]
    assert [r["event_id"] for r in rows if r["event_id"] == ok["event_id"]] == [ok["event_id"]]


def test_non_finite_or_positive_logprobs_are_refused_at_the_boundary(gw):
    """-Infinity was accepted on main (then gate_raw refused every org's window); NaN, +inf and > 0 too: 400."""
    before = stored(gw)
    for lp in ("-Infinity", "Infinity", "NaN", "0.5", "-1e39"):
        body = json.dumps(interaction()).replace('"completion_logprobs": [-0.2, -0.3]',
                                                 f'"completion_logprobs": [-0.2, {lp}]')
        r = post(gw, "/v1/interactions", raw=body.encode())
        refused(r, "interaction.completion_logprobs")
        assert "completion_logprobs[1]" in r.json()["error"]["message"], r.text
    assert stored(gw) == before


def test_headers_and_metadata_are_checked_before_generation(gw):
    """A 300-character x-rtrl-user-id on a stream was served whole, then failed (500, nothing logged); other
    values were 500s. Each is now a 4xx naming its field, sent before a single chunk."""
    before = stored(gw)
    with httpx.stream("POST", gw[1] + "/v1/chat/completions", json=CHAT | {"stream": True}, timeout=60,
                      headers={"authorization": f"Bearer {TOKEN}", "x-rtrl-user-id": "u" * 300}) as r:
        body = r.read()
    assert r.status_code == 400 and b"data:" not in body, body[:200]
    assert "x-rtrl-user-id" in json.loads(body)["error"]["message"]
    cases = [
        (CHAT, {"x-rtrl-session-id": "s" * 300}, "x-rtrl-session-id", 400),
        (CHAT | {"metadata": {"turn_index": "\u00b2"}}, {}, "metadata.turn_index", 400),
        (CHAT, {"x-rtrl-turn-index": "\u00b2".encode()}, "x-rtrl-turn-index", 400),
        (CHAT | {"metadata": {"user_id": "a\x00b"}}, {}, "metadata.user_id", 400),
        (CHAT | {"user": "tab\there"}, {}, "user", 400),
        (CHAT | {"seed": 2**80}, {}, "seed", 400),
        (CHAT | {"model": "rtrl-policy/\u00b2"}, {}, "model", 404),
        (CHAT | {"model": "rtrl-policy/" + "9" * 5000}, {}, "model", 400),
    ]
    for body, headers, field, status in cases:
        refused(post(gw, "/v1/chat/completions", body, headers), field, status)
    assert stored(gw) == before, "nothing was generated, so nothing was logged"
    ok = post(gw, "/v1/chat/completions", CHAT, {"x-rtrl-user-id": "u" * 256, "x-rtrl-turn-index": "3"})
    assert ok.status_code == 200 and stored(gw) == before + 1


def test_text_that_utf8_cannot_carry_is_a_400_not_a_500(gw):
    """A lone UTF-16 surrogate (valid JSON, not valid Unicode) cannot be written to the WAL or to Parquet; JSON
    nested past the parser's recursion limit is refused as malformed instead of a RecursionError."""
    before = stored(gw)
    raw = json.dumps(interaction(completion_text="ok")).replace('"completion_text": "ok"',
                                                               '"completion_text": "ok\\ud800"')
    refused(post(gw, "/v1/interactions", raw=raw.encode()), "completion_text")
    chat = json.dumps(CHAT).replace("Write add(a, b).", "Write \\udc00 add")
    refused(post(gw, "/v1/chat/completions", raw=chat.encode()), "messages.0.content")
    deep = post(gw, "/v1/feedback", raw=b"[" * 100_000 + b"]" * 100_000)
    assert deep.status_code == 400 and "nested" in deep.json()["error"]["message"], deep.text[:200]
    assert stored(gw) == before


# --- gate_raw: one org's bad rows, written straight into the raw lake (a WAL or lake corruption) ------------

START, END = window(hours=2)
KNOWN = [1, 2]


def _plant(cfg, org: str, **bad) -> list[str]:
    """Rows of `org` that break row-level expectations, written directly as one more raw partition."""
    ts = START + timedelta(minutes=30)
    rows = [interaction_row(ts, org_id=org, user_id=f"{org}-u{i}", session_id=f"{org}-s{i}", **bad)
            for i in range(3)]
    Lake(cfg.lake_root).write_partition("interactions", ts, pa.Table.from_pylist(rows, schema=INTERACTIONS_SCHEMA),
                                        name=f"planted-{org}.parquet")
    return [r["event_id"] for r in rows]


def test_one_orgs_bad_rows_are_quarantined_without_refusing_the_others(cfg):
    lake = Lake(cfg.lake_root)
    generate(400, START, END, seed=11, lake=lake)  # org-acme, org-globex, org-initech: clean
    bad_ids = _plant(cfg, "org-mallory", completion_logprobs=[-0.5, float("-inf"), float("nan")])
    harvest(cfg, START, END, 2, "run-h")
    assert "org-mallory" in lake.read_parquet("runs/run-h/episodes.parquet")["org_id"].to_pylist()
    verdict = gate_raw(cfg, START, END, "run-h", known=KNOWN)  # main: GateFailed for every org
    assert verdict.passed
    q = verdict.details["quarantined"]["org-mallory"]
    assert q["interactions"] == 3 and "completion logprobs all finite and <= 0" in " ".join(q["reasons"])
    assert bad_ids[0] in " ".join(q["reasons"])
    assert read_verdict(lake, "run-h", "gate_raw").details["quarantined"].keys() == {"org-mallory"}
    assert "org-mallory" in lake.read_parquet("runs/run-h/episodes.parquet")["org_id"].to_pylist(), \
        "the gate only judges: the exclude stage drops the episodes"
    assert exclude(cfg, "run-h") == 3 and exclude(cfg, "run-h") == 0  # a rerun drops nothing more
    orgs = set(lake.read_parquet("runs/run-h/episodes.parquet")["org_id"].to_pylist())
    assert orgs == {"org-acme", "org-globex", "org-initech"}, "the good orgs' episodes go through, mallory's do not"
    assert gate_episodes(cfg, "run-h").passed
    assert lake.read_json("runs/run-h/harvest.json")["quarantined_orgs"] == ["org-mallory"]
    # the same defect in a second org's rows is the house's, not a tenant's: the whole window is refused
    _plant(cfg, "org-trudy", completion_logprobs=[-0.5, float("inf"), -0.1])
    with pytest.raises(GateFailed, match=r"completion logprobs all finite and <= 0 .*: 6 of"):
        gate_raw(cfg, START, END, "run-h2", known=KNOWN)
    assert not read_verdict(lake, "run-h2", "gate_raw").passed


def test_scripted_run_one_hostile_org_between_another_orgs_normal_traffic(gw):
    """Issue 44's scripted run: org-acme posts hostile events between org-globex's normal ones (the official
    openai client for chat, /v1/interactions and /v1/feedback), and rows an older gateway acknowledged reach
    the WAL. Every normal event reaches the lake; each hostile one is refused with a 4xx naming its field or
    quarantined with its reason; a second compaction is clean."""
    from openai import OpenAI

    from lab.testing.synth import interaction_row
    from rl_core.collect import quarantine

    cfg, base, gateway = gw
    globex = OpenAI(base_url=base + "/v1", api_key="rtrl-globex-token")
    hostile_http = [
        ("/v1/interactions", interaction(turn_index=2**40), {}, "interaction.turn_index"),
        ("/v1/interactions", interaction(completion_logprobs=[-0.1, 1e9]), {}, "interaction.completion_logprobs"),
        ("/v1/interactions", interaction(user_id="eve\nadmin"), {}, "interaction.user_id"),
        ("/v1/interactions", interaction(model_version=2**70), {}, "interaction.model_version"),
        ("/v1/chat/completions", CHAT, {"x-rtrl-user-id": "u" * 300}, "x-rtrl-user-id"),
        ("/v1/chat/completions", CHAT | {"seed": 2**80}, {}, "seed"),
        ("/v1/feedback", {"event_id": str(uuid.uuid4()), "kind": "thumbs", "value_bool": True,
                          "ts": "2026-12-02T09:00:00+00:00", "feedback_id": "f" * 300}, {}, "feedback_id"),
    ]
    normal: list[str] = []
    for i, (path, body, headers, field) in enumerate(hostile_http):
        reply = globex.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": f"add {i} and 1"}], max_tokens=4,
            extra_headers={"x-rtrl-user-id": f"g{i}"})
        normal.append(reply.headers["x-rtrl-event-id"])
        r = post(gw, path, body, headers)
        assert 400 <= r.status_code < 500 and field in r.text, (field, r.status_code, r.text[:200])
        logged = interaction(user_id=f"g{i}", event_id=str(uuid.uuid4()))
        gr = httpx.post(base + "/v1/interactions", json=logged, timeout=60,
                        headers={"authorization": "Bearer rtrl-globex-token"})
        assert gr.status_code == 200, gr.text
        normal.append(logged["event_id"])
    # what an older gateway acknowledged before the boundary existed: straight into the WAL
    now = datetime(2026, 12, 2, 9, 30, tzinfo=timezone.utc)
    old = [interaction_row(now, org_id="org-acme", turn_index=2**40),
           interaction_row(now, org_id="org-acme", completion_token_ids=[1, 2**40])]
    for row in old:
        gateway.collector.log_interaction(row).result(timeout=30)
    first = gateway.collector.compact_now()
    lake = Lake(cfg.lake_root)
    landed = {e for p in lake.list_files("raw/interactions") for e in pq.read_table(p, columns=["event_id"])
              ["event_id"].to_pylist()}
    assert set(normal) <= landed, "a normal event of org-globex did not reach the lake"
    held = {r["event_id"]: r["reason"] for p in lake.list_files("quarantine/interactions")
            for r in pq.read_table(p).to_pylist()}
    assert {r["event_id"] for r in old} <= set(held) and all("ArrowInvalid" in held[r["event_id"]] for r in old)
    assert quarantine.status(lake).count >= len(old) and first is not None
    second = gateway.collector.compact_now()
    assert quarantine.status(lake).count == len(held), "the second pass quarantined more"
    assert gateway.collector.last_compaction_error is None and second is not None
