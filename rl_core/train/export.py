"""The trained policy out of DeepSpeed, as the HF safetensors folder every serving backend loads.

The weights are gathered from the engine (ZeRO-3 shards are consolidated by a collective every rank
joins), then loaded on rank 0 into a fresh copy of the parent checkpoint, which fixes the dtype (that of
the parent, whatever the training precision), the config and tied embeddings, and saved atomically
(hidden temp folder, marker file, rename). In LoRA mode the adapter is saved on its own (for
per-organisation specialisation) and merged into the full folder that serving loads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from rl_core.models import DONE_MARK

_MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors.index.json", DONE_MARK}


def gather_state_dict(engine, zero_stage: int, rank: int) -> dict | None:
    """The full state dict on rank 0 (None elsewhere). Collective under ZeRO-3: call on every rank."""
    if zero_stage == 3:
        sd = engine._zero3_consolidated_16bit_state_dict()  # what save_16bit_model uses; full on rank 0
        return sd if rank == 0 else None
    return engine.module.state_dict() if rank == 0 else None


def _load_into(model, sd: dict, tied: bool) -> None:
    missing, unexpected = model.load_state_dict(sd, strict=False)
    allowed = {k for k in missing if tied and k.endswith("lm_head.weight")}  # tied to the embeddings
    if unexpected or set(missing) - allowed:
        raise RuntimeError(f"exported weights do not fit the parent: missing {sorted(set(missing) - allowed)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]}")


def _replace(tmp: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)


def save_hf(sd: dict, base_dir: Path, out_dir: Path, meta: dict, lora=None, adapter_dir: Path | None = None) -> Path:
    """Write the policy as an HF folder at out_dir (rank 0 only). lora: a peft LoraConfig or None."""
    from transformers import AutoModelForCausalLM  # lazy: heavy (transformers)

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if lora is not None:
        from peft import get_peft_model  # lazy: heavy (peft)

        peft_model = get_peft_model(model, lora)
        _load_into(peft_model, sd, tied)
        assert adapter_dir is not None
        tmp_a = Path(tempfile.mkdtemp(prefix=".adapter-", dir=out_dir.parent))
        peft_model.save_pretrained(tmp_a)
        _replace(tmp_a, adapter_dir)
        model = peft_model.merge_and_unload()
    else:
        _load_into(model, sd, tied)
    tmp = Path(tempfile.mkdtemp(prefix=".ckpt-", dir=out_dir.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    for f in Path(base_dir).iterdir():  # tokenizer and chat template files, as the parent has them
        if f.is_file() and f.name not in _MODEL_FILES and not f.name.endswith((".safetensors", ".bin")):
            shutil.copy2(f, tmp / f.name)
    (tmp / DONE_MARK).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    _replace(tmp, out_dir)
    return out_dir
