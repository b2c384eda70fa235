"""The DeepSpeed worker: one process per rank, started by launch.py through deepspeed / torchrun / inline.

`python -m rl_core.train.trainer --spec SPEC.json`. It reads the run's episodes and rewards from the lake,
updates the parent checkpoint for one epoch (on-policy: every episode once, by default), logs per-step
metrics to MLflow from rank 0, saves the policy as an HF folder and writes a result JSON that the
launcher turns into the summary and the "train" verdict. A DeepSpeed checkpoint every
`checkpoint_every` optimizer steps lets a rerun after a crash continue where it stopped (the batch plan
is deterministic, so the rerun skips exactly the micro batches already applied).
RTRL_TRAIN_FAULT_AFTER_STEPS=N makes every rank exit with code 17 right after the checkpoint of step N:
the hook the resume test uses to crash a real run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rl_core.config import TrainConfig
from rl_core.lake import Lake
from rl_core.train.data import load_samples, plan_batches, to_tensors
from rl_core.train.export import gather_state_dict, save_hf

FAULT_ENV = "RTRL_TRAIN_FAULT_AFTER_STEPS"
FAULT_EXIT = 17
MEAN_KEYS = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "is_weight_mean", "is_trunc_frac")


class TrainSpec(BaseModel):
    """Everything a worker needs, written by the launcher as JSON (the worker reads no config file)."""

    run_id: str
    base_dir: str
    lake_root: str
    out_dir: str
    adapter_dir: str
    ds_dir: str
    result_path: str
    train: dict[str, Any]  # a config.TrainConfig dump
    tracking_uri: str = ""
    mlflow_run_id: str = ""
    meta: dict[str, Any] = {}


def use_bf16(precision: str) -> bool:
    import torch  # lazy: heavy (torch)

    if precision == "auto":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return precision == "bf16"


def ds_config(tc, bf16: bool) -> dict:
    """The DeepSpeed config for a TrainConfig: ZeRO stage, precision, accumulation, clipping, AdamW."""
    return {
        "train_micro_batch_size_per_gpu": tc.micro_batch_size,
        "gradient_accumulation_steps": tc.grad_accum,
        "gradient_clipping": tc.grad_clip,
        "optimizer": {
            "type": "AdamW",
            # torch_adam: torch's AdamW instead of DeepSpeed's fused op, which would need a compiler here
            "params": {"lr": tc.lora_lr if tc.lora else tc.lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
                       "torch_adam": True},
        },
        "zero_optimization": {"stage": tc.zero_stage, "stage3_gather_16bit_weights_on_model_save": True},
        "bf16": {"enabled": bf16},
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }


def make_engine(policy, params, tc, bf16: bool, world: int):
    """The DeepSpeed engine the trainer (and bench/train_throughput.py) uses.

    With one rank and ZeRO-0 there is nothing to average, yet the engine would still copy every gradient
    into a flat buffer, all-reduce it over a group of one and copy it back after each backward: measured
    at ~4% of a SmolLM2-135M step on 2 CPU cores. That all-reduce is switched off in exactly that case.
    """
    import deepspeed  # lazy: heavy (deepspeed)

    engine, *_ = deepspeed.initialize(model=policy, model_parameters=params, config=ds_config(tc, bf16))
    if world == 1 and tc.zero_stage == 0:
        engine.enable_backward_allreduce = False
    return engine


def _load_policy(spec: TrainSpec, tc, bf16: bool, device):
    """(policy to train, reference callable). LoRA: adapters on the policy; the reference is it without them."""
    import torch  # lazy: heavy (torch, transformers)
    from transformers import AutoModelForCausalLM

    from rl_core.train.step import reference_fn

    policy = AutoModelForCausalLM.from_pretrained(spec.base_dir, dtype=torch.float32)
    policy.config.use_cache = False
    if tc.lora:
        from peft import get_peft_model  # lazy: heavy (peft)

        policy = get_peft_model(policy, lora_config(tc))
        return policy, reference_fn(peft_model=policy)
    ref = AutoModelForCausalLM.from_pretrained(spec.base_dir, dtype=torch.bfloat16 if bf16 else torch.float32)
    ref.requires_grad_(False).eval().to(device)
    return policy, reference_fn(ref_model=ref)


def lora_config(tc):
    from peft import LoraConfig  # lazy: heavy (peft)

    return LoraConfig(r=tc.lora_r, lora_alpha=tc.lora_alpha, target_modules=list(tc.lora_targets),
                      lora_dropout=0.0, task_type="CAUSAL_LM")


def _resume(engine, ds_dir: Path) -> tuple[int, list[dict]]:
    if not (ds_dir / "latest").is_file():
        return 0, []
    path, client = engine.load_checkpoint(str(ds_dir))
    if path is None or not client:  # unreadable: train from the parent instead of from a half state
        raise RuntimeError(f"cannot resume from {ds_dir}; delete it to start the update over")
    return int(client["step"]), list(client["history"])


def _checkpoint(engine, ds_dir: Path, step: int, history: list[dict], rank: int) -> None:
    tag = f"step{step:06d}"
    engine.save_checkpoint(str(ds_dir), tag=tag, client_state={"step": step, "history": history})
    if rank == 0:  # keep only the latest tag
        for old in ds_dir.glob("step*"):
            if old.is_dir() and old.name != tag:
                shutil.rmtree(old, ignore_errors=True)


def _grad_norm(params) -> float:
    """The total L2 norm of the gradients (before clipping), as DeepSpeed reports it for ZeRO >= 1."""
    import torch  # lazy: heavy (torch)

    grads = [p.grad.detach() for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0


def _reduce(sums: dict[str, float], maxes: dict[str, float], device) -> tuple[dict, dict]:
    """Sum the token-weighted sums and max the maxima over ranks."""
    import torch  # lazy: heavy (torch)
    import torch.distributed as dist

    ks, km = sorted(sums), sorted(maxes)
    a = torch.tensor([sums[k] for k in ks], dtype=torch.float64, device=device)  # [K]
    b = torch.tensor([maxes[k] for k in km], dtype=torch.float64, device=device)  # [M]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(a, op=dist.ReduceOp.SUM)
        dist.all_reduce(b, op=dist.ReduceOp.MAX)
    return dict(zip(ks, a.tolist(), strict=True)), dict(zip(km, b.tolist(), strict=True))


class _MlflowLog:
    """Per-step metrics to the launcher's MLflow run (rank 0 only; a no-op without a run id)."""

    def __init__(self, spec: TrainSpec, rank: int):
        self.client = None
        self.run_id = spec.mlflow_run_id
        if rank == 0 and spec.mlflow_run_id and spec.tracking_uri:
            from mlflow import MlflowClient  # lazy: heavy (mlflow)

            self.client = MlflowClient(tracking_uri=spec.tracking_uri)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.client is None:
            return
        from mlflow.entities import Metric  # lazy: heavy (mlflow)

        ts = int(time.time() * 1000)
        rows = [Metric(f"train/{k}", float(v), ts, step) for k, v in metrics.items() if math.isfinite(v)]
        self.client.log_batch(self.run_id, metrics=rows)


def _optimizer_step(engine, micro_batches: list, tc, lc, ref, params: list, device) -> dict[str, float]:
    """One optimizer step over grad_accum micro-batches; its metrics, token-weighted over every rank."""
    from rl_core.train.step import compute_loss  # lazy: heavy (torch)

    t0, gn0 = time.time(), float("nan")
    sums: dict[str, float] = {k: 0.0 for k in MEAN_KEYS} | {"tokens": 0.0, "seq_tokens": 0.0}
    maxes = {"is_weight_max": 0.0}
    for b in micro_batches:
        t = to_tensors(b, device)
        out = compute_loss(engine, t, lc, ref)
        engine.backward(out.loss)
        if tc.zero_stage == 0 and engine.is_gradient_accumulation_boundary():
            gn0 = _grad_norm(params)  # ZeRO-0 clips without keeping the norm: take it before the step
        engine.step()
        n = float(out.metrics["tokens"])
        for k in MEAN_KEYS:
            v = out.loss.detach() if k == "loss" else out.metrics.get(k)
            sums[k] += float(v) * n if v is not None else 0.0
        sums["tokens"] += n
        sums["seq_tokens"] += float(t["attention_mask"].sum())
        maxes["is_weight_max"] = max(maxes["is_weight_max"], float(out.metrics["is_weight_max"]))
    sums, maxes = _reduce(sums, maxes, device)
    dt = max(time.time() - t0, 1e-9)
    rec = {k: sums[k] / max(sums["tokens"], 1.0) for k in MEAN_KEYS} | maxes
    gn = engine.get_global_grad_norm() if tc.zero_stage else gn0
    return rec | {"grad_norm": float(gn) if gn is not None else float("nan"), "tokens_per_s": sums["seq_tokens"] / dt,
                  "completion_tokens": sums["tokens"], "step_s": dt}


def run(spec: TrainSpec) -> int:
    """Train; returns the process exit code (0 ok)."""
    t_start = time.time()
    import deepspeed  # lazy: heavy (torch, deepspeed)
    import torch
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator
    from tqdm import tqdm

    from rl_core.train.loss import LossConfig

    tc = TrainConfig.model_validate(spec.train)
    cuda = torch.cuda.is_available()
    if cuda:
        get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", verbose=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(get_accelerator().current_device_name())
    torch.manual_seed(tc.seed)
    bf16 = use_bf16(tc.precision)

    samples, stats = load_samples(Lake(spec.lake_root), spec.run_id, tc)
    policy, ref = _load_policy(spec, tc, bf16, device)
    pad_id = next((i for i in (policy.config.pad_token_id, policy.config.eos_token_id) if isinstance(i, int)), 0)
    batches = plan_batches(samples, tc, rank, world, pad_id)  # pads are masked out: any valid id does
    total_steps = len(batches) // tc.grad_accum
    if tc.max_steps:
        total_steps = min(total_steps, tc.max_steps)
    params = [p for p in policy.parameters() if p.requires_grad]
    engine = make_engine(policy, params, tc, bf16, world)
    ds_dir = Path(spec.ds_dir)
    start_step, history = _resume(engine, ds_dir)
    t_ready = time.time()
    lc, log = LossConfig.from_train(tc), _MlflowLog(spec, rank)
    fault_at = int(os.environ.get(FAULT_ENV, "0") or 0)
    engine.train()

    bar = tqdm(total=total_steps, initial=start_step, disable=rank != 0, file=sys.stderr, mininterval=1.0,
               desc=f"train {spec.run_id}", unit="step")
    for step in range(start_step, total_steps):
        micro = batches[step * tc.grad_accum:(step + 1) * tc.grad_accum]
        rec = _optimizer_step(engine, micro, tc, lc, ref, params, device) | {"step": step + 1}
        history.append(rec)
        log.log(step + 1, {k: v for k, v in rec.items() if k != "step"})
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.4f}", kl=f"{rec['kl']:.4f}", tok_s=f"{rec['tokens_per_s']:.0f}")
        last = step + 1 == total_steps
        if tc.checkpoint_every and ((step + 1) % tc.checkpoint_every == 0 or (fault_at and step + 1 == fault_at)) \
                and not last:
            _checkpoint(engine, ds_dir, step + 1, history, rank)
        if fault_at and step + 1 == fault_at and not last:
            bar.close()
            print(f"{FAULT_ENV}={fault_at}: exiting after the checkpoint of step {fault_at}", file=sys.stderr)
            sys.stdout.flush()
            os._exit(FAULT_EXIT)
    bar.close()
    t_trained = time.time()

    sd = gather_state_dict(engine, tc.zero_stage, rank)
    if rank == 0:
        meta = {"kind": "trained", "run_id": spec.run_id, "steps": len(history), **spec.meta}
        save_hf(sd, Path(spec.base_dir), Path(spec.out_dir), meta,
                lora=lora_config(tc) if tc.lora else None, adapter_dir=Path(spec.adapter_dir))
        result = {
            "status": "ok", "steps": len(history), "resumed_from_step": start_step, "world_size": world,
            "zero_stage": tc.zero_stage, "precision": "bf16" if bf16 else "fp32", "device": str(device),
            "data": asdict(stats) | {"truncated": stats.truncated}, "micro_batches_per_rank": len(batches),
            "history": history, "startup_s": t_ready - t_start, "train_s": t_trained - t_ready,
            "total_s": time.time() - t_start, "out_dir": spec.out_dir,
            "adapter_dir": spec.adapter_dir if tc.lora else None,
        }
        tmp = Path(spec.result_path).with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, spec.result_path)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="rtrl DeepSpeed trainer worker (started by `rtrl train`)")
    ap.add_argument("--spec", required=True, help="TrainSpec JSON written by rl_core.train.launch")
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    args = ap.parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    spec = TrainSpec.model_validate_json(Path(args.spec).read_text())
    return run(spec)


if __name__ == "__main__":
    sys.exit(main())
