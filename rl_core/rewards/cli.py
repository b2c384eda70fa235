"""`rtrl rewards --run-id R [--parent-version V]`: score a run's episodes, then run the hacking monitors."""

from __future__ import annotations

import argparse

from rl_core.config import load_config
from rl_core.rewards.monitors import run_monitors
from rl_core.rewards.score import score_run


def add_rewards(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-id", required=True)
    p.add_argument("--parent-version", type=int, default=None,
                   help="run the reward-hacking monitors against this version (omit to only score)")
    p.set_defaults(run=_run)


def _run(args) -> int:
    cfg = load_config()
    try:
        r = score_run(cfg, args.run_id)
    except (ValueError, FileNotFoundError) as exc:
        print(f"rtrl rewards: {exc}")
        return 2
    print(f"rewards {r.run_id}: {r.n_episodes} episodes, mean reward {r.mean_reward:.4f}, "
          f"{r.n_broken_tool_calls} broken tool calls, {r.n_clarifying} clarifying; config {r.reward_config_hash}")
    if args.parent_version is not None:
        v = run_monitors(cfg, args.run_id, args.parent_version)
        print(f"monitors: {'passed' if v.passed else 'TRIPPED'}")
        for reason in v.reasons:
            print(f"  - {reason}")
        return 0 if v.passed else 1
    return 0
