"""The agent harness with real policies: transformers in-process on the tiny checkpoint, and the official
openai client over real HTTP (a small OpenAI-wire server on 127.0.0.1 standing in for the gateway)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from evals.harness import Budget, request_text, run_episode
from evals.policies import BrokenToolPolicy, Completion, LocalPolicy, OpenAIPolicy, OraclePolicy
from evals.runner import aggregate, results_table, run_suite
from evals.sandbox import Limits
from evals.tasks import load_tasks

TASKS = load_tasks(Path(__file__).resolve().parent.parent / "evals" / "tasks")
BY_ID = {t.id: t for t in TASKS}


def test_local_policy_runs_episodes_on_the_tiny_checkpoint(tiny_checkpoint):
    policy = LocalPolicy(tiny_checkpoint)
    tasks = [BY_ID["bugfix-is-even"], BY_ID["ambiguous-divide-zero"]]
    budget = Budget(max_turns=2, max_tokens=16, limits=Limits(timeout_s=10))
    results = run_suite(tasks, policy, budget, workers=2, progress=False)
    assert [r.task_id for r in results] == [t.id for t in tasks]
    for r in results:
        assert r.error == "" and r.turns >= 1 and r.prompt_tokens > 100
        assert 1 <= r.completion_tokens <= 16 * r.turns
        assert not r.passed  # a random tiny model does not fix bugs
        assert r.test_status in ("failed", "passed")
        assert json.loads(r.transcript)[0]["content"].endswith(tasks[results.index(r)].prompt)  # files, then the ask
    again = run_suite(tasks, policy, budget, workers=1, progress=False)
    assert [r.transcript for r in again] == [r.transcript for r in results]  # greedy: reproducible
    table = results_table(results, "candidate")
    assert table.num_rows == 2 and {"task_id", "passed", "clarified", "invalid_tool_rate"} <= set(table.column_names)


def test_oracle_and_broken_tool_policies_are_scored(tmp_path):
    task = BY_ID["feature-clamp"]
    good = run_episode(task, OraclePolicy(TASKS), Budget())
    assert good.passed and good.hidden_passed == 1 and good.tool_calls == 1 and good.valid_tool_calls == 1
    bad = run_episode(task, BrokenToolPolicy(), Budget())
    assert not bad.passed and bad.tool_calls == 1 and bad.valid_tool_calls == 0 and bad.invalid_tool_rate == 1.0
    assert good.wrote_code and not bad.wrote_code  # a file changed; a broken call changes none and shows no code

    class Pasting:  # answers with a complete code block and no tool call (what SmolLM2 does)
        name = "scripted:pasting"

        def complete(self, messages, tools, max_tokens, temperature, seed=None):
            return Completion("Here:\n```python\ndef clamp(x, lo, hi):\n    return x\n```", [], 10, 10, 0.0, "stop")

    pasted = run_episode(task, Pasting(), Budget())
    assert pasted.wrote_code and not pasted.passed and pasted.tool_calls == 0
    agg = aggregate([good, bad])
    assert agg["pass_rate"] == 0.5 and agg["tool_call_validity_rate"] == 0.5


class _Wire(BaseHTTPRequestHandler):
    """OpenAI chat-completions wire format: first a write_file tool call, then a plain answer."""

    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Wire.bodies.append(body)
        if any(m["role"] == "tool" for m in body["messages"]):
            message = {"role": "assistant", "content": "Fixed."}
            finish = "stop"
        else:
            args = json.dumps({"path": "nums.py", "content": "def is_even(n):\n    return n % 2 == 0\n"})
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": args}}]}
            finish = "tool_calls"
        out = json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                          "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                          "usage": {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


def test_openai_policy_over_real_http():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Wire)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        policy = OpenAIPolicy(f"http://127.0.0.1:{server.server_port}/v1", model="champion")
        r = run_episode(BY_ID["bugfix-is-even"], policy, Budget(max_turns=3))
    finally:
        server.shutdown()
        server.server_close()
    assert r.passed and r.turns == 2 and r.tool_calls == 1 and r.valid_tool_calls == 1
    assert r.prompt_tokens == 100 and r.completion_tokens == 14
    first, second = _Wire.bodies[-2:]
    assert first["model"] == "champion" and {t["function"]["name"] for t in first["tools"]} >= {"write_file"}
    assert first["messages"][0] == {"role": "user", "content": request_text(BY_ID["bugfix-is-even"])}  # as the IDE sends it
    tool_msg = second["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "call_1" and "wrote nums.py" in tool_msg["content"]


def test_policy_failure_fails_the_task_not_the_suite():
    policy = OpenAIPolicy("http://127.0.0.1:9/v1", timeout_s=2)  # nothing listens on port 9
    r = run_episode(BY_ID["bugfix-is-even"], policy, Budget(max_turns=1))
    assert not r.passed and "Connection" in r.error
