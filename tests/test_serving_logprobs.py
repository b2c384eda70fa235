"""The transformers backend records each sampled token's logprob under the distribution it was sampled
from; checked against a fresh fp32 forward pass with an independent numpy implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_core.serving.app import prompt_ids
from rl_core.serving.backends.base import Sampling
from rl_core.serving.backends.hf import TransformersBackend


@pytest.fixture(scope="module")
def backend(tiny_checkpoint):
    return TransformersBackend(tiny_checkpoint)


def reference_logprobs(model, prompt: list[int], completion: list[int], temperature: float, top_p: float) -> np.ndarray:
    """One forward pass over prompt+completion; each completion token's logprob after temperature/top_p."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].double().numpy()
    out = []
    for i, tok in enumerate(completion):
        z = logits[len(prompt) - 1 + i]
        if temperature > 0:
            z = z / temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        if temperature > 0 and top_p < 1:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            n_keep = int(np.searchsorted(cum, top_p) + 1)  # smallest prefix reaching top_p
            keep = np.zeros_like(p, dtype=bool)
            keep[order[:n_keep]] = True
            assert keep[tok], f"token {tok} at step {i} was sampled from outside the nucleus"
            p = np.where(keep, p, 0.0)
            p /= p.sum()
        out.append(np.log(p[tok]))
    return np.array(out)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.0, 1.0), (1.3, 0.5)])
def test_sampled_logprobs_match_fresh_fp32_forward(backend, temperature, top_p):
    ids = prompt_ids(backend.tokenizer, [{"role": "user", "content": "Write a function that adds two numbers."}], None)
    g = backend.generate(ids, Sampling(max_tokens=16, temperature=temperature, top_p=top_p, seed=11))
    assert len(g.token_ids) == len(g.logprobs) > 0
    ref = reference_logprobs(backend.model, ids, g.token_ids, temperature, top_p)
    diff = float(np.max(np.abs(ref - np.array(g.logprobs))))
    print(f"\nmax |logprob - fresh fp32 forward| at T={temperature} top_p={top_p}: {diff:.2e}")
    assert diff < 1e-4
    if temperature == 0:
        with torch.no_grad():
            logits = backend.model(torch.tensor([ids + g.token_ids])).logits[0]
        greedy = logits[len(ids) - 1:-1].argmax(-1).tolist()
        assert greedy == g.token_ids


def test_seed_reproducible_and_stream_equals_generate(backend):
    ids = prompt_ids(backend.tokenizer, [{"role": "user", "content": "hello"}], None)
    s = Sampling(max_tokens=16, temperature=1.0, seed=5)
    a, b = backend.generate(ids, s), backend.generate(ids, s)
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    steps = list(backend.stream(ids, s))
    assert [t for st in steps for t in st.token_ids] == a.token_ids
    assert "".join(st.text for st in steps) == a.text
    c = backend.generate(ids, Sampling(max_tokens=16, temperature=1.0, seed=6))
    assert c.token_ids != a.token_ids


def test_stop_string_cuts_text_and_finishes(backend):
    ids = prompt_ids(backend.tokenizer, [{"role": "user", "content": "hello"}], None)
    full = backend.generate(ids, Sampling(max_tokens=20, temperature=1.0, seed=3))
    stop = full.text[5:8]
    assert stop.strip(), "need a non-blank stop string from the sample"
    cut = backend.generate(ids, Sampling(max_tokens=20, temperature=1.0, seed=3, stop=(stop,)))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    streamed = "".join(s.text for s in backend.stream(ids, Sampling(max_tokens=20, temperature=1.0, seed=3, stop=(stop,))))
    assert streamed == cut.text, "a stream never leaks the stop string"
