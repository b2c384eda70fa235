"""The backend interface: prompt token ids + sampling parameters in, sampled token ids + logprobs out.

Why token ids at the boundary: the gateway renders the chat template once (rl_core.toolcalls + the
tokenizer), logs exactly those prompt ids, and every engine continues from them; RL then trains on the
same ids it logged. Each sampled token's logprob is under the distribution actually sampled from
(after temperature and top_p); with temperature 0 (greedy) it is the plain softmax's.

An engine with `supports_lora` (vLLM multi-LoRA) also serves LoRA adapters beside its base weights:
load_adapter/unload_adapter by name, and generate/stream take `adapter=` to answer through one. OnAdapter
wraps (engine, adapter name) into a plain Backend, so a router lease carries it like any engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class StepOut:
    """One streamed piece: new token ids/logprobs and the text they add (may be empty mid-codepoint)."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None = None


@dataclass
class Generation:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "stop"
    ttft_ms: float | None = None


class Backend(Protocol):
    name: str
    tokenizer: object

    def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation: ...

    def stream(self, prompt_ids: list[int], sampling: Sampling) -> Iterator[StepOut]: ...

    def close(self) -> None: ...


class AsyncBackend(Backend, Protocol):
    """A backend the gateway awaits on its event loop (vLLM over HTTP): no thread per request or streamed token."""

    async def agenerate(self, prompt_ids: list[int], sampling: Sampling) -> Generation: ...

    def astream(self, prompt_ids: list[int], sampling: Sampling) -> AsyncIterator[StepOut]: ...


class LoraEngine(Backend, Protocol):
    """An engine serving LoRA adapters beside its base weights, each under a never-reused name (vLLM: which is
    also an AsyncBackend, taking adapter= there too)."""

    supports_lora: bool

    def load_adapter(self, name: str, path: str) -> None: ...

    def unload_adapter(self, name: str) -> None: ...

    def generate(self, prompt_ids: list[int], sampling: Sampling, adapter: str | None = None) -> Generation: ...

    def stream(self, prompt_ids: list[int], sampling: Sampling, adapter: str | None = None) -> Iterator[StepOut]: ...


class OnAdapter:
    """One adapter of a LoraEngine as a Backend (and AsyncBackend): same engine and tokenizer, answers through the
    adapter.
    Closing it closes nothing: the engine belongs to its router slot, the adapter to rl_core.orgs.serving."""

    def __init__(self, engine: LoraEngine, adapter: str):
        self.engine, self.adapter = engine, adapter
        self.name, self.tokenizer = engine.name, engine.tokenizer

    def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        return self.engine.generate(prompt_ids, sampling, adapter=self.adapter)

    def stream(self, prompt_ids: list[int], sampling: Sampling) -> Iterator[StepOut]:
        return self.engine.stream(prompt_ids, sampling, adapter=self.adapter)

    async def agenerate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        return await self.engine.agenerate(prompt_ids, sampling, adapter=self.adapter)

    def astream(self, prompt_ids: list[int], sampling: Sampling) -> AsyncIterator[StepOut]:
        return self.engine.astream(prompt_ids, sampling, adapter=self.adapter)

    def close(self) -> None:
        pass


def collect_stream(steps: Iterator[StepOut]) -> Generation:
    """Drain a stream into one Generation (how a backend implements generate from stream)."""
    g = Generation()
    for s in steps:
        g.token_ids += s.token_ids
        g.logprobs += s.logprobs
        g.text += s.text
        if s.finish_reason:
            g.finish_reason = s.finish_reason
    return g


def apply_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """Cut text at the first stop string; (text, stopped)."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
