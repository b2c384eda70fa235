"""The vLLM backend: the gateway starts and supervises vLLM's OpenAI server for one served version.

Why a subprocess and not LLM() in-process: vLLM owns its engine loop, memory and threads; a separate
process keeps the gateway responsive and lets the supervisor restart a dead engine. The gateway sends
prompt *token ids* to /v1/completions (so the logged prompt is exactly what was computed) and asks for
the sampled token ids (return_token_ids) and their logprobs; the server runs with
--logprobs-mode processed_logprobs, so a logprob is under the distribution actually sampled from
(after temperature/top_p), like the transformers backend. fp32 on CPU (bf16 logprobs are ~0.4 off).
New weights: with serving.vllm_hot_reload (default), the router reuses an engine no alias needs: it drains
in-flight requests, then calls our worker extension's rtrl_reload_weights over /collective_rpc
(VLLM_SERVER_DEV_MODE=1; vllm_worker.py: vLLM's reload_weights plus a repack of the CPU GEMM copies that
reload_weights leaves stale) and resets the prefix cache: 0.1 s (tiny model) instead of a ~45 s engine start, and the
logprobs match a fresh forward of the new weights (tests/test_serving_vllm.py). Off: the router starts a
fresh engine beside the old one and swaps when it is healthy (twice the memory for a while).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from rl_core.config import Config
from rl_core.runtime.procs import free_port, stop_group
from rl_core.serving.backends.base import Generation, Sampling, StepOut, collect_stream

log = logging.getLogger("rtrl.serving.vllm")
SERVED_NAME = "policy"


class VLLMBackend:
    name = "vllm"

    def __init__(self, checkpoint: str | Path, cfg: Config, version: int):
        from transformers import AutoTokenizer  # lazy: heavy (transformers)

        self.checkpoint = str(checkpoint)
        self.cfg = cfg
        self.version = version
        self.tokenizer = AutoTokenizer.from_pretrained(self.checkpoint)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.base, timeout=httpx.Timeout(600.0, connect=5.0))
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        # the router reloads a spare engine in place when configured (serving.vllm_hot_reload)
        self.supports_reload = bool(cfg.serving.vllm_hot_reload)
        self._closing = False
        self._ready = threading.Event()
        self.log_path = Path(cfg.path("logs")) / f"vllm-v{version}-{self.port}.log"
        self._start()
        self._supervisor = threading.Thread(target=self._supervise, name=f"vllm-supervisor-{self.port}", daemon=True)
        self._supervisor.start()

    # --- process ----------------------------------------------------------------------------------
    def _command(self) -> list[str]:
        cfg_json = json.loads((Path(self.checkpoint) / "config.json").read_text())
        max_len = min(int(cfg_json.get("max_position_embeddings", 2048)), 4096)
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.checkpoint,
                "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", self.cfg.model.dtype, "--enforce-eager", "--max-model-len", str(max_len),
                "--logprobs-mode", "processed_logprobs", "--max-logprobs", "1", "--disable-log-stats",
                "--worker-extension-cls", "rl_core.serving.backends.vllm_worker.RtrlWorkerExtension"]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        n = os.cpu_count() or 1
        env.update({"VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1",
                    "VLLM_CPU_KVCACHE_SPACE": str(self.cfg.serving.vllm_kv_cache_gb)})
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{n - 1}")
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        return env

    def _start(self) -> None:
        self._ready.clear()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self._command(), env=self._env(), stdout=logf, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        logf.close()
        deadline = time.monotonic() + self.cfg.serving.vllm_startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} during startup; see {self.log_path}")
            try:
                if self.http.get("/health", timeout=2.0).status_code == 200:
                    self._ready.set()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self._kill()
        raise TimeoutError(f"vLLM did not become healthy in {self.cfg.serving.vllm_startup_timeout_s}s; see {self.log_path}")

    def _supervise(self) -> None:
        while not self._closing:
            time.sleep(1.0)
            if self._closing or self.proc is None or self.proc.poll() is None:
                continue
            log.error("vLLM (port %d) died with %s; restarting", self.port, self.proc.returncode)
            self.restarts += 1
            try:
                self._start()
            except Exception:
                log.exception("vLLM restart failed; retrying")

    def _kill(self) -> None:
        """The server and its engine-core process (same group), even when the server already exited."""
        stop_group(self.proc, 20.0, kill_wait_s=10.0)

    def close(self) -> None:
        self._closing = True
        self._kill()
        self.http.close()

    # --- weights ----------------------------------------------------------------------------------
    def reload(self, checkpoint: str | Path) -> None:
        """Swap in new weights of the same architecture, then drop KV computed with the old ones."""
        r = self.http.post("/collective_rpc", json={"method": "rtrl_reload_weights",
                                                     "kwargs": {"weights_path": str(checkpoint)}})
        r.raise_for_status()
        self.http.post("/reset_prefix_cache").raise_for_status()
        self.checkpoint = str(checkpoint)

    # --- generation -------------------------------------------------------------------------------
    def _body(self, prompt_ids: list[int], s: Sampling, stream: bool) -> dict:
        body = {"model": SERVED_NAME, "prompt": prompt_ids, "max_tokens": s.max_tokens, "temperature": s.temperature,
                "top_p": s.top_p, "logprobs": 0, "return_token_ids": True, "stream": stream}
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        return body

    @staticmethod
    def _piece(choice: dict) -> StepOut:
        lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
        return StepOut(list(choice.get("token_ids") or []), [float(x) for x in lps], choice.get("text") or "",
                       choice.get("finish_reason"))

    def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        self._ready.wait(self.cfg.serving.vllm_startup_timeout_s)
        t0 = time.perf_counter()
        r = self.http.post("/v1/completions", json=self._body(prompt_ids, sampling, False))
        r.raise_for_status()
        g = collect_stream(iter([self._piece(r.json()["choices"][0])]))
        g.ttft_ms = (time.perf_counter() - t0) * 1000
        return g

    def stream(self, prompt_ids: list[int], sampling: Sampling) -> Iterator[StepOut]:
        self._ready.wait(self.cfg.serving.vllm_startup_timeout_s)
        with self.http.stream("POST", "/v1/completions", json=self._body(prompt_ids, sampling, True)) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if choices:
                    yield self._piece(choices[0])
