"""Rewards: SQL signals (sql/rewards/) + Python scorers -> one weighted reward per episode; hacking monitors."""

from rl_core.rewards.score import RewardsResult, score_run
from rl_core.schema import REWARDS_SCHEMA, SIGNALS

__all__ = ["REWARDS_SCHEMA", "SIGNALS", "RewardsResult", "score_run"]
