"""episodes + rewards -> samples -> batches: truncation counted, bad input named, batches aligned.

The alignment test runs the real tiny model: the logprobs the trainer computes on a left-padded,
truncated-logits batch must equal the unpadded, token-by-token logprobs (what serving logs).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest

from lab.testing import synthetic
from rl_core.config import TrainConfig
from rl_core.lake import Lake
from rl_core.train.advantages import compute_advantages
from rl_core.train.data import DataError, build_samples, collate, load_samples, plan_batches, to_tensors

T0 = datetime(2026, 12, 2, 10, tzinfo=timezone.utc)


def _tables(prompts, comps, rewards, orgs=None, **overrides):
    n = len(prompts)
    ep = {
        "event_id": [f"e{i:03d}" for i in range(n)],
        "org_id": orgs or ["org-a"] * n,
        "ts_request": [T0 + timedelta(minutes=i) for i in range(n)],
        "prompt_token_ids": prompts,
        "completion_token_ids": comps,
        "completion_logprobs": [[-1.0] * len(c) for c in comps],
        "credit_weight": [1.0] * n,
    } | overrides
    rw = {"event_id": [f"e{i:03d}" for i in range(n)], "reward": rewards}
    return pa.table(ep), pa.table(rw)


def test_long_episodes_are_truncated_from_the_left_of_the_prompt_and_counted():
    tc = TrainConfig(max_seq_len=8, normalize_advantages=False)
    ep, rw = _tables(
        prompts=[[1, 2, 3], [1, 2, 3, 4, 5, 6, 7], [9, 9]],
        comps=[[10, 11], [20, 21, 22], list(range(30, 42))],
        rewards=[1.0, 0.0, 0.5],
    )
    samples, stats = build_samples(ep, rw, tc)
    by_id = {s.event_id: s for s in samples}
    assert len(samples) == 3  # nothing dropped
    assert by_id["e000"].prompt_ids == [1, 2, 3]
    assert by_id["e001"].prompt_ids == [3, 4, 5, 6, 7] and by_id["e001"].completion_ids == [20, 21, 22]
    assert by_id["e002"].prompt_ids == [9] and by_id["e002"].completion_ids == list(range(30, 37))
    assert len(by_id["e002"].behaviour_logprobs) == 7
    assert (stats.truncated_prompt, stats.truncated_completion, stats.truncated) == (2, 1, 3)
    assert all(len(s.prompt_ids) + len(s.completion_ids) <= 8 for s in samples)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"completion_logprobs": [[-1.0], [-1.0, -1.0]]}, "completion_logprobs: 1 values for 2 completion tokens (event e000)"),
        ({"completion_logprobs": [[-1.0, float("nan")], [-1.0, -1.0]]}, "completion_logprobs: a value is not a finite"),
        ({"completion_logprobs": [[-1.0, 0.5], [-1.0, -1.0]]}, "(event e000)"),
        ({"prompt_token_ids": [[], [1]]}, "prompt_token_ids: empty for event e000"),
        ({"event_id": ["e000", "e000"]}, "episodes.event_id: duplicate e000"),
    ],
)
def test_bad_episodes_name_the_field_and_event(overrides, message):
    ep, rw = _tables([[1], [1]], [[2, 3], [4, 5]], [1.0, 0.0], **overrides)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_samples(ep, rw, TrainConfig())


def test_missing_reward_or_column_is_a_clear_error(tmp_path):
    ep, _ = _tables([[1], [1]], [[2], [3]], [1.0, 0.0])
    with pytest.raises(DataError, match="no reward for 1 episode"):
        build_samples(ep, pa.table({"event_id": ["e000"], "reward": [1.0]}), TrainConfig())
    with pytest.raises(DataError, match="rewards.reward: not a finite number for event e001"):
        build_samples(ep, pa.table({"event_id": ["e000", "e001"], "reward": [1.0, float("inf")]}), TrainConfig())
    lake = Lake(str(tmp_path / "lake"))
    with pytest.raises(DataError, match="runs/r1/episodes.parquet: not found"):
        load_samples(lake, "r1", TrainConfig())
    lake.write_parquet("runs/r1/episodes.parquet", ep.drop_columns(["completion_logprobs"]))
    lake.write_parquet("runs/r1/rewards.parquet", pa.table({"event_id": ["e000"], "reward": [1.0]}))
    with pytest.raises(DataError, match="missing column.*completion_logprobs"):
        load_samples(lake, "r1", TrainConfig())


def test_group_baseline_when_prompts_repeat_else_running_per_org():
    r = np.array([1.0, 0.0, 1.0, 0.0, 3.0, 1.0])
    groups = ["p1", "p1", "p1", "p1", "x", "y"]
    orgs = ["a", "a", "a", "a", "b", "b"]
    res = compute_advantages(r, groups, orgs, np.arange(6), mode="group", decay=0.5, normalize=False)
    assert res.grouped == 4 and res.running == 2
    np.testing.assert_allclose(res.advantages[:4], [0.5, -0.5, 0.5, -0.5])
    # org b: seeded with its mean 2.0; then ema = 0.5*2 + 0.5*3 = 2.5
    np.testing.assert_allclose(res.advantages[4:], [3.0 - 2.0, 1.0 - 2.5])
    running = compute_advantages(r, groups, orgs, np.arange(6), mode="running", decay=0.5, normalize=False)
    assert running.grouped == 0 and running.running == 6
    norm = compute_advantages(r, groups, orgs, np.arange(6), mode="group", normalize=True)
    assert norm.advantages.std() == pytest.approx(1.0)
    assert np.all(np.sign(norm.advantages) == np.sign(res.advantages))
    same = compute_advantages(np.ones(4), ["a"] * 4, ["o"] * 4, np.arange(4))
    assert np.all(same.advantages == 0)  # nothing to prefer: no push in any direction


def test_batches_are_left_padded_with_completions_right_aligned():
    tc = TrainConfig(normalize_advantages=False)
    ep, rw = _tables([[1, 2, 3], [4]], [[10, 11], [20, 21, 22]], [1.0, 0.0])
    samples, _ = build_samples(ep, rw, tc)
    b = collate(samples, pad_id=0)
    assert b.input_ids == [[1, 2, 3, 10, 11], [0, 4, 20, 21, 22]]
    assert b.attention_mask == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert b.loss_mask == [[0, 1, 1], [1, 1, 1]]
    assert b.behaviour_logprobs == [[0.0, -1.0, -1.0], [-1.0, -1.0, -1.0]]
    t = to_tensors(b, "cpu")
    assert t["targets"].tolist() == [[3, 10, 11], [20, 21, 22]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 2, 3]]


def test_plan_shards_every_episode_once_with_equal_counts_per_rank():
    tc = TrainConfig(micro_batch_size=2, grad_accum=2, seed=3)
    ep, rw = _tables([[1]] * 7, [[i + 2] for i in range(7)], [float(i) for i in range(7)])
    samples, _ = build_samples(ep, rw, tc)
    plans = [plan_batches(samples, tc, rank, 2, pad_id=0) for rank in range(2)]
    assert len(plans[0]) == len(plans[1]) and len(plans[0]) % tc.grad_accum == 0
    trained = [eid for plan in plans for b in plan for eid, m in zip(b.event_ids, b.loss_mask, strict=True) if any(m)]
    assert sorted(trained) == sorted(s.event_id for s in samples)
    again = plan_batches(samples, tc, 0, 2, pad_id=0)
    assert [b.event_ids for b in again] == [b.event_ids for b in plans[0]]  # deterministic: resume relies on it


def test_trainer_logprobs_on_padded_batches_equal_serving_logprobs(tiny_checkpoint, tmp_path):
    import torch

    from rl_core.models import load_model
    from rl_core.train.step import completion_logprobs

    lake = Lake(str(tmp_path / "lake"))
    run = synthetic.make_run(lake, "r-align", tiny_checkpoint, n_prompts=3, per_prompt=2, completion_len=5)
    samples, _ = load_samples(lake, "r-align", TrainConfig())
    samples[0].completion_ids = samples[0].completion_ids[:2]  # uneven completions too
    samples[0].behaviour_logprobs = samples[0].behaviour_logprobs[:2]
    model, _ = load_model(tiny_checkpoint)
    t = to_tensors(collate(samples, pad_id=0), "cpu")
    with torch.no_grad():
        logp, _ = completion_logprobs(model, t, with_entropy=False)
    m = t["loss_mask"] > 0
    torch.testing.assert_close(logp[m], t["behaviour_logprobs"][m], rtol=0, atol=2e-5)
    assert run.episodes == 6 and int(m.sum()) == 2 + 5 * 5


def test_policy_logprobs_use_each_episodes_sampling_temperature(tiny_checkpoint, tmp_path):
    """Served at T=0.8, the behaviour logprobs are under logits/0.8: the trainer must match them there
    (an unchanged policy has ratio 1), and would not at T=1."""
    import torch

    from rl_core.models import load_model
    from rl_core.serving.backends.hf import processed_logprobs
    from rl_core.train.step import completion_logprobs

    lake = Lake(str(tmp_path / "lake"))
    synthetic.make_run(lake, "r-temp", tiny_checkpoint, n_prompts=2, per_prompt=2, completion_len=4)
    ep = lake.read_parquet("runs/r-temp/episodes.parquet")
    ep = ep.append_column("temperature", pa.array([0.8] * ep.num_rows, pa.float32()))
    samples, stats = build_samples(ep, lake.read_parquet("runs/r-temp/rewards.parquet"), TrainConfig())
    assert [s.temperature for s in samples] == pytest.approx([0.8] * 4) and stats.top_p_below_one == 0
    model, _ = load_model(tiny_checkpoint)
    with torch.no_grad():
        for s in samples:  # what the transformers backend logs when it samples at T=0.8
            ids = torch.tensor([s.prompt_ids + s.completion_ids])  # [1,L]
            logits = model(input_ids=ids).logits[0]  # [L,V]
            s.behaviour_logprobs = [float(processed_logprobs(logits[len(s.prompt_ids) + j - 1], 0.8, 1.0)[tok])
                                    for j, tok in enumerate(s.completion_ids)]
        t = to_tensors(collate(samples, pad_id=0), "cpu")
        assert t["temperature"].tolist() == pytest.approx([0.8] * 4)
        logp, _ = completion_logprobs(model, t, with_entropy=False)  # [B,C]
        untempered, _ = completion_logprobs(model, {k: v for k, v in t.items() if k != "temperature"}, False)
    m = t["loss_mask"] > 0
    torch.testing.assert_close(logp[m], t["behaviour_logprobs"][m], rtol=0, atol=2e-5)
    assert (untempered[m] - t["behaviour_logprobs"][m]).abs().max() > 1e-2


def test_sampling_temperature_greedy_unknown_and_bad():
    from rl_core.train.data import sampling_temperature

    assert sampling_temperature(None, "e") == 1.0 and sampling_temperature(0.0, "e") == 1.0
    assert sampling_temperature(0.7, "e") == pytest.approx(0.7)
    with pytest.raises(DataError, match="episodes.temperature"):
        sampling_temperature(-1.0, "e9")
