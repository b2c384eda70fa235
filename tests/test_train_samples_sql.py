"""sql/train/samples.sql against the pyarrow join it replaced (issue 42), on a generated lake.

The old path (`_old_build_samples`, `_old_plan_batches`: rl_core/train/data.py before the query, verbatim
but for names) is kept here only to prove that, for one rank, the query gives the same samples, stats,
batches and error messages bit for bit; then that the shards of several ranks partition that same set.
Delete the old path with this file's first tests once nobody needs the comparison.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest

from rl_core.config import TrainConfig
from rl_core.lake import Lake
from rl_core.train.advantages import compute_advantages
from rl_core.train.data import DataError, DataStats, Sample, build_samples, collate, load_samples, plan_batches
from rl_core.train.data import sampling_temperature as _sampling_temperature

T0 = datetime(2026, 12, 2, 10, tzinfo=timezone.utc)


# --- the old path, verbatim ------------------------------------------------------------------------

def _old_build_samples(episodes: pa.Table, rewards: pa.Table, tc) -> tuple[list[Sample], DataStats]:
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
        temp = _sampling_temperature(temps[i], eid)
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
    samples.sort(key=lambda s: s.event_id)
    return samples, stats


def _old_plan_batches(samples, tc, rank: int, world: int, pad_id: int):
    per_epoch = []
    for epoch in range(tc.epochs):
        order = list(samples)
        random.Random(tc.seed + epoch).shuffle(order)
        per_epoch.append(order)
    mb, ga = tc.micro_batch_size, tc.grad_accum
    batches = []
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


# --- a generated run ---------------------------------------------------------------------------------

def _lake_run(tmp_path, n: int = 60, seed: int = 0, with_task: bool = True) -> Lake:
    """A run with what the join must get right: repeated prompts (groups), several orgs and tasks, equal and
    missing timestamps, NULL / greedy / real temperatures, top_p, credit, long prompts and completions, an
    empty completion, float32 logprobs, event ids out of file order, rewards in another order plus extras."""
    rng = random.Random(seed)
    shared = [[rng.randrange(1, 500) for _ in range(rng.randrange(1, 12))] for _ in range(5)]
    ids = [f"ev-{rng.getrandbits(40):010x}" for _ in range(n)]
    prompts, comps = [], []
    for i in range(n):
        prompts.append(shared[i % 5] if i % 3 else [rng.randrange(1, 500) for _ in range(rng.randrange(1, 40))])
        comps.append([] if i == 7 else [rng.randrange(1, 500) for _ in range(rng.randrange(1, 30))])
    ep = {
        "event_id": ids,
        "org_id": [f"org-{i % 3}" for i in range(n)],
        "ts_request": [None if i % 11 == 0 else T0 + timedelta(seconds=(i * 7) % 13) for i in range(n)],
        "prompt_token_ids": pa.array(prompts, pa.list_(pa.int32())),
        "completion_token_ids": pa.array(comps, pa.list_(pa.int32())),
        "completion_logprobs": pa.array([[-rng.random() * 3 for _ in c] for c in comps], pa.list_(pa.float32())),
        "temperature": pa.array([[None, 0.0, 0.7, 1.0][i % 4] for i in range(n)], pa.float32()),
        "top_p": [[None, 0.9, 1.0][i % 3] for i in range(n)],
        "credit_weight": [None if i % 5 == 0 else 0.5 + (i % 4) / 4 for i in range(n)],
        "messages": ["{}" * 50] * n,
    }
    if with_task:
        ep["task"] = [None if i % 7 == 0 else f"task-{i % 2}" for i in range(n)]
    perm = list(range(n))
    rng.shuffle(perm)
    rw = {"event_id": [ids[i] for i in perm] + ["ev-unknown"], "reward": [rng.choice([0.0, 0.5, 1.0, -1.0])
                                                                           for _ in perm] + [2.0]}
    lake = Lake(str(tmp_path / "lake"))
    lake.write_parquet("runs/r1/episodes.parquet", pa.table(ep))
    lake.write_parquet("runs/r1/rewards.parquet", pa.table(rw))
    return lake


def _old_load(lake: Lake, tc):
    return _old_build_samples(lake.read_parquet("runs/r1/episodes.parquet"),
                              lake.read_parquet("runs/r1/rewards.parquet"), tc)


CONFIGS = [
    TrainConfig(),
    TrainConfig(advantage="running", normalize_advantages=False, baseline_decay=0.5),
    TrainConfig(max_seq_len=16, micro_batch_size=3, grad_accum=2, epochs=2, seed=5),
    TrainConfig(max_seq_len=1, micro_batch_size=8),
]


@pytest.mark.parametrize("tc", CONFIGS)
@pytest.mark.parametrize("with_task", [True, False])
def test_one_rank_gets_exactly_the_old_samples_stats_and_batches(tmp_path, tc, with_task):
    lake = _lake_run(tmp_path, with_task=with_task)
    old, old_stats = _old_load(lake, tc)
    new, new_stats = load_samples(lake, "r1", tc)
    assert new == old  # every field, floats bit for bit
    assert asdict(new_stats) == asdict(old_stats)
    assert plan_batches(new, tc, 0, 1, 0, total=new_stats.episodes) == _old_plan_batches(old, tc, 0, 1, 0)
    assert plan_batches(new, tc, 0, 1, 0) == _old_plan_batches(old, tc, 0, 1, 0)


@pytest.mark.parametrize("world", [2, 3, 7])
def test_shards_partition_the_run_balanced_with_global_stats(tmp_path, world):
    tc = TrainConfig(micro_batch_size=2, grad_accum=3, epochs=2)
    lake = _lake_run(tmp_path, n=40)
    everything, stats = load_samples(lake, "r1", tc)
    shards = [load_samples(lake, "r1", tc, rank, world) for rank in range(world)]
    assert all(asdict(s) == asdict(stats) for _, s in shards)  # every rank: the whole run's numbers
    assert sorted((s for shard, _ in shards for s in shard), key=lambda s: s.event_id) == everything
    assert max(len(sh) for sh, _ in shards) - min(len(sh) for sh, _ in shards) <= 1
    assert [sh for sh, _ in shards] == [everything[r::world] for r in range(world)]  # plan_batches' own rule
    plans = [plan_batches(sh, tc, rank, world, 0, total=stats.episodes) for rank, (sh, _) in enumerate(shards)]
    assert plans == [plan_batches(everything, tc, rank, world, 0) for rank in range(world)]
    assert len({len(p) for p in plans}) == 1 and len(plans[0]) % tc.grad_accum == 0  # every rank: the same steps
    half = len(plans[0]) // tc.epochs
    for epoch in range(tc.epochs):
        trained = [e for p in plans for b in p[epoch * half:(epoch + 1) * half]
                   for e, m in zip(b.event_ids, b.loss_mask, strict=True) if any(m)]
        assert sorted(trained) == [s.event_id for s in everything if s.completion_ids]  # each once per epoch


def test_a_rank_without_episodes_still_runs_masked_batches(tmp_path):
    tc = TrainConfig(micro_batch_size=4)
    lake = _lake_run(tmp_path, n=2)
    shard, stats = load_samples(lake, "r1", tc, rank=2, world=3)
    assert shard == [] and stats.episodes == 2
    (batch,) = plan_batches(shard, tc, 2, 3, pad_id=0, total=stats.episodes)
    assert batch.loss_mask == [[0]] and batch.advantages == [0.0]


def _tables(n: int = 3, **overrides):
    """Three good episodes and their rewards; overrides replace episode columns, or reward ones (rw_<name>)."""
    ep = {
        "event_id": [f"e{i:03d}" for i in range(n)], "org_id": ["org-a"] * n,
        "ts_request": [T0 + timedelta(minutes=i) for i in range(n)], "prompt_token_ids": [[1, 2]] * n,
        "completion_token_ids": [[3, 4]] * n, "completion_logprobs": [[-1.0, -1.0]] * n,
    }
    rw = {"event_id": ep["event_id"], "reward": [1.0] * n}
    for k, v in overrides.items():
        (rw if k.startswith("rw_") else ep)[k.removeprefix("rw_")] = v
    return pa.table(ep), pa.table(rw)


@pytest.mark.parametrize("overrides", [
    {"rw_event_id": ["e000", "e000", "e002"]},
    {"rw_reward": [1.0, float("nan"), 1.0]},
    {"rw_reward": [1.0, None, float("inf")]},
    {"rw_event_id": ["e000", "e001", "e002", "x", "x"], "rw_reward": [1.0] * 5},  # bad rows of unknown events too
    {"rw_event_id": ["e000", "x", "y"]},
    {"event_id": ["e000", "e001", "e001"]},
    {"prompt_token_ids": [[1], None, [2]]},
    {"completion_logprobs": [[-1.0, -1.0], [-1.0, None], [-1.0]]},
    {"completion_logprobs": [[-1.0, -1.0], [-1.0, -float("inf")], [-1.0]]},
    {"completion_logprobs": [[-1.0, -1.0], [-1.0, 2e-4], [-1.0, -1.0]]},
    {"temperature": [0.5, -1.0, float("nan")]},
    {"temperature": [None, float("nan"), 1.0]},
    {"completion_logprobs": [[-1.0], [-1.0, 1.0], [-1.0, -1.0]], "prompt_token_ids": [[1], [1], []]},
])
def test_bad_input_raises_the_old_message(overrides):
    ep, rw = _tables(**overrides)
    with pytest.raises(DataError) as old:
        _old_build_samples(ep, rw, TrainConfig())
    with pytest.raises(DataError) as new:
        build_samples(ep, rw, TrainConfig())
    assert str(new.value) == str(old.value)


def test_nan_rewards_in_parquet_are_found(tmp_path):
    """Parquet statistics leave NaN out: the check must still see it (rl_core/duck.py)."""
    ep, rw = _tables(n=3, rw_reward=[1.0, float("nan"), 0.0])
    lake = Lake(str(tmp_path / "lake"))
    lake.write_parquet("runs/r1/episodes.parquet", ep)
    lake.write_parquet("runs/r1/rewards.parquet", rw)
    with pytest.raises(DataError, match="rewards.reward: not a finite number for event e001 \\(got nan\\)"):
        load_samples(lake, "r1", TrainConfig())
