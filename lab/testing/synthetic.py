"""A synthetic run that follows the episodes/rewards contract, for the trainer's tests and benches.

The reward prefers one token: each prompt gets several completions, half of them containing the
target token (reward 1) and half not (reward 0). The behaviour logprobs are the model's own
(teacher-forced) logprobs of those tokens, so ratios start at 1 exactly as with on-policy samples, and
learning is visible as a rising probability of the target token after the prompt.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa

from rl_core.lake import Lake
from rl_core.models import load_model
from rl_core.rewards import SIGNALS


@dataclass
class SyntheticRun:
    run_id: str
    target_token: int
    prompts: list[list[int]]  # one per group
    episodes: int
    avoided: list[list[int]]  # per prompt: the first tokens of its reward-0 completions


def _prompts(tok, n: int, seed: int) -> list[list[int]]:
    topics = ["sort a list", "parse a date", "read a CSV", "reverse a string", "merge two dicts", "count words",
              "retry an HTTP call", "flatten a list", "compute a median", "validate an email"]
    rng = random.Random(seed)
    out = []
    for i in range(n):
        msg = [{"role": "user", "content": f"Write a Python function to {rng.choice(topics)} (task {i})."}]
        ids = tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        out.append([int(x) for x in ids])
    return out


def behaviour_logprobs(model, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
    """Teacher-forced logprobs of each completion after its prompt (one sequence at a time: exact)."""
    import torch  # lazy: heavy (torch)

    out = []
    with torch.no_grad():
        for p, c in zip(prompts, completions, strict=True):
            ids = torch.tensor([p + c])  # [1,L]
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float()  # [C,V]
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1)  # [C]
            out.append([float(x) for x in lp])
    return out


def make_run(lake: Lake, run_id: str, ckpt_dir: str | Path, n_prompts: int = 8, per_prompt: int = 4,
             completion_len: int = 6, target_token: int | None = None, seed: int = 0,
             org_ids: tuple[str, ...] = ("org-acme",), model_version: int = 1) -> SyntheticRun:
    """Write runs/<run_id>/episodes.parquet and rewards.parquet for the checkpoint in ckpt_dir."""
    model, tok = load_model(ckpt_dir)
    rng = random.Random(seed)
    target = target_token if target_token is not None else int(tok.convert_tokens_to_ids("Ġreturn"))
    vocab = [i for i in range(1000, 8000) if i != target]
    prompts = _prompts(tok, n_prompts, seed)
    rows_p, rows_c, rewards, avoided = [], [], [], []
    for p in prompts:
        avoided.append([])
        for k in range(per_prompt):
            comp = [rng.choice(vocab) for _ in range(completion_len)]
            good = k % 2 == 0
            if good:
                comp[0] = target
            else:
                avoided[-1].append(comp[0])
            rows_p.append(p)
            rows_c.append(comp)
            rewards.append(1.0 if good else 0.0)
    lps = behaviour_logprobs(model, rows_p, rows_c)
    t0 = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)
    n = len(rows_p)
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]
    episodes = {
        "event_id": ids, "org_id": [org_ids[i % len(org_ids)] for i in range(n)],
        "user_id": [f"user-{i % 5}" for i in range(n)], "session_id": [f"sess-{i // per_prompt}" for i in range(n)],
        "turn_index": [0] * n, "ts_request": [t0 + timedelta(seconds=i) for i in range(n)],
        "model_version": [model_version] * n, "arm": ["champion"] * n, "version_lag": [0] * n,
        "messages": [json.dumps({"messages": [], "tools": []})] * n,
        "prompt_token_ids": rows_p, "completion_token_ids": rows_c, "completion_logprobs": lps,
        "completion_text": [tok.decode(c) for c in rows_c], "tool_calls": [None] * n, "finish_reason": ["stop"] * n,
        "latency_ms": [100.0] * n, "n_feedback": [1] * n, "edit_applied": [False] * n, "edit_persisted": [False] * n,
        "edit_persisted_hours": [None] * n, "edit_reverted": [False] * n, "followup_text": [None] * n,
        "tool_result_ok": [0] * n, "tool_result_fail": [0] * n, "thumbs_up": [int(r > 0) for r in rewards],
        "thumbs_down": [int(r == 0) for r in rewards], "session_end": [False] * n, "credit_weight": [1.0] * n,
    }
    schema_overrides = {
        "prompt_token_ids": pa.list_(pa.int32()), "completion_token_ids": pa.list_(pa.int32()),
        "completion_logprobs": pa.list_(pa.float32()), "ts_request": pa.timestamp("us", tz="UTC"),
        "edit_persisted_hours": pa.float64(), "followup_text": pa.string(), "tool_calls": pa.string(),
    }
    ep_table = pa.table({k: pa.array(v, type=schema_overrides.get(k)) for k, v in episodes.items()})
    rw = {"event_id": ids} | {s: [0.0] * n for s in SIGNALS}
    rw["thumbs"] = [0.5 * r for r in rewards]
    rw |= {"broken_tool_call": [False] * n, "is_clarifying": [False] * n, "reward": rewards,
           "reward_config_hash": ["synthetic"] * n}
    run = lake.run(run_id)
    lake.write_parquet(run.episodes, ep_table)
    lake.write_parquet(run.rewards, pa.table(rw))
    return SyntheticRun(run_id=run_id, target_token=target, prompts=prompts, episodes=n, avoided=avoided)


def target_logprob(ckpt_dir: str | Path, prompts: list[list[int]], target: int | list[list[int]]) -> float:
    """Mean logprob of `target` (one token, or a list of tokens per prompt) as the first token after each prompt."""
    import torch  # lazy: heavy (torch)

    model, _ = load_model(ckpt_dir)
    vals = []
    with torch.no_grad():
        for i, p in enumerate(prompts):
            logits = model(input_ids=torch.tensor([p])).logits[0, -1].float()  # [V]
            lp = torch.log_softmax(logits, -1)  # [V]
            tokens = [target] if isinstance(target, int) else target[i]
            vals.append(float(lp[tokens].mean()))
    return sum(vals) / len(vals)
