# rtrl: `make cycle` runs one real cycle on the embedded defaults; `make test` runs the tests.
# Both set up .venv first (idempotent: a second run only checks a stamp).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rtrl-setup-stamp
export DS_ACCELERATOR ?= cpu
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup sysdeps test test-slow test-all cycle stack lint init airflow mlflow bench clean lock

setup: $(STAMP)

# Debian packages the tests use: chromium drives the Airflow and MLflow UIs in tests/test_ui_browser.py;
# postgresql and redis-server run the production stack (`make stack`, tests/test_stack.py); docker-compose
# validates docker-compose.yaml offline; bubblewrap is the sandbox that model-written code runs in (evals/sandbox.py:
# without it no model code runs and the eval and sandbox tests fail, loudly). Installed with apt when missing and we
# may (root, or password-less sudo); otherwise the browser and stack tests skip.
SYSTEM_PACKAGES := bubblewrap chromium postgresql redis-server docker-compose
sysdeps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then echo "no apt-get: $$missing not installed (browser tests skip)"; exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else echo "not root and no sudo: $$missing not installed (browser tests skip)"; exit 0; fi; \
	echo "apt-get install $$missing"; \
	$$sudo apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q $$missing >/dev/null

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q pip==26.3
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# `make test`: the default suite, every test not marked slow (666 tests; 6-8.5 min on 2 idle cores). `make test-slow`: the end-to-end
# tests (real Airflow runs, DeepSpeed ranks, vLLM, browsers on the UIs, the production stack; ~36 min). CI
# (.ci/run) runs both; `make test-all` adds the very long multi-cycle experiment.
test: setup sysdeps
	$(PY) -m pytest -q -m "not slow"

test-slow: setup sysdeps
	$(PY) -m pytest -q -m "slow and not very_slow"

test-all: setup sysdeps
	$(PY) -m pytest -q

# The production topology on this machine, without docker (lab/stack/): PostgreSQL, Redis, an S3
# endpoint, the MLflow server, Airflow with the CeleryExecutor and two workers. Idempotent; `rtrl stack down`.
stack: setup sysdeps
	$(PY) -m rl_core.cli stack up

# One real cycle: init if needed, gateway, simulated traffic, a run of realtime_rl through the scheduler (`airflow
# standalone` on :8080 while it lasts; its data interval is the traffic's window, its outcome its note), report.
# Its task logs are in the UI like any run's (`make airflow`; stop that first: one scheduler per metadata DB).
# `python -m` keeps the checkout on sys.path (rl_core and evals), whatever the editable install maps.
cycle: setup
	$(PY) -m rl_core.cli cycle

init: setup
	$(VENV)/bin/rtrl init

# The UIs on the embedded stores (var/): each runs under its own session until Ctrl-C, then its whole
# process group is stopped. URLs and credentials are printed once the UI answers. `make airflow` shows every run,
# `make cycle`'s included (their task logs and notes); its scheduler runs the schedule once the DAG is unpaused.
airflow: setup
	$(PY) -m rl_core.cli cycle --ui airflow

mlflow: setup
	$(PY) -m lab.stack.mlflow_ui

lint: setup
	$(VENV)/bin/ruff check .

lock:
	rm -rf /tmp/rtrl-lock && $(PYTHON) -m venv /tmp/rtrl-lock
	/tmp/rtrl-lock/bin/pip install -q pip==26.3 && /tmp/rtrl-lock/bin/pip install -r requirements.in
	( head -2 requirements.txt; /tmp/rtrl-lock/bin/pip freeze --exclude-editable | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/' ) > requirements.txt.new
	mv requirements.txt.new requirements.txt

clean:
	rm -rf $(VENV) var
