"""Serving engines behind one small interface (base.Backend). make_backend picks one from config."""

from __future__ import annotations

from pathlib import Path

from rl_core.config import Config
from rl_core.serving.backends.base import Backend, Generation, Sampling, StepOut

__all__ = ["Backend", "Generation", "Sampling", "StepOut", "engine_kind", "make_backend", "vllm_available"]


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def engine_kind(kind: str) -> str:
    """"vllm" | "transformers" for a configured kind: "auto" is vLLM where it is installed, else transformers."""
    if kind == "auto":
        return "vllm" if vllm_available() else "transformers"
    return kind


def make_backend(kind: str, checkpoint: str | Path, cfg: Config, version: int) -> Backend:
    """kind: "vllm" | "transformers" | "auto" (engine_kind)."""
    if engine_kind(kind) == "vllm":
        from rl_core.serving.backends.vllm import VLLMBackend  # lazy: heavy (vllm client, transformers)

        return VLLMBackend(checkpoint, cfg, version)
    from rl_core.serving.backends.hf import TransformersBackend  # lazy: heavy (torch)

    return TransformersBackend(checkpoint, dtype=cfg.model.dtype)
