"""The whole update, for real: DeepSpeed (ZeRO-0, the default for one rank; fp32, gloo) in a child process on the tiny model.

Learning must be visible: a synthetic reward prefers one token, and after one epoch that token's
probability after the prompts has risen; the saved HF folder reloads and generates; the summary, the
verdict and the MLflow metrics say what happened; a rerun with the same inputs does not train again.
"""

from __future__ import annotations

import json
import math

import pytest

from lab.testing import synthetic
from rl_core.lake import lake_from_config
from rl_core.registry import store
from rl_core.reports import read_verdict
from rl_core.train.launch import train


def test_train_raises_target_token_probability(registered):
    cfg = registered
    lake = lake_from_config(cfg)
    base_dir = store.checkpoint_path(cfg, 1)
    run = synthetic.make_run(lake, "cycle-learn", base_dir, n_prompts=8, per_prompt=4)
    before = synthetic.target_logprob(base_dir, run.prompts, run.target_token)
    before_avoided = synthetic.target_logprob(base_dir, run.prompts, run.avoided)

    s = train(cfg, "cycle-learn", 1)

    assert s.status == "ok" and s.exit_code == 0
    assert s.steps == 4  # 32 episodes / micro batch 8, one epoch
    after = synthetic.target_logprob(s.checkpoint, run.prompts, run.target_token)
    after_avoided = synthetic.target_logprob(s.checkpoint, run.prompts, run.avoided)
    # learning, not just "ran": the rewarded token gains (PPO's clip bounds one epoch to a few tenths of
    # a nat per token), while the first tokens of unrewarded completions lose
    assert after > before + 0.25, (before, after)
    assert after_avoided < before_avoided, (before_avoided, after_avoided)
    assert math.isfinite(s.loss) and 0 <= s.kl_max <= cfg.gates.kl_max
    assert 0.99 < s.is_weight_mean < 1.5  # behaviour logprobs are the model's own: ratios start at 1
    assert s.tokens_per_s > 0 and s.grad_norm > 0 and s.episodes == 32 and s.truncated == 0

    summary = lake.read_json("runs/cycle-learn/train/summary.json")
    assert summary["checkpoint"] == s.checkpoint and summary["mlflow_run_id"] == s.mlflow_run_id
    v = read_verdict(lake, "cycle-learn", "train")
    assert v is not None and v.passed, v

    c = store.client(cfg)
    hist = c.get_metric_history(s.mlflow_run_id, "train/loss")
    assert [m.step for m in hist] == [1, 2, 3, 4]
    assert c.get_run(s.mlflow_run_id).info.run_name == "train-cycle-learn"  # `v<N>-cycle-learn` once registered
    assert c.get_run(s.mlflow_run_id).data.metrics["train/kl_max"] == pytest.approx(s.kl_max)
    for key in ("train/kl", "train/clip_frac", "train/is_weight_max", "train/entropy", "train/grad_norm",
                "train/tokens_per_s"):
        assert len(c.get_metric_history(s.mlflow_run_id, key)) == 4, key

    from rl_core.models import smoke_generate

    assert isinstance(smoke_generate(s.checkpoint), str)
    meta = json.loads((cfg.models_dir / "runs" / "cycle-learn" / "checkpoint" / "rtrl_model.json").read_text())
    assert meta["parent_version"] == 1 and meta["kind"] == "trained"

    again = train(cfg, "cycle-learn", 1)  # same inputs: same files, no second update
    assert again.model_dump() == s.model_dump()
