"""The gateway over real HTTP with the official openai SDK: completions (plain, streaming, tools),
models, feedback, interactions, auth, bad input, health, metrics; every completion is logged durably."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import openai
import pyarrow.parquet as pq
import pytest
from conftest import http_interaction as _interaction
from conftest import served_gateway

from rl_core.lake import Lake

REPO = Path(__file__).resolve().parent.parent
TOKEN, ORG = "rtrl-acme-token", "org-acme"


@pytest.fixture(scope="module")
def gw(tmp_path_factory, tiny_checkpoint):
    """One gateway for the module: tiny model registered as v1 champion, served on a free port."""
    with served_gateway(tmp_path_factory, tiny_checkpoint, "gw", RTRL_SERVING__MAX_BODY_BYTES="200000") as g:
        yield g


@pytest.fixture
def client(gw):
    return openai.OpenAI(base_url=gw[1] + "/v1", api_key=TOKEN, max_retries=0)


def lake_rows(cfg, table: str) -> list[dict]:
    lake = Lake(cfg.lake_root)
    return [r for p in lake.list_files(f"raw/{table}") for r in pq.read_table(p).to_pylist()]


def wal_rows(cfg, kind: str) -> list[dict]:
    from rl_core.collect import wal

    out = []
    for seg in [*wal.sealed_segments(cfg.wal_dir), *wal.open_segments(cfg.wal_dir)]:
        out += [r for k, r in wal.read_segment(seg) if k == kind]
    return out


def logged(cfg, event_id: str) -> dict:
    rows = [r for r in wal_rows(cfg, "interactions") + lake_rows(cfg, "interactions") if r["event_id"] == event_id]
    assert rows, f"interaction {event_id} was acknowledged but is not in the WAL or lake"
    return rows[0]


def test_chat_completion_is_logged_with_tokens_logprobs_and_version(gw, client):
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Write add(a, b)."}], max_tokens=12, temperature=0.8,
        top_p=0.95, seed=1, user="alice", logprobs=True)
    r = raw.parse()
    eid = raw.headers["x-rtrl-event-id"]
    assert raw.headers["x-rtrl-model-version"] == "1" and r.id == f"chatcmpl-{eid}"
    assert r.usage.completion_tokens == len(r.choices[0].logprobs.content) > 0
    row = logged(gw[0], eid)
    assert row["org_id"] == ORG and row["user_id"] == "alice" and row["model_version"] == 1 and row["arm"] == "champion"
    assert len(row["completion_token_ids"]) == len(row["completion_logprobs"]) == r.usage.completion_tokens
    assert len(row["prompt_token_ids"]) == r.usage.prompt_tokens
    assert [c.logprob for c in r.choices[0].logprobs.content] == pytest.approx(row["completion_logprobs"])
    assert json.loads(row["messages"])["messages"][0]["content"] == "Write add(a, b)."
    assert row["temperature"] == 0.8 and row["top_p"] == 0.95 and row["latency_ms"] > 0


def test_streaming_with_sdk_matches_logged_event(gw, client):
    with client.chat.completions.with_streaming_response.create(
            model="champion", messages=[{"role": "user", "content": "hi"}], max_tokens=10, seed=4, stream=True,
            stream_options={"include_usage": True}, extra_headers={"x-rtrl-session-id": "sess-1"}) as resp:
        eid = resp.headers["x-rtrl-event-id"]
        chunks = list(resp.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish and chunks[-1].usage.completion_tokens > 0
    row = logged(gw[0], eid)
    assert row["completion_text"] == text and row["session_id"] == "sess-1"
    assert len(row["completion_token_ids"]) == chunks[-1].usage.completion_tokens


def test_tool_calls_are_rendered_and_parsed(gw, client, monkeypatch):
    """The tiny model cannot write a tool call, so the backend's text is what a real model would write."""
    from rl_core.serving.backends.base import Generation

    tools = [{"type": "function", "function": {"name": "read_file", "description": "read a file",
                                                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    lease = gw[2].router.route("champion", "x")  # the served backend object
    backend = lease.backend
    lease.release()
    seen = {}

    def fake_generate(ids, sampling):
        seen["prompt"] = backend.tokenizer.decode(ids)
        ids_out = backend.tokenizer.encode('<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>')
        return Generation(ids_out, [-0.1] * len(ids_out), backend.tokenizer.decode(ids_out), "stop", 1.0)

    monkeypatch.setattr(backend, "generate", fake_generate)
    raw = client.chat.completions.with_raw_response.create(
        model="champion", messages=[{"role": "user", "content": "open a.py"}], tools=tools, max_tokens=30)
    r = raw.parse()
    assert "read_file" in seen["prompt"] and "<tool_call>" in seen["prompt"], "tools are rendered into the prompt"
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "read_file" and json.loads(call.function.arguments) == {"path": "a.py"}
    row = logged(gw[0], raw.headers["x-rtrl-event-id"])
    assert json.loads(row["tool_calls"])[0]["function"]["name"] == "read_file"
    assert json.loads(row["messages"])["tools"][0]["function"]["name"] == "read_file"


def test_models_health_metrics(gw, client):
    ids = [m.id for m in client.models.list().data]
    assert ids[:2] == ["auto", "champion"] and "rtrl-policy/1" in ids
    h = httpx.get(gw[1] + "/healthz")
    assert h.status_code == 200 and h.json()["serving"] == {"champion": 1}
    m = httpx.get(gw[1] + "/metrics").text
    assert 'rtrl_alias_version{alias="champion"} 1.0' in m and "rtrl_wal_ack_seconds_bucket" in m
    assert "rtrl_requests_total" in m


def test_auth_required_and_org_from_token(gw):
    body = {"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw[1] + "/v1", api_key="wrong", max_retries=0).chat.completions.create(**body)
    r = httpx.post(gw[1] + "/v1/chat/completions", json=body)
    assert r.status_code == 401 and "bearer" in r.json()["error"]["message"]


def post(gw, path: str, body, token: str = TOKEN, raw: bytes | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    return httpx.post(gw[1] + path, content=raw if raw is not None else json.dumps(body), headers=headers)


BAD_CHAT = [
    (b"{not json", 400, "malformed JSON"),
    (json.dumps({"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_token": 5}).encode(), 400, "max_token"),
    (json.dumps({"model": "auto", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({"model": "auto", "messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "messages.0.role"),
    (json.dumps({"model": "auto", "messages": []}).encode(), 400, "messages"),
    (json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).encode(), 404, "gpt-9"),
    (json.dumps({"model": "rtrl-policy/7", "messages": [{"role": "user", "content": "x"}]}).encode(), 404, "rtrl-policy/7"),
    (json.dumps({"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_tokens": 99999}).encode(), 400, "max_tokens"),
    (json.dumps({"model": "auto", "messages": [{"role": "user", "content": "x" * 300000}]}).encode(), 413, "exceeds the limit"),
]


@pytest.mark.parametrize("raw,status,needle", BAD_CHAT)
def test_bad_chat_requests_are_4xx_naming_the_problem_and_store_nothing(gw, raw, status, needle):
    before = len(wal_rows(gw[0], "interactions")) + len(lake_rows(gw[0], "interactions"))
    r = post(gw, "/v1/chat/completions", None, raw=raw)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    assert len(wal_rows(gw[0], "interactions")) + len(lake_rows(gw[0], "interactions")) == before


def _completion_event(gw) -> str:
    r = post(gw, "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    assert r.status_code == 200
    return r.headers["x-rtrl-event-id"]


def test_feedback_accepted_for_own_event_and_refused_otherwise(gw):
    eid = _completion_event(gw)
    ok = post(gw, "/v1/feedback", {"event_id": eid, "kind": "thumbs", "value_bool": True})
    assert ok.status_code == 200 and ok.json()["accepted"] == 1
    fid = ok.json()["feedback_ids"][0]
    assert any(r["feedback_id"] == fid and r["org_id"] == ORG for r in wal_rows(gw[0], "feedback"))
    batch = post(gw, "/v1/feedback", [{"event_id": eid, "kind": "edit_applied"},
                                      {"event_id": eid, "kind": "edit_persisted", "value_float": 2.0}])
    assert batch.status_code == 200 and batch.json()["accepted"] == 2
    n = len(wal_rows(gw[0], "feedback"))
    cases = [
        ({"event_id": str(uuid.uuid4()), "kind": "thumbs", "value_bool": True}, TOKEN, 404, "no such interaction"),
        ({"event_id": eid, "kind": "thumbs", "value_bool": True}, "rtrl-globex-token", 404, "no such interaction"),
        ({"event_id": eid, "kind": "thumbs"}, TOKEN, 400, "thumbs needs value_bool"),
        ({"event_id": eid, "kind": "liked", "value_bool": True}, TOKEN, 400, "feedback.kind"),
        ({"event_id": eid, "kind": "thumbs", "value_bool": True, "org_id": "org-globex"}, TOKEN, 400, "org_id"),
        ({"event_id": eid, "kind": "thumbs", "value_bool": True, "color": 1}, TOKEN, 400, "feedback.color"),
        ([{"event_id": eid, "kind": "thumbs", "value_bool": True}, {"event_id": "nope", "kind": "session_end"}],
         TOKEN, 400, "events[1].event_id"),
    ]
    for body, token, status, needle in cases:
        r = post(gw, "/v1/feedback", body, token=token)
        assert r.status_code == status and needle in r.json()["error"]["message"], (body, r.text)
    assert len(wal_rows(gw[0], "feedback")) == n, "a refused request (even half of a batch) stores nothing"


def test_interactions_from_another_stack_are_validated_and_idempotent(gw):
    ev = _interaction()
    r = post(gw, "/v1/interactions", ev)
    assert r.status_code == 200 and r.json() == {"accepted": 1, "duplicates": 0, "event_ids": [ev["event_id"]]}
    again = post(gw, "/v1/interactions", {"events": [ev]})
    assert again.json()["accepted"] == 0 and again.json()["duplicates"] == 1
    assert post(gw, "/v1/feedback", {"event_id": ev["event_id"], "kind": "session_end"}).status_code == 200
    n = len(wal_rows(gw[0], "interactions"))
    bad = [
        (_interaction(completion_logprobs=[-0.1]), 400, "one logprob per completion token"),
        (_interaction(completion_logprobs=[0.5, -1.0]), 400, "completion_logprobs"),
        (_interaction(model_version=0), 400, "interaction.model_version"),
        (_interaction(arm="blue"), 400, "interaction.arm"),
        (_interaction(event_id="abc"), 400, "event_id must be a UUID"),
        (_interaction(org_id="org-globex"), 400, "org_id"),
        (_interaction(extra_field=1), 400, "interaction.extra_field"),
        (_interaction(event_id=ev["event_id"]), 409, "already used"),
    ]
    for body, status, needle in bad:
        token = "rtrl-globex-token" if status == 409 else TOKEN
        if status == 409:
            body.pop("org_id", None)
        r = post(gw, "/v1/interactions", body, token=token)
        assert r.status_code == status and needle in r.json()["error"]["message"], (needle, r.text)
    assert len(wal_rows(gw[0], "interactions")) == n


def test_acknowledged_events_reach_the_lake_once(gw):
    eid = _completion_event(gw)
    gw[2].collector.compact_now()
    rows = [r for r in lake_rows(gw[0], "interactions") if r["event_id"] == eid]
    assert len(rows) == 1 and rows[0]["org_id"] == ORG
    assert wal_rows(gw[0], "interactions") == []
