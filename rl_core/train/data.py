"""runs/<run_id>/episodes.parquet + rewards.parquet -> token samples -> padded micro batches.

Every episode is kept: one longer than max_seq_len loses the left of its prompt (the completion and the
prompt's end, which the completion depends on most, stay); a completion that alone does not fit keeps
its first max_seq_len-1 tokens. Both are counted in DataStats, never dropped silently. Bad input (a
missing column, an episode without a reward, logprobs that do not match the tokens) raises DataError
naming the field and the event.

Behaviour logprobs are under the distribution the server sampled from (logits / temperature, then top_p);
each sample carries its temperature so the policy's logprobs are taken under the same temperature and the
importance ratio compares like with like (rl_core/train/step.py). Temperature 0 (greedy) or unknown counts
as 1. top_p < 1 is not re-applied (the nucleus would be the new policy's, not the sampler's): such
episodes are counted in DataStats.top_p_below_one.

Batches are left-padded so that every completion ends at the last position: the model then only needs
logits for the last C+1 positions (`logits_to_keep`), C the longest completion of the batch.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from rl_core.lake import Lake
from rl_core.train.advantages import compute_advantages

EPISODE_COLUMNS = ("event_id", "org_id", "ts_request", "prompt_token_ids", "completion_token_ids", "completion_logprobs")
REWARD_COLUMNS = ("event_id", "reward")


class DataError(ValueError):
    """The run's episodes or rewards cannot be trained on; the message names the field and the event."""


@dataclass
class Sample:
    event_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]
    reward: float
    advantage: float
    temperature: float = 1.0


@dataclass
class DataStats:
    episodes: int = 0
    tokens: int = 0  # prompt + completion tokens after truncation
    completion_tokens: int = 0
    truncated_prompt: int = 0  # episodes whose prompt lost tokens on the left
    truncated_completion: int = 0  # episodes whose completion was cut (it alone exceeded max_seq_len)
    empty_completion: int = 0  # episodes with no completion token (kept, masked: they teach nothing)
    top_p_below_one: int = 0  # sampled with top_p < 1: their behaviour logprobs are nucleus-renormalised
    grouped: int = 0
    running: int = 0
    reward_mean: float = 0.0
    advantage_abs_mean: float = 0.0

    @property
    def truncated(self) -> int:
        return self.truncated_prompt + self.truncated_completion


@dataclass
class Batch:
    """One micro batch as plain lists (torch tensors are made by to_tensors, in the worker)."""

    input_ids: list[list[int]]  # [B][L] left-padded
    attention_mask: list[list[int]]  # [B][L]
    behaviour_logprobs: list[list[float]]  # [B][C] right-aligned
    loss_mask: list[list[int]]  # [B][C]
    advantages: list[float]  # [B]
    event_ids: list[str] = field(default_factory=list)
    temperatures: list[float] = field(default_factory=list)  # [B] sampling temperature of each row

    @property
    def completion_len(self) -> int:
        return len(self.loss_mask[0]) if self.loss_mask else 0


def _require(table: pa.Table, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(f"{what}: missing column(s) {', '.join(missing)}")


def load_samples(lake: Lake, run_id: str, tc) -> tuple[list[Sample], DataStats]:
    """Read and join a run's episodes and rewards; truncate; compute advantages. `tc` is a TrainConfig."""
    run = lake.run(run_id)
    ep_path, rw_path = run.episodes, run.rewards
    for p in (ep_path, rw_path):
        if not lake.exists(p):
            raise DataError(f"{p}: not found in the lake ({lake.root})")
    episodes, rewards = lake.read_parquet(ep_path), lake.read_parquet(rw_path)
    _require(episodes, EPISODE_COLUMNS, ep_path)
    _require(rewards, REWARD_COLUMNS, rw_path)
    return build_samples(episodes, rewards, tc)


def build_samples(episodes: pa.Table, rewards: pa.Table, tc) -> tuple[list[Sample], DataStats]:
    ep = episodes.to_pydict()
    reward_of: dict[str, float] = {}
    for eid, r in zip(rewards.column("event_id").to_pylist(), rewards.column("reward").to_pylist(), strict=True):
        if eid in reward_of:
            raise DataError(f"rewards.event_id: duplicate {eid}")
        if r is None or not math.isfinite(r):
            raise DataError(f"rewards.reward: not a finite number for event {eid} (got {r!r})")
        reward_of[eid] = float(r)
    n = len(ep["event_id"])
    if n == 0:
        raise DataError("episodes: no rows to train on")
    seen: set[str] = set()
    missing = [e for e in ep["event_id"] if e not in reward_of]
    if missing:
        raise DataError(f"rewards: no reward for {len(missing)} episode(s), e.g. event {missing[0]}")
    stats = DataStats(episodes=n)
    temps, top_ps = ep.get("temperature", [None] * n), ep.get("top_p", [None] * n)
    samples: list[Sample] = []
    for i in range(n):
        eid = ep["event_id"][i]
        if eid in seen:
            raise DataError(f"episodes.event_id: duplicate {eid}")
        seen.add(eid)
        prompt = list(ep["prompt_token_ids"][i] or [])
        comp = list(ep["completion_token_ids"][i] or [])
        lps = list(ep["completion_logprobs"][i] or [])
        if not prompt:
            raise DataError(f"episodes.prompt_token_ids: empty for event {eid}")
        if len(lps) != len(comp):
            raise DataError(
                f"episodes.completion_logprobs: {len(lps)} values for {len(comp)} completion tokens (event {eid})"
            )
        if any(lp is None or not math.isfinite(lp) or lp > 1e-4 for lp in lps):
            raise DataError(f"episodes.completion_logprobs: a value is not a finite logprob <= 0 (event {eid})")
        if not comp:
            stats.empty_completion += 1
        limit = tc.max_seq_len
        if len(comp) > limit - 1:
            comp, lps = comp[: limit - 1], lps[: limit - 1]
            stats.truncated_completion += 1
        if len(prompt) + len(comp) > limit:
            prompt = prompt[len(prompt) + len(comp) - limit:]
            stats.truncated_prompt += 1
        stats.tokens += len(prompt) + len(comp)
        stats.completion_tokens += len(comp)
        temp = sampling_temperature(temps[i], eid)
        stats.top_p_below_one += top_ps[i] is not None and top_ps[i] < 1.0
        samples.append(Sample(eid, prompt, comp, [float(x) for x in lps], reward_of[eid], 0.0, temp))

    orig_prompts = ep["prompt_token_ids"]
    group_keys = [hashlib.sha1(np.asarray(p, dtype=np.int32).tobytes()).hexdigest() for p in orig_prompts]
    task = ep.get("task")
    running_keys = [f"{ep['org_id'][i]}|{task[i] if task else ''}" for i in range(n)]
    order = np.array([ts.timestamp() if ts is not None else 0.0 for ts in ep["ts_request"]])
    credit = np.array([c if c is not None else 1.0 for c in ep.get("credit_weight", [1.0] * n)], dtype=np.float64)
    res = compute_advantages(
        np.array([s.reward for s in samples]), group_keys, running_keys, order,
        mode=tc.advantage, decay=tc.baseline_decay, normalize=tc.normalize_advantages, credit=credit,
    )
    for s, a in zip(samples, res.advantages, strict=True):
        s.advantage = float(a)
    stats.grouped, stats.running = res.grouped, res.running
    stats.reward_mean = float(np.mean([s.reward for s in samples]))
    stats.advantage_abs_mean = float(np.mean(np.abs(res.advantages)))
    samples.sort(key=lambda s: s.event_id)  # input order never matters: the same files give the same batches
    return samples, stats


def sampling_temperature(t: float | None, event_id: str) -> float:
    """The temperature to divide the policy's logits by: the logged one; 1 when unknown or greedy (0)."""
    if t is None or t == 0:
        return 1.0
    if not math.isfinite(t) or t < 0:
        raise DataError(f"episodes.temperature: {t!r} is not a temperature >= 0 (event {event_id})")
    return float(t)


def collate(samples: list[Sample], pad_id: int, masked: bool = False) -> Batch:
    """Left-pad to the longest sequence; completions right-aligned. masked=True: a batch that trains nothing."""
    seq_len = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    comp_len = max(1, max(len(s.completion_ids) for s in samples))
    seq_len = max(seq_len, comp_len + 1)  # the first completion token needs a position before it
    ids, att, beh, lmask = [], [], [], []
    for s in samples:
        seq = s.prompt_ids + s.completion_ids
        pad = seq_len - len(seq)
        ids.append([pad_id] * pad + seq)
        att.append([0] * pad + [1] * len(seq))
        cpad = comp_len - len(s.completion_ids)
        beh.append([0.0] * cpad + s.behaviour_logprobs)
        lmask.append([0] * comp_len if masked else [0] * cpad + [1] * len(s.completion_ids))
    return Batch(ids, att, beh, lmask, [0.0 if masked else s.advantage for s in samples], [s.event_id for s in samples],
                 [s.temperature for s in samples])


def plan_batches(samples: list[Sample], tc, rank: int, world: int, pad_id: int) -> list[Batch]:
    """This rank's micro batches for the whole run: shuffled (seeded), sharded, padded to equal counts.

    Every rank must run the same number of micro batches (each backward is a collective) and the count
    must be a multiple of grad_accum (else the tail never reaches an optimizer step): short ranks get
    fully masked batches, which add zero gradient.
    """
    per_epoch = []
    for epoch in range(tc.epochs):
        order = list(samples)
        random.Random(tc.seed + epoch).shuffle(order)
        per_epoch.append(order)
    mb, ga = tc.micro_batch_size, tc.grad_accum
    batches: list[Batch] = []
    for order in per_epoch:
        mine = order[rank::world]
        per_rank = math.ceil(len(order) / world)
        n_micro = math.ceil(per_rank / mb)
        n_micro = math.ceil(n_micro / ga) * ga
        for k in range(n_micro):
            chunk = mine[k * mb:(k + 1) * mb]
            if chunk:
                batches.append(collate(chunk, pad_id))
            else:
                batches.append(collate([order[0]], pad_id, masked=True))
    return batches


def to_tensors(batch: Batch, device) -> dict:
    """The model inputs of a batch: ids, masks, position ids (from the attention mask: left padding)."""
    import torch  # lazy: heavy (torch)

    input_ids = torch.tensor(batch.input_ids, dtype=torch.long, device=device)  # [B,L]
    attention_mask = torch.tensor(batch.attention_mask, dtype=torch.long, device=device)  # [B,L]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B,L]
    comp_len = batch.completion_len
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "targets": input_ids[:, -comp_len:],  # [B,C]
        "behaviour_logprobs": torch.tensor(batch.behaviour_logprobs, dtype=torch.float32, device=device),  # [B,C]
        "loss_mask": torch.tensor(batch.loss_mask, dtype=torch.float32, device=device),  # [B,C]
        "advantages": torch.tensor(batch.advantages, dtype=torch.float32, device=device),  # [B]
        "temperature": torch.tensor(batch.temperatures or [1.0] * len(batch.advantages), dtype=torch.float32,
                                    device=device),  # [B]
        "comp_len": comp_len,
    }
