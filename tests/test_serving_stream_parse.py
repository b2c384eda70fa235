"""The vLLM backend's streamed answer, parsed from the engine's bytes however they are cut (rl_core/serving/backends/
vllm.py _sse_pieces), and the gateway's async vLLM path end to end: bench/gateway_cpu.py serves the real gateway over
the real VLLMBackend against a paced stand-in engine and drives it with the official `openai` client, streamed and
not (the vLLM engine itself is tests/test_serving_vllm.py's, slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rl_core.serving.backends.vllm import _sse_pieces

ROOT = Path(__file__).resolve().parent.parent


def _event(i: int, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": f" tok{i} é", "token_ids": [100 + i], "finish_reason": finish,
              "logprobs": {"token_logprobs": [-0.25 * (i + 1)], "tokens": [f" tok{i}"]}}
    return b"data: " + json.dumps({"id": "cmpl-1", "choices": [choice]}, ensure_ascii=False).encode() + b"\n\n"


STREAM = (b": keep-alive\n\n" + _event(0) + b"data: " + json.dumps({"id": "cmpl-1", "choices": []}).encode() + b"\n\n"
          + _event(1) + _event(2, "length") + b"data: [DONE]\n\n")


def _parse(reads: list[bytes]) -> tuple[list, bytes]:
    out, rest = [], b""
    for data in reads:
        pieces, rest = _sse_pieces(rest + data)
        out += pieces
    return out, rest


def test_a_stream_parses_the_same_whatever_its_reads_cut():
    whole, rest = _parse([STREAM])
    assert rest == b""
    assert [p.token_ids for p in whole] == [[100], [101], [102]]
    assert [p.logprobs for p in whole] == [[-0.25], [-0.5], [-0.75]]
    assert "".join(p.text for p in whole) == " tok0 é tok1 é tok2 é"  # a character cut between reads is kept whole
    assert [p.finish_reason for p in whole] == [None, None, "length"]
    for size in (1, 2, 7, 64):  # every cut, inside a line, a UTF-8 character and the blank line between events
        got, rest = _parse([STREAM[i:i + size] for i in range(0, len(STREAM), size)])
        assert got == whole and rest == b"", size


def test_an_unfinished_line_waits_for_the_next_read():
    line = _event(5)
    got, rest = _sse_pieces(line[:40])
    assert got == [] and rest == line[:40]
    got, rest = _sse_pieces(rest + line[40:])
    assert [p.token_ids for p in got] == [[105]] and rest == b""


def test_the_gateway_streams_and_answers_through_the_async_vllm_path(tmp_path):
    """Real gateway, real VLLMBackend (aiohttp to the engine), real HTTP, the official client: every request of both
    modes gets all its tokens (the stream's usage chunk comes after its row is durable), and the bench prints its
    table of the gateway's CPU."""
    out = tmp_path / "cpu.json"
    run = subprocess.run([sys.executable, str(ROOT / "bench/gateway_cpu.py"), "--requests", "8", "--tokens", "12",
                          "--token-ms", "1", "--json", str(out)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"plain", "stream"}
    for r in rows.values():
        assert r["tokens"] == 8 * 12 and r["cpu_s"] > 0, r
    assert "| stream | 8 |" in run.stdout and "gateway CPU ms per token" in run.stdout, run.stdout
