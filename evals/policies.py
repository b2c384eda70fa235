"""The model under test, as a small protocol: `complete(messages, tools, max_tokens, temperature) -> Completion`.

Four kinds of policy answer it:
- EnginePolicy: a serving engine on a checkpoint folder (vLLM where it runs, else transformers: the
  rl_core.serving.backends the gateway uses), prompts rendered and tokenized once with the gateway's own
  rl_core.toolcalls.prompt_ids, each request seeded. The suite's worker threads keep many requests in
  flight, so vLLM batches them: the eval generates like production serves.
- LocalPolicy: transformers in-process on an HF checkpoint folder, rendering tools and tool calls with
  rl_core.toolcalls (the same convention serving uses) and parsing the reply back with toolcalls.parse.
- OpenAIPolicy: the official openai client against an OpenAI-compatible base_url (the production
  gateway, or any vLLM server), so an eval exercises exactly what users get.
- Scripted policies (Oracle, Asking, BrokenTool): deterministic behaviours used to plant good and bad
  candidates. They are real policies of the protocol, speaking the same tool-call text convention.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rl_core import toolcalls
from rl_core.models import load_model


@dataclass
class Completion:
    content: str  # the assistant text without tool calls
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI format
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    finish_reason: str = "stop"


class Policy(Protocol):
    name: str

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int,
                 temperature: float, seed: int | None = None) -> Completion: ...
    # seed: the sampling seed of this request (the harness derives one per task, sample and turn), so a sampled
    # suite run is repeatable and a candidate and its baseline draw with the same seeds (paired by sample)


class LocalPolicy:
    """transformers generate on a checkpoint folder. One lock: the model is shared by the worker threads
    (generation is serialised, sandboxed test runs of other tasks still overlap with it)."""

    def __init__(self, folder: str | Path, dtype: str = "float32", name: str | None = None):
        self.folder = Path(folder)
        if not (self.folder / "config.json").is_file():
            raise FileNotFoundError(f"{self.folder} is not an HF checkpoint folder (no config.json)")
        self.name = name or f"local:{self.folder.name}"
        self.model, self.tok = load_model(self.folder, dtype)
        self._lock = threading.Lock()
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 2048))

    def complete(self, messages, tools, max_tokens, temperature, seed=None) -> Completion:
        import torch  # lazy: heavy (torch)

        t0 = time.perf_counter()
        turns = toolcalls.to_template_messages(messages, tools)
        ids = self.tok.apply_chat_template(turns, add_generation_prompt=True, return_tensors="pt")
        if not isinstance(ids, torch.Tensor):
            ids = ids["input_ids"]
        ids = ids[:, -max(1, self.max_positions - max_tokens):]  # keep the tail if the prompt is too long
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "pad_token_id": pad,
                                  "attention_mask": torch.ones_like(ids)}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature)
        else:
            kwargs.update(do_sample=False)
        with self._lock, torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(ids, **kwargs)
        new = out[0, ids.shape[1]:]
        text = self.tok.decode(new, skip_special_tokens=True)
        content, calls = toolcalls.parse(text)
        finish = "length" if len(new) >= max_tokens else "stop"
        return Completion(content, calls, int(ids.shape[1]), int(len(new)), (time.perf_counter() - t0) * 1000, finish)


class EnginePolicy:
    """A serving engine (rl_core.serving.backends.make_backend: vLLM or transformers) on a checkpoint folder.

    The prompt is the gateway's: toolcalls.prompt_ids renders the chat template once and the engine continues from
    those ids; the reply is parsed with the same tool-call convention. Thread-safe: the suite's workers keep
    requests in flight together, which vLLM batches (the transformers backend serialises them). The engine starts
    at the first request (a cached side never starts one) and close() stops it (vLLM runs as a child server)."""

    def __init__(self, folder: str | Path, cfg, name: str | None = None, kind: str | None = None):
        from rl_core.serving.backends import engine_kind

        self.folder, self.cfg = Path(folder), cfg
        if not (self.folder / "config.json").is_file():
            raise FileNotFoundError(f"{self.folder} is not an HF checkpoint folder (no config.json)")
        self.kind = engine_kind(kind or cfg.serving.backend)
        self.name = name or f"{self.kind}:{self.folder.name}"
        cfg_json = json.loads((self.folder / "config.json").read_text())
        self.max_positions = min(int(cfg_json.get("max_position_embeddings", 2048)), 4096)
        self._backend = None
        self._lock = threading.Lock()

    @property
    def backend(self):
        with self._lock:
            if self._backend is None:
                from rl_core.serving.backends import make_backend  # lazy: heavy (engine clients, transformers)

                self._backend = make_backend(self.kind, self.folder, self.cfg, version=0)
            return self._backend

    def complete(self, messages, tools, max_tokens, temperature, seed=None) -> Completion:
        from rl_core.serving.backends import Sampling

        backend = self.backend
        t0 = time.perf_counter()
        ids = toolcalls.prompt_ids(backend.tokenizer, messages, tools)
        ids = ids[-max(1, self.max_positions - max_tokens):]  # keep the tail if the prompt is too long
        g = backend.generate(ids, Sampling(max_tokens=max_tokens, temperature=temperature, seed=seed))
        content, calls = toolcalls.parse(g.text)
        return Completion(content, calls, len(ids), len(g.token_ids), (time.perf_counter() - t0) * 1000,
                          g.finish_reason or "stop")

    def close(self) -> None:
        with self._lock:
            if self._backend is not None:
                self._backend.close()
                self._backend = None


class OpenAIPolicy:
    """Any OpenAI-compatible endpoint through the official client (the rtrl gateway, vLLM, ...)."""

    def __init__(self, base_url: str, model: str = "champion", api_key: str = "rtrl-dev-token",
                 timeout_s: float = 120.0, name: str | None = None):
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=1)
        self.model = model
        self.name = name or f"openai:{model}"

    def complete(self, messages, tools, max_tokens, temperature, seed=None) -> Completion:
        t0 = time.perf_counter()
        resp = self.client.chat.completions.create(
            model=self.model, messages=messages, tools=tools or None, max_tokens=max_tokens, temperature=temperature,
            seed=seed,
        )
        choice = resp.choices[0]
        msg = choice.message
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                "arguments": c.function.arguments}}
                 for c in (msg.tool_calls or [])]
        usage = resp.usage
        return Completion(msg.content or "", calls, getattr(usage, "prompt_tokens", 0) or 0,
                          getattr(usage, "completion_tokens", 0) or 0, (time.perf_counter() - t0) * 1000,
                          choice.finish_reason or "stop")


# --- scripted policies ------------------------------------------------------------------------------

def _scripted(text: str, prompt_chars: int) -> Completion:
    """Parse scripted text with the shared convention, so scripted calls go through the same parser."""
    content, calls = toolcalls.parse(text)
    return Completion(content, calls, prompt_chars // 4, max(1, len(text) // 4), 0.0, "stop")


def _prompt_chars(messages) -> int:
    return sum(len(str(m.get("content") or "")) for m in messages)


class AskingPolicy:
    """Never acts: always answers with a clarifying question (the planted bad candidate)."""

    name = "scripted:asking"

    def complete(self, messages, tools, max_tokens, temperature, seed=None) -> Completion:
        return _scripted("Could you clarify which file you mean and what the expected behaviour is?",
                         _prompt_chars(messages))


class BrokenToolPolicy:
    """Tries to act but emits tool calls whose JSON does not parse."""

    name = "scripted:broken-tool"

    def complete(self, messages, tools, max_tokens, temperature, seed=None) -> Completion:
        if any(m.get("role") == "tool" for m in messages):
            return _scripted("I could not finish.", _prompt_chars(messages))
        return _scripted('<tool_call>{"name": "write_file", "arguments": {"path": </tool_call>', _prompt_chars(messages))


class OraclePolicy:
    """Writes each task's reference solution with write_file, then says it is done (the planted good one).

    It recognises the task by the request text, which ends the harness's first user message (after the files).
    """

    name = "scripted:oracle"

    def __init__(self, tasks):
        self.by_prompt = {t.prompt: t for t in tasks}

    def complete(self, messages, tools, max_tokens, temperature, seed=None) -> Completion:
        first_user = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")
        ends = [p for p in self.by_prompt if first_user.rstrip().endswith(p.strip())]
        task = self.by_prompt[max(ends, key=len)] if ends else None  # the longest: one prompt may end another
        if task is None or any(m.get("role") == "tool" for m in messages):
            return _scripted("Done.", _prompt_chars(messages))
        text = "".join(toolcalls.render_tool_call({"name": "write_file", "arguments": {"path": p, "content": c}})
                       for p, c in sorted(task.solution.items()))
        return _scripted(text, _prompt_chars(messages))


SCRIPTED = {"asking": AskingPolicy, "broken-tool": BrokenToolPolicy}


def describe(policy: Policy) -> str:
    return json.dumps({"name": policy.name, "class": type(policy).__name__})
