"""The transformers backend: the fallback that always works (tiny test model, machines without vLLM).

Samples token by token with a KV cache so that each sampled token's logprob is taken from exactly the
distribution it was drawn from: logits / temperature, then the top_p nucleus renormalised. Greedy
(temperature 0) records the plain log-softmax. Concurrent requests interleave step by step (each has
its own KV cache); there is no batching, which vLLM is for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from rl_core.serving.backends.base import Generation, Sampling, StepOut, apply_stop, collect_stream


def processed_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probabilities of the distribution sampled from (last dim = vocab). Shared with the tests."""
    logits = logits.float()
    if temperature <= 0:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / temperature
    if top_p < 1.0:
        probs = torch.softmax(scaled, dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above each token
        drop_sorted = before >= top_p  # the top token always stays (before = 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


class _Detokenizer:
    """Incremental decoding (prefix/read offsets, as vLLM and TGI do): O(1) per token, never emits half
    a multi-byte character, and keeps the spacing a full decode would give."""

    def __init__(self, tokenizer):
        self.tok, self.ids, self.prefix, self.read = tokenizer, [], 0, 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.tok.decode(self.ids[self.prefix:self.read], skip_special_tokens=True)
        after = self.tok.decode(self.ids[self.prefix:], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""


class TransformersBackend:
    name = "transformers"

    def __init__(self, checkpoint: str | Path, dtype: str = "float32", supports_reload: bool = False):
        from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: heavy (transformers)

        self.checkpoint = str(checkpoint)
        self.model = AutoModelForCausalLM.from_pretrained(self.checkpoint, dtype=getattr(torch, dtype))
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(self.checkpoint)
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        self.eos_ids = eos_ids
        self._lock = threading.Lock()
        # reload() works, but the router then has to drain the slot; loading beside it never blocks
        self.supports_reload = supports_reload

    def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        t0 = time.perf_counter()
        first: list[float] = []

        def timed() -> Iterator[StepOut]:
            for s in self.stream(prompt_ids, sampling):
                if not first and s.token_ids:
                    first.append((time.perf_counter() - t0) * 1000)
                yield s

        g = collect_stream(timed())
        g.ttft_ms = first[0] if first else None
        return g

    def stream(self, prompt_ids: list[int], sampling: Sampling) -> Iterator[StepOut]:
        gen = torch.Generator().manual_seed(sampling.seed if sampling.seed is not None else int(torch.seed() % (2**63)))
        hold = max((len(s) for s in sampling.stop), default=1) - 1  # chars that may start a stop string
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        past = None
        detok = _Detokenizer(self.tokenizer)
        text, emitted = "", 0
        for _ in range(sampling.max_tokens):
            # no context manager spans a yield: a streaming response resumes this generator on any
            # worker thread, and grad mode is thread-local; the lock only keeps reload() out of a step
            with self._lock, torch.inference_mode():
                out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                lp = processed_logprobs(out.logits[0, -1], sampling.temperature, sampling.top_p)
                if sampling.temperature <= 0:
                    tok = int(lp.argmax())
                else:
                    tok = int(torch.multinomial(lp.exp(), 1, generator=gen))
                step_lp = float(lp[tok])
            ids = torch.tensor([[tok]], dtype=torch.long)
            if tok in self.eos_ids:
                yield StepOut([tok], [step_lp], apply_stop(text, sampling.stop)[0][emitted:], "stop")
                return
            text += detok.push(tok)
            text, stopped = apply_stop(text, sampling.stop)
            if stopped:
                yield StepOut([tok], [step_lp], text[emitted:], "stop")
                return
            safe = max(len(text) - hold, emitted)
            yield StepOut([tok], [step_lp], text[emitted:safe])
            emitted = safe
        yield StepOut([], [], text[emitted:], "length")

    def reload(self, checkpoint: str | Path) -> None:
        """Load new weights of the same architecture into this model in place (no new allocation)."""
        from safetensors.torch import load_file  # lazy: heavy (torch)

        state: dict[str, torch.Tensor] = {}
        for f in sorted(Path(checkpoint).glob("*.safetensors")):
            state.update(load_file(str(f)))
        with self._lock, torch.no_grad():
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
            if set(missing) - tied or unexpected:
                raise ValueError(f"{checkpoint}: weights do not fit the served model (missing {missing}, unexpected {unexpected})")
            self.model.tie_weights()
        self.checkpoint = str(checkpoint)

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
