"""The caller's side of training: start the DeepSpeed workers, wait, and report what happened.

`train(cfg, run_id, base_version)` is what the Airflow task (and `rtrl train`) calls. It never imports
torch: the workers run in their own processes through the configured launcher, so the caller stays
small and a crashed or killed update cannot take the scheduler's worker down with it.
  deepspeed  python -m deepspeed.launcher.runner (num_procs per node, or a hostfile for GPU nodes)
  torchrun   python -m torch.distributed.run --nproc_per_node num_procs
  inline     one child process with RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR/PORT (fastest start; also
             what `deepspeed` with num_procs = 1 and no hostfile runs)
A one-process launch is forked from a warm server when RTRL_WARM_SOCKET names one (`rtrl experiment` starts
it, lab/warm.py): the same command, without ~7 s of torch/DeepSpeed/transformers imports.
It writes runs/<run_id>/train/summary.json and the verdict "train" (loss finite, KL <= gates.kl_max, at
least one optimizer step), raises TrainFailed when the workers fail and GateFailed when the verdict does.
Rerunning a finished run with the same inputs returns its summary without training again; rerunning a
crashed one resumes from the workers' DeepSpeed checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

from rl_core.artifacts import TrainSummary  # noqa: F401 (re-exported: what train() returns)
from rl_core.config import REPO_ROOT, Config, TrainConfig, load_config
from rl_core.ids import check_run_id, mlflow_filter_value
from rl_core.lake import Lake, lake_from_config
from rl_core.registry import store
from rl_core.reports import GateFailed, Verdict, write_verdict
from rl_core.runtime import jobs
from rl_core.runtime.procs import exit_on_sigterm, free_port
from rl_core.train.data import DataError, load_samples
from rl_core.train.trainer import TrainSpec


class TrainFailed(RuntimeError):
    """The training processes failed (non-zero exit or timeout); summary.json holds the exit code and log tail."""


def build_command(tc: TrainConfig, spec_path: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The launcher command line and the extra environment for the workers."""
    py, mod = sys.executable, "rl_core.train.trainer"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    if tc.launcher == "inline" or (tc.launcher == "deepspeed" and tc.num_procs == 1 and not tc.hostfile):
        # one process on this node: the deepspeed launcher would only add a second Python + torch start (~4 s)
        return [py, "-m", mod, "--spec", str(spec_path)], env | {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                                                                  "LOCAL_WORLD_SIZE": "1"}
    if tc.launcher == "torchrun":
        return [py, "-m", "torch.distributed.run", f"--nproc_per_node={tc.num_procs}", "--master_addr=127.0.0.1",
                f"--master_port={port}", "-m", mod, "--spec", str(spec_path)], env
    cmd = [py, "-m", "deepspeed.launcher.runner", f"--master_port={port}"]
    if tc.hostfile:
        cmd += [f"--hostfile={tc.hostfile}", f"--num_gpus={tc.num_procs}"]
    else:
        cmd += [f"--num_gpus={tc.num_procs}", "--master_addr=127.0.0.1"]
    return cmd + ["--module", mod, "--spec", str(spec_path)], env


def _worker_env(cfg: Config, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ) | extra
    procs = cfg.train.num_procs if cfg.train.launcher != "inline" else 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // procs)))
    # DeepSpeed JIT-builds its CPU comm op with the `ninja` on PATH. Two ninjas (the system's 1.11 and the
    # venv's 1.13) each discard the other's build log, so alternating between them rebuilt the op (40-70 s)
    # on every switch: always use this environment's, in a build folder of its own (cflags name the venv).
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, *(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)])
    tag = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "rtrl" / "torch_extensions" / tag))
    clear_stale_build_locks(Path(env["TORCH_EXTENSIONS_DIR"]))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def clear_stale_build_locks(ext_dir: Path, max_age_s: float = 600.0) -> list[Path]:
    """Remove JIT-build lock files older than max_age_s (a compile takes ~1 min here).

    torch's extension builder waits forever on a `lock` file, and a process killed mid-compile leaves one
    behind: every later training would hang. Returns the locks removed.
    """
    removed = []
    now = time.time()
    for lock in ext_dir.glob("*/lock") if ext_dir.is_dir() else []:
        try:
            if now - lock.stat().st_mtime > max_age_s:
                lock.unlink()
                removed.append(lock)
        except FileNotFoundError:
            pass
    return removed


def _inputs_hash(cfg: Config, lake: Lake, run_id: str, base_version: int, base_dir: Path) -> str:
    h = hashlib.sha256(cfg.train.model_dump_json().encode())
    h.update(f"{base_version}|{base_dir}".encode())
    for name in ("episodes.parquet", "rewards.parquet"):
        with lake.fs.open(lake.path(lake.run(run_id).file(name)), "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def _mlflow_run(cfg: Config, run_id: str, params: dict) -> str:
    """The MLflow run `train-<run_id>`, found again by its run_id tag (registering renames it `v<N>-<run_id>`),
    so a resumed or retried run continues its curves."""
    c, exp = store.client(cfg), store.experiment_id(cfg)
    name = f"train-{run_id}"
    found = c.search_runs([exp], filter_string=f"tags.run_id = {mlflow_filter_value(run_id)}", max_results=1)
    if found:
        c.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    r = c.create_run(exp, run_name=name, tags={"run_id": run_id, "kind": "train"})
    for k, v in params.items():
        c.log_param(r.info.run_id, k, v)
    return r.info.run_id


def _run_workers(cmd: list[str], env: dict, log_path: Path, timeout_s: float) -> tuple[int, str]:
    """Run the launcher in its own process group, echoing its output to ours and to log_path."""
    with open(log_path, "a") as log:
        def echo(line: str) -> None:
            sys.stdout.write(line)
            log.write(line)

        res = jobs.run_streamed(cmd, env, REPO_ROOT, echo, timeout_s)  # a warm fork when env names a warm server
    tail = "".join(line + "\n" for line in res.tail)
    if res.timed_out:
        tail += f"\n[rtrl] training killed after {timeout_s:.0f}s (train.timeout_s)\n"
    return res.rc, tail


def _summarize(base: dict, result: dict) -> dict:
    hist = result["history"]

    def mean(k: str) -> float:
        vals = [h[k] for h in hist if math.isfinite(h.get(k, float("nan")))]
        return sum(vals) / len(vals) if vals else float("nan")

    train_s = sum(h["step_s"] for h in hist)
    tokens = sum(h["tokens_per_s"] * h["step_s"] for h in hist)
    return base | {
        "steps": result["steps"], "loss": mean("loss"), "kl": mean("kl"),
        "kl_max": max((h["kl"] for h in hist), default=float("nan")), "clip_frac": mean("clip_frac"),
        "is_weight_mean": mean("is_weight_mean"), "is_weight_max": max((h["is_weight_max"] for h in hist), default=0.0),
        "entropy": mean("entropy"), "grad_norm": mean("grad_norm"),
        "tokens_per_s": tokens / train_s if train_s else float("nan"),
        "episodes": result["data"]["episodes"], "truncated": result["data"]["truncated"],
        "checkpoint": result["out_dir"], "adapter": result["adapter_dir"], "precision": result["precision"],
        "resumed_from_step": result["resumed_from_step"], "data": result["data"], "world_size": result["world_size"],
    }


def check(cfg: Config, s: TrainSummary) -> Verdict:
    """The "train" verdict: the update ran, its loss is finite and it stayed close to the parent."""
    reasons = []
    if s.status != "ok":
        reasons.append(f"training processes failed with exit code {s.exit_code}")
    if s.steps < 1:
        reasons.append("no optimizer step was taken")
    if s.loss is None:
        reasons.append("loss is not finite (or missing)")
    if s.kl_max is None:
        reasons.append("KL to the parent is not finite (or missing)")
    elif s.kl_max > cfg.gates.kl_max:
        reasons.append(f"KL to the parent {s.kl_max:.4g} exceeds gates.kl_max {cfg.gates.kl_max}")
    details = {"loss": s.loss, "kl_max": s.kl_max, "kl_limit": cfg.gates.kl_max, "steps": s.steps,
               "exit_code": s.exit_code}
    return Verdict(name="train", passed=not reasons, reasons=reasons, details=details)


def train(cfg: Config, run_id: str, base_version: int) -> TrainSummary:
    """Update version `base_version` on runs/<run_id>'s episodes; the new policy lands in
    cfg.models_dir/runs/<run_id>/checkpoint. See the module docstring for errors and reruns. A run id that
    breaks rl_core.ids' rule raises IdError before anything is read or written."""
    check_run_id(run_id)
    lake = lake_from_config(cfg)
    load_samples(lake, run_id, cfg.train)  # bad input fails here, before anything is written (DataError)
    base_dir = store.checkpoint_path(cfg, base_version)
    work = cfg.models_dir / "runs" / run_id
    work.mkdir(parents=True, exist_ok=True)
    out_dir, summary_path = work / "checkpoint", lake.run(run_id).train_summary
    inputs_hash = _inputs_hash(cfg, lake, run_id, base_version, base_dir)
    if lake.exists(summary_path):
        prev = TrainSummary.model_validate(lake.read_json(summary_path))
        if prev.status == "ok" and prev.inputs_hash == inputs_hash and (out_dir / "rtrl_model.json").is_file():
            return prev  # idempotent rerun: same inputs, same files
    ds_dir = work / "ds"
    if (work / "inputs_hash").is_file() and (work / "inputs_hash").read_text() != inputs_hash:
        shutil.rmtree(ds_dir, ignore_errors=True)  # a checkpoint of other inputs must not be resumed
    (work / "inputs_hash").write_text(inputs_hash)

    tc = cfg.train
    params = {k: getattr(tc, k) for k in ("launcher", "num_procs", "zero_stage", "lr", "micro_batch_size",
                                          "grad_accum", "clip_eps", "is_cap", "kl_coef", "lora")}
    mlflow_run_id = _mlflow_run(cfg, run_id, params | {"base_version": base_version})
    result_path = work / "result.json"
    result_path.unlink(missing_ok=True)
    spec = TrainSpec(run_id=run_id, base_dir=str(base_dir), lake_root=cfg.lake_root, out_dir=str(out_dir),
                     adapter_dir=str(work / "adapter"), ds_dir=str(ds_dir), result_path=str(result_path),
                     train=tc, tracking_uri=cfg.tracking_uri, mlflow_run_id=mlflow_run_id,
                     meta={"parent_version": base_version, "inputs_hash": inputs_hash})
    spec_path = work / "spec.json"
    spec_path.write_text(spec.model_dump_json(indent=2))  # the one serialisation; the worker validates it once
    cmd, extra = build_command(tc, spec_path, free_port())
    t0 = time.time()
    rc, tail = _run_workers(cmd, _worker_env(cfg, extra), work / "train.log", tc.timeout_s)
    base = {"run_id": run_id, "exit_code": rc, "base_version": base_version, "mlflow_run_id": mlflow_run_id,
            "launcher": tc.launcher, "num_procs": 1 if tc.launcher == "inline" else tc.num_procs,
            "zero_stage": tc.zero_stage, "elapsed_s": time.time() - t0, "inputs_hash": inputs_hash}
    if rc == 0 and result_path.is_file():
        summary = TrainSummary(status="ok", **_summarize(base, json.loads(result_path.read_text())))
        shutil.rmtree(ds_dir, ignore_errors=True)  # the HF folder is the artifact now
    else:
        summary = TrainSummary(status="failed", log_tail=tail[-4000:], **base)
    verdict = check(cfg, summary)
    lake.write_json(summary_path, summary.model_dump(mode="json"))
    write_verdict(lake, run_id, verdict)
    _close_mlflow(cfg, mlflow_run_id, summary)
    if summary.status != "ok":
        raise TrainFailed(f"training of {run_id} failed (exit code {rc}); log {work / 'train.log'}:\n{tail[-2000:]}")
    if not verdict.passed:
        raise GateFailed(verdict)
    return summary


# The summary's names on the MLflow run: train/<name> beside the trainer's per-step curves (train/loss, train/kl,
# ...), never the same name twice, so the runs table shows each number once (rl_core/registry/card.py).
SUMMARY_METRICS = {"loss": "loss_mean", "kl": "kl_mean", "kl_max": "kl_max", "clip_frac": "clip_frac_mean",
                   "is_weight_mean": "is_weight_avg", "is_weight_max": "is_weight_peak", "entropy": "entropy_mean",
                   "grad_norm": "grad_norm_mean", "tokens_per_s": "tokens_per_s_mean", "steps": "steps",
                   "truncated": "truncated", "episodes": "episodes"}


def summary_metrics(summary: TrainSummary) -> dict[str, float]:
    """A trainer summary as train/* metrics; unknown or non-finite values left out."""
    out = {f"train/{name}": getattr(summary, k) for k, name in SUMMARY_METRICS.items()}
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def _close_mlflow(cfg: Config, mlflow_run_id: str, s: TrainSummary) -> None:
    c = store.client(cfg)
    for k, v in summary_metrics(s).items():
        c.log_metric(mlflow_run_id, k, v)
    c.set_tag(mlflow_run_id, "checkpoint", s.checkpoint)
    c.set_terminated(mlflow_run_id, status="FINISHED" if s.status == "ok" else "FAILED")


# --- rtrl train ------------------------------------------------------------------------------------

def add_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-id", required=True, help="the cycle's run id (runs/<run_id>/ in the lake)")
    p.add_argument("--base", type=int, default=None, help="MLflow version to update (default: the champion)")
    p.add_argument("--launcher", choices=["deepspeed", "torchrun", "inline"], default=None)
    p.add_argument("--num-procs", type=int, default=None, help="processes per node (CPU processes or GPUs)")
    p.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=None)
    p.set_defaults(run=_run)


def _run(args) -> int:
    cfg = load_config()
    for key, value in (("launcher", args.launcher), ("num_procs", args.num_procs), ("zero_stage", args.zero_stage)):
        if value is not None:
            setattr(cfg.train, key, value)
    base = args.base if args.base is not None else store.version_for_alias(cfg, "champion")
    if base is None:
        print("rtrl train: no --base given and no champion alias (run `rtrl init`)", file=sys.stderr)
        return 2
    try:
        with exit_on_sigterm():  # Airflow's on_kill or a scheduler's kill reaches the trainer ranks too
            s = train(cfg, args.run_id, base)
    except DataError as exc:
        print(f"rtrl train: {exc}", file=sys.stderr)
        return 2
    except GateFailed as exc:
        print(f"rtrl train: {exc}", file=sys.stderr)
        return 1
    except TrainFailed as exc:
        print(f"rtrl train: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(s.model_dump(mode="json", exclude={"data", "log_tail"}), indent=2))
    return 0
