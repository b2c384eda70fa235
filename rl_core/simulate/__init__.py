"""Simulated traffic: users that drive the real HTTP API, and synth.py, which writes raw events straight into
the lake at any volume (tests, benchmarks, A/B analysis)."""
