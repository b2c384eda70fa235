"""Simulated traffic: users that drive the real HTTP API. Raw events written straight into the lake at any volume
(tests, benchmarks, A/B analysis) come from lab.testing.synth, which does not ship."""
