"""The DeepSpeed worker: one process per rank, started by launch.py through deepspeed / torchrun / inline.

`python -m rl_core.train.trainer --spec SPEC.json`. It reads the run's episodes and rewards from the lake,
updates the parent checkpoint for one epoch (on-policy: every episode once, by default), logs per-step
metrics to MLflow from rank 0, saves the policy as an HF folder and writes a result JSON that the
launcher turns into the summary and the "train" verdict. Each rank loads only its shard of the
episodes (rl_core/train/data.py). Logging, checkpointing (a rerun after a crash resumes) and the fault
hook the resume test crashes a run with (RTRL_TRAIN_FAULT_AFTER_STEPS) are callbacks
(rl_core/train/callbacks.py), so the loop in run() only trains.
The spec is one typed JSON document: the launcher writes it from a validated TrainConfig and the worker
validates it once on reading (TrainSpec.model_validate_json); nothing downstream re-parses a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rl_core.config import TrainConfig
from rl_core.lake import Lake
from rl_core.train.callbacks import Callbacks, Checkpointer, FaultInjector, MlflowLogger, ProgressBar
from rl_core.train.data import Batch, DataStats, load_samples, plan_batches, to_tensors
from rl_core.train.export import gather_state_dict, save_hf

MEAN_KEYS = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "is_weight_mean", "is_trunc_frac")


class TrainSpec(BaseModel):
    """Everything a worker needs, written by the launcher as JSON (the worker reads no config file).

    `train` is the TrainConfig itself, not a dump of it: the launcher passes the validated instance (kept
    as is) and the worker's model_validate_json checks it with the rest of the spec, once.
    """

    run_id: str
    base_dir: str
    lake_root: str
    out_dir: str
    adapter_dir: str
    ds_dir: str
    result_path: str
    train: TrainConfig
    tracking_uri: str = ""
    mlflow_run_id: str = ""
    meta: dict[str, Any] = {}


def use_bf16(precision: str) -> bool:
    import torch  # lazy: heavy (torch)

    if precision == "auto":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return precision == "bf16"


def ds_config(tc: TrainConfig, bf16: bool) -> dict:
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


def make_engine(policy, params, tc: TrainConfig, bf16: bool, world: int):
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


def _load_policy(spec: TrainSpec, tc: TrainConfig, bf16: bool, device):
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


def lora_config(tc: TrainConfig):
    from peft import LoraConfig  # lazy: heavy (peft)

    return LoraConfig(r=tc.lora_r, lora_alpha=tc.lora_alpha, target_modules=list(tc.lora_targets),
                      lora_dropout=0.0, task_type="CAUSAL_LM")


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


def _optimizer_step(engine, micro_batches: list[Batch], tc: TrainConfig, lc, ref, params: list,
                    device) -> dict[str, float]:
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


@dataclass
class _Rank:
    rank: int
    world: int
    device: Any  # torch.device
    bf16: bool


def _init_distributed(tc: TrainConfig) -> _Rank:
    """Join the process group (NCCL on GPUs, gloo on CPUs) and seed torch: this rank's place and device."""
    import deepspeed  # lazy: heavy (torch, deepspeed)
    import torch
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    cuda = torch.cuda.is_available()
    if cuda:
        get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", verbose=False)
    torch.manual_seed(tc.seed)
    return _Rank(dist.get_rank(), dist.get_world_size(), torch.device(get_accelerator().current_device_name()),
                 use_bf16(tc.precision))


def run(spec: TrainSpec) -> int:
    """Train; returns the process exit code (0 ok)."""
    t_start = time.time()
    import torch.distributed as dist  # lazy: heavy (torch)

    from rl_core.train.loss import LossConfig

    tc = spec.train
    r = _init_distributed(tc)
    samples, stats = load_samples(Lake(spec.lake_root), spec.run_id, tc, r.rank, r.world)  # this rank's shard
    policy, ref = _load_policy(spec, tc, r.bf16, r.device)
    pad_id = next((i for i in (policy.config.pad_token_id, policy.config.eos_token_id) if isinstance(i, int)), 0)
    batches = plan_batches(samples, tc, r.rank, r.world, pad_id, total=stats.episodes)  # pads are masked out
    total_steps = len(batches) // tc.grad_accum
    if tc.max_steps:
        total_steps = min(total_steps, tc.max_steps)
    params = [p for p in policy.parameters() if p.requires_grad]
    engine = make_engine(policy, params, tc, r.bf16, r.world)
    fault = FaultInjector.from_env()
    ckpt = Checkpointer(engine, Path(spec.ds_dir), r.rank, tc.checkpoint_every, also_at=fault.at)
    start_step, history = ckpt.resume()
    t_ready = time.time()
    bar = ProgressBar(total_steps, start_step, r.rank, f"train {spec.run_id}")
    fault.before_exit = bar.close
    callbacks = Callbacks([MlflowLogger(spec.tracking_uri, spec.mlflow_run_id, r.rank), bar, ckpt, fault])
    lc = LossConfig.from_train(tc)
    engine.train()

    for step in range(start_step, total_steps):
        micro = batches[step * tc.grad_accum:(step + 1) * tc.grad_accum]
        rec = _optimizer_step(engine, micro, tc, lc, ref, params, r.device) | {"step": step + 1}
        history.append(rec)
        callbacks.on_step_end(step + 1, rec, last=step + 1 == total_steps)
    callbacks.on_train_end()
    t_trained = time.time()

    sd = gather_state_dict(engine, tc.zero_stage, r.rank)
    if r.rank == 0:
        timing = {"startup_s": t_ready - t_start, "train_s": t_trained - t_ready}
        _save(spec, r, sd, stats, history, start_step, len(batches), timing, t_start)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _save(spec: TrainSpec, r: _Rank, sd: dict, stats: DataStats, history: list[dict], start_step: int,
          n_batches: int, timing: dict[str, float], t_start: float) -> None:
    """Rank 0: the policy as an HF folder (and the LoRA adapter), then the result JSON the launcher reads
    (total_s counts the save too)."""
    tc = spec.train
    meta = {"kind": "trained", "run_id": spec.run_id, "steps": len(history), **spec.meta}
    save_hf(sd, Path(spec.base_dir), Path(spec.out_dir), meta,
            lora=lora_config(tc) if tc.lora else None, adapter_dir=Path(spec.adapter_dir))
    result = {
        "status": "ok", "steps": len(history), "resumed_from_step": start_step, "world_size": r.world,
        "zero_stage": tc.zero_stage, "precision": "bf16" if r.bf16 else "fp32", "device": str(r.device),
        "data": asdict(stats) | {"truncated": stats.truncated}, "micro_batches_per_rank": n_batches,
        "history": history, **timing, "total_s": time.time() - t_start, "out_dir": spec.out_dir,
        "adapter_dir": spec.adapter_dir if tc.lora else None,
    }
    tmp = Path(spec.result_path).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, spec.result_path)


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
