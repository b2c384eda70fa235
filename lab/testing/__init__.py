"""Test support, not product: seeded data generators for the tests and the benchmarks.

Nothing under rl_core/ imports this package, and the wheel leaves it out (pyproject.toml); it is importable
from a checkout or an editable install, which is where tests/ and bench/ run.

  synth       raw interactions + feedback in the lake's contract, at any volume, with planted defects
  ab_synth    A/B logs with planted effects and per-user clustering, for the A/B analysis
  synthetic   a training run (episodes + rewards) whose reward prefers one token, for the trainer
  columns     the vectorised Arrow pieces the generators share, and the hour-partitioned lake writer
  texts       prompts, completions, follow-ups and tool specs the generators draw from
"""
