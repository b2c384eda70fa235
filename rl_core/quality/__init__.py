"""Great Expectations gates between the cycle's stages (raw window, episodes, rewards)."""

from rl_core.quality.gates import gate_episodes, gate_raw, gate_rewards

__all__ = ["gate_episodes", "gate_raw", "gate_rewards"]
