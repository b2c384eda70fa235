"""Tool calls as text: how OpenAI-style tools and tool calls are put into a small model's prompt and read back.

SmolLM2's chat template knows only system/user/assistant turns, so tools are described in the system
message and the model answers a call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(the Hermes/Qwen convention). Serving, evals and the simulator all use this one module, so a tool call
means the same thing everywhere. A call whose JSON does not parse is kept as a *broken* call (name
"__invalid__", raw text in arguments): rewards treat it as a negative example, never drop it.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
INVALID = "__invalid__"


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    specs = [t.get("function", t) for t in tools]
    lines = [
        "You can call these tools. To call one, answer with",
        '<tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call>',
        "Tools:",
    ]
    lines += [json.dumps({"name": s.get("name"), "description": s.get("description", ""),
                          "parameters": s.get("parameters", {})}, separators=(",", ":")) for s in specs]
    return "\n".join(lines)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def render_tool_call(call: dict[str, Any]) -> str:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"<tool_call>{args}</tool_call>"
    return "<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args}, separators=(",", ":")) + "</tool_call>"


def to_template_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """OpenAI chat messages (+ tools) -> plain {role, content} turns any chat template can render."""
    out: list[dict[str, str]] = []
    tool_text = tools_system_text(tools) if tools else ""
    for m in messages:
        role = m.get("role")
        text = _content_text(m.get("content"))
        if role in ("system", "developer"):
            out.append({"role": "system", "content": text})
        elif role == "assistant":
            calls = "".join(render_tool_call(c) for c in (m.get("tool_calls") or []))
            out.append({"role": "assistant", "content": (text + calls) if text or calls else ""})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>{text}</tool_response>"})
        else:
            out.append({"role": "user", "content": text})
    if tool_text:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + tool_text}
        else:
            out.insert(0, {"role": "system", "content": tool_text})
    return out


def parse(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Model text -> (content without the calls, OpenAI-format tool_calls). Broken JSON -> an __invalid__ call."""
    calls: list[dict[str, Any]] = []
    for raw in TOOL_CALL_RE.findall(text):
        name, args = INVALID, raw
        try:
            obj = json.loads(raw)
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                name = obj["name"]
                a = obj.get("arguments", {})
                args = a if isinstance(a, str) else json.dumps(a)
        except json.JSONDecodeError:
            pass
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name, "arguments": args}})
    content = TOOL_CALL_RE.sub("", text).strip() if calls else text
    return content, calls


def prompt_ids(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """The prompt as the engine sees it: rendered with the chat template once (the gateway logs these very ids;
    the replay and the eval send them to the same engine, so nothing is tokenized twice)."""
    out = tokenizer.apply_chat_template(to_template_messages(messages, tools), add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]
