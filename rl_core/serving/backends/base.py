"""The backend interface: prompt token ids + sampling parameters in, sampled token ids + logprobs out.

Why token ids at the boundary: the gateway renders the chat template once (rl_core.toolcalls + the
tokenizer), logs exactly those prompt ids, and every engine continues from them; RL then trains on the
same ids it logged. Each sampled token's logprob is under the distribution actually sampled from
(after temperature and top_p); with temperature 0 (greedy) it is the plain softmax's.
"""

from __future__ import annotations

from collections.abc import Iterator
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
