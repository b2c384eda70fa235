"""One task, one policy, one episode: the multi-turn agent loop and its score.

The model sees a system prompt, the user's terse request with the repository's files attached (as an
IDE would attach open files), and the task's tools. Each turn its tool calls run against a private
working copy; the loop ends when it answers without a tool call or the turn budget is spent. An answer
that changed no file but holds a code block is applied over the task's `target` file, as a user applies
it in the IDE (and as the simulated users do). Then the hidden tests judge the final working copy from
outside the sandbox (evals/judge.py).

A suite runs each task `samples` times; sample k of a task draws with seeds derived from (budget seed,
task id, k, turn), so a rerun repeats its draws and a candidate and its baseline are paired by sample. Nothing the model
writes runs outside the sandbox, and nothing of the hidden tests runs inside it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evals import sandbox
from evals.judge import judge
from evals.policies import Policy
from evals.tasks import Task
from evals.tools import Workspace, openai_tools
from rl_core.features import CODE_BLOCK_RE, Answer, code_block

# No system prompt: the request reaches the model as the simulated users (and an IDE) send it, so the suite
# measures what users get. Measured on SmolLM2-135M (10 band candidates x 4 samples, T 0.8): an assistant system
# prompt and the files after the request passed 3 of 40; the files first, fenced, as the IDE attaches them, 2-3
# of 40 with or without the system prompt; the sampling temperature moves it most (T 0.4: 6, T 0.2: 8 of 40).
SYSTEM_PROMPT = ""


@dataclass
class Budget:
    max_turns: int = 4
    max_tokens: int = 256
    temperature: float = 0.0
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    samples: int = 1  # episodes per task (k)
    seed: int = 0

    @classmethod
    def from_config(cls, ec) -> Budget:
        """From a config.EvalConfig."""
        return cls(ec.max_turns, ec.max_tokens, ec.temperature, sandbox.Limits(timeout_s=ec.timeout_s), ec.samples,
                   ec.seed)

    def draw_seed(self, task_id: str, sample: int, turn: int) -> int:
        """The sampling seed of one request: stable across runs, processes and policies."""
        digest = hashlib.sha256(f"{self.seed}:{task_id}:{sample}:{turn}".encode()).digest()
        return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass
class TaskResult:
    task_id: str
    kind: str
    policy: str
    passed: bool
    hidden_passed: int
    hidden_failed: int
    test_status: str  # the sandbox status of the hidden-test run
    turns: int
    tool_calls: int
    valid_tool_calls: int
    clarified: bool  # asked a question instead of acting (no file changed before it)
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float  # time spent in the policy
    duration_s: float  # the whole episode, hidden tests included
    error: str = ""
    transcript: str = "[]"  # JSON of the messages, for reading a failure
    wrote_code: bool = False  # changed a file or answered with a complete code block (an update must not lose it)
    sample: int = 0  # which of the task's `samples` episodes (pairs a candidate's sample k with its baseline's)

    @property
    def invalid_tool_rate(self) -> float:
        return 1.0 - self.valid_tool_calls / self.tool_calls if self.tool_calls else 0.0

    def row(self) -> dict:
        return {**asdict(self), "invalid_tool_rate": self.invalid_tool_rate}


def request_text(task: Task) -> str:
    """The user's message as the IDE sends it: the repository's files attached as fenced code blocks, then the
    request (the same shape as the simulated users' messages, lab/simulate/users.request_text)."""
    files = [f"{path}:\n```python\n{text.rstrip()}\n```\n" for path, text in sorted(task.files.items())]
    return "".join(files) + task.prompt.strip()


def apply_answer(task: Task, ws: Workspace, text: str) -> bool:
    """The IDE's apply: an answer's first code block written over the task's target file. True if applied."""
    m = CODE_BLOCK_RE.search(text or "") if task.target else None
    if m is None:
        return False
    return ws.execute("write_file", json.dumps({"path": task.target, "content": m.group(1)})).ok


def run_episode(task: Task, policy: Policy, budget: Budget, sample: int = 0) -> TaskResult:
    t0 = time.perf_counter()
    tools = openai_tools(task.tools)
    system = [{"role": "system", "content": SYSTEM_PROMPT}] if SYSTEM_PROMPT else []
    messages: list[dict] = [*system, {"role": "user", "content": request_text(task)}]
    turns = calls = valid = p_tok = c_tok = 0
    latency = 0.0
    clarified = wrote = False
    error = ""
    with tempfile.TemporaryDirectory(prefix="rtrl-ep-") as tmp:
        ws = Workspace(Path(tmp), task.files, task.tools, budget.limits)
        original = ws.snapshot()
        try:
            for _ in range(budget.max_turns):
                c = policy.complete(messages, tools, budget.max_tokens, budget.temperature,
                                    seed=budget.draw_seed(task.id, sample, turns))
                turns += 1
                p_tok += c.prompt_tokens
                c_tok += c.completion_tokens
                latency += c.latency_ms
                wrote = wrote or code_block(Answer(c.content or ""))
                msg: dict = {"role": "assistant", "content": c.content}
                if c.tool_calls:
                    msg["tool_calls"] = c.tool_calls
                messages.append(msg)
                if not c.tool_calls:
                    unchanged = ws.snapshot() == original
                    clarified = "?" in c.content and unchanged
                    if unchanged:
                        apply_answer(task, ws, c.content)
                    break
                for call in c.tool_calls:
                    res = ws.execute(call["function"]["name"], call["function"].get("arguments") or "")
                    calls += 1
                    valid += res.valid
                    messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": res.content})
        except Exception as exc:  # the policy failed (HTTP error, OOM...): the task fails, the suite goes on
            error = f"{type(exc).__name__}: {exc}"[:500]
        final = ws.snapshot()
    tr = judge(final, task.hidden_tests, budget.limits)  # the hidden tests never enter the work dir
    return TaskResult(
        task.id, task.kind, policy.name, tr.passed and not error, tr.n_passed, tr.n_failed, tr.status, turns, calls,
        valid, clarified, p_tok, c_tok, round(latency, 1), round(time.perf_counter() - t0, 3), error,
        json.dumps(messages)[:50_000], wrote or final != original, sample,
    )
