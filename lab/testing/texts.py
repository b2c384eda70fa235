"""What the generated traffic says: prompts, tool specs, completions by answer kind, follow-ups.

Short, realistic shapes only; the classifiers are evaluated on tests/data, not on these. synth draws from the
first pools, ab_synth from its own shorter follow-ups (their sizes fix the seeded draws, so they stay two lists).
"""

from __future__ import annotations

import json

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests", "description": "Run the test suite",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "k": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "apply_patch", "description": "Apply a unified diff",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "diff": {"type": "string"}},
                    "required": ["path", "diff"]}}},
]

PROMPTS = [
    "Fix the off-by-one error in utils/paginate.py", "Why does this test fail with KeyError: 'id'?",
    "Add type hints to the parse_config function", "Write a unit test for the retry decorator",
    "Refactor this loop into a list comprehension", "How do I read a CSV with pandas and skip bad lines?",
    "Rename the variable tmp to buffer everywhere in this file", "Make this function async",
    "The CI says ruff found unused imports, fix them", "Explain what this regex does: ^\\d{3}-\\w+$",
    "Add a --verbose flag to the CLI", "Why is my Dockerfile rebuilding every time?",
    "Convert this callback code to use promises", "Speed up this SQL query, it scans the whole table",
    "Add logging to the payment handler", "Write a docstring for this class",
]

FOLLOWUPS_NEG = [
    "that's wrong, it still fails", "no, this doesn't work", "you broke the build", "still getting the same error",
    "that is not what I asked", "ugh, revert that", "this is useless", "why did you delete my function?",
    "wrong file", "it doesn't compile now", "nope, same KeyError", "stop changing unrelated code",
]
FOLLOWUPS_OK = [
    "thanks, that works", "great, now add a test for it", "perfect", "ok, can you also update the README?",
    "looks good, what about the edge case when the list is empty?", "nice, next rename the module",
    "cool. how do I run it locally?", "now do the same for the other handler", "thank you!",
    "and can you make it faster?", "makes sense", "what does the second argument do?",
]

AB_DISSATISFIED = ("that's wrong, it still fails", "this doesn't work", "no, that is not what i asked",
                   "still broken after your change", "wrong file, try again")
AB_NEUTRAL = ("thanks, now add a test for it", "great. next rename the helper", "ok, also update the docstring",
              "looks good, can you explain this part?")


def _call(name: str, args) -> tuple[str, str]:
    raw = json.dumps({"name": name, "arguments": args})
    calls = [{"id": "call_0", "type": "function",
              "function": {"name": name, "arguments": json.dumps(args) if not isinstance(args, str) else args}}]
    return f"<tool_call>{raw}</tool_call>", json.dumps(calls)


def completion_pools() -> tuple[list[list[str]], list[list[str | None]]]:
    """Completion texts and their tool_calls JSON by answer kind: code, broken call, call, clarify, refusal, empty."""
    code = [
        "Here is the fix:\n```python\nfor i in range(len(items)):\n    yield items[i]\n```",
        "The loop stops one element early. Change `range(n - 1)` to `range(n)`.",
        "```python\ndef parse_config(path: str) -> dict[str, str]:\n    ...\n```\nThis adds the hints.",
        "Use `pd.read_csv(path, on_bad_lines='skip')`.",
        "```python\n@retry(times=3)\ndef flaky():\n    raise IOError\n\ndef test_retry():\n    ...\n```",
        "Add an index on `orders(customer_id)`; the query then uses an index scan.",
    ]
    broken_text = ['<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>',
                   '<tool_call>{"name": "run_tests" "arguments": {}}</tool_call>']
    broken_calls = [json.dumps([{"id": "call_0", "type": "function", "function": {"name": "__invalid__",
                                                                                  "arguments": t[11:-12]}}])
                    for t in broken_text]
    schema_broken = [_call("read_file", {"file": "a.py"}), _call("apply_patch", {"path": 3, "diff": "-x"}),
                     _call("delete_repo", {"name": "x"})]
    valid = [_call("read_file", {"path": "src/app.py"}), _call("run_tests", {"path": "tests/", "k": "retry"}),
             _call("apply_patch", {"path": "utils/paginate.py", "diff": "@@ -1 +1 @@\n-a\n+b"}),
             _call("run_tests", {})]
    clarify = ["Which file do you mean, utils/paginate.py or api/paginate.py?",
               "Could you share the full traceback?", "Do you want me to keep the old behaviour as well?",
               "What Python version are you on?"]
    refusal = ["I'm sorry, but I can't help with that.", "I cannot assist with this request.",
               "As an AI language model, I am unable to do that."]
    texts = [code, broken_text + [t for t, _ in schema_broken], [t for t, _ in valid], clarify, refusal, [""]]
    calls = [[None] * len(code), broken_calls + [c for _, c in schema_broken], [c for _, c in valid],
             [None] * len(clarify), [None] * len(refusal), [None]]
    return texts, calls


def prompts_json(prompts: list[str]) -> list[str]:
    """Each prompt twice: plain messages, then messages + tools (the serving's {"messages", "tools"} JSON)."""
    out = []
    for p in prompts:
        msgs = [{"role": "system", "content": "You are a helpful coding assistant."}, {"role": "user", "content": p}]
        out.append(json.dumps({"messages": msgs}))
        out.append(json.dumps({"messages": msgs, "tools": TOOLS}))
    return out
