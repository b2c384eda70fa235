"""Replay: an org adapter against its base version on the very requests that org's users sent.

Why: live traffic gives each simulated user about 4 turns a cycle, so one user's feature rate moves in steps
of 0.25, and the spread between users and between cycles' conversations swamps an adapter's effect
(org-conventions-v2: SE 0.10 on the difference in differences). Replaying each request of the trained cycle
to both arms, k samples each, holds the request fixed: what differs between the arms is only the weights.
Sample j of a request uses the same sampling seed on both arms (common random numbers), so where the two
policies agree they draw the same answer and only where they differ does a difference show.

Both arms go through the real gateway, with the org's own bearer token, as production traffic would:
model `<model_name>/<v>` is a pin, which the adapter pool never answers (rl_core/orgs/serving.py), and
`auto` is answered by the org's live adapter. Every answer's headers say which weights answered; an
adapter arm answered without the org's adapter, or a base arm answered with one, is counted, not hidden.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from lab.airflow import airflow_env
from lab.simulate.personas import orgs_from_config
from rl_core import toolcalls
from rl_core.config import Config
from rl_core.features import features_of
from rl_core.lake import Lake
from rl_core.runtime.procs import stop
from rl_core.serving import gateway as gw
from rl_core.toolcalls import prompt_ids

ARMS = ("base", "adapter")


@dataclass(frozen=True)
class Request:
    event_id: str  # the logged interaction this request replays
    user_id: str
    org_id: str
    messages: list[dict]
    tools: list[dict] | None


@dataclass
class Answer:
    event_id: str
    user_id: str
    org_id: str
    arm: str  # "base" (the pinned version) or "adapter" (`auto`: the org's live adapter)
    sample: int
    model_version: int | None
    adapter_version: str | None
    features: dict[str, bool]
    text: str = ""  # the answer as the user would see it (tool calls split off)


def logged_requests(cfg: Config, start: datetime, end: datetime, orgs: list[str]) -> list[Request]:
    """The requests the given orgs' users sent in [start, end), from the lake, in request order."""
    t = Lake(cfg.lake_root).read_window("interactions", start, end)
    if t is None:
        return []
    rows = sorted(t.select(["ts_request", "event_id", "user_id", "org_id", "messages"]).to_pylist(),
                  key=lambda r: (r["ts_request"], r["event_id"]))
    out = []
    for r in rows:
        if r["org_id"] not in orgs:
            continue
        body = json.loads(r["messages"])  # {"messages": [...], "tools": [...] | null}, as the gateway logged it
        out.append(Request(r["event_id"], r["user_id"], r["org_id"], body["messages"], body.get("tools") or None))
    return out


def sample_seed(seed: int, event_id: str, sample: int) -> int:
    """The sampling seed of sample j of a request: the same on both arms (common random numbers)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{event_id}:{sample}".encode()).digest()[:4], "big")


class _Asker:
    """One request to one arm through the gateway with the official openai SDK."""

    def __init__(self, cfg: Config, url: str, base_version: int):
        import openai  # lazy: only replays need the client

        tokens = {o.org_id: o.token for o in orgs_from_config(cfg)}
        self.clients = {org: openai.OpenAI(base_url=url + "/v1", api_key=tok, timeout=300, max_retries=2)
                        for org, tok in tokens.items()}
        self.pin = f"{cfg.mlflow.model_name}/{base_version}"
        self.temperature, self.max_tokens = cfg.simulate.temperature, cfg.simulate.max_tokens

    def __call__(self, req: Request, arm: str, sample: int, seed: int) -> Answer:
        raw = self.clients[req.org_id].chat.completions.with_raw_response.create(
            model=self.pin if arm == "base" else "auto", messages=req.messages, tools=req.tools or None,
            user=req.user_id, max_tokens=self.max_tokens, temperature=self.temperature,
            seed=sample_seed(seed, req.event_id, sample),
            extra_headers={"x-rtrl-session-id": f"replay-{req.event_id}-{arm}-{sample}"})
        msg = raw.parse().choices[0].message
        calls = [c.model_dump() for c in (msg.tool_calls or [])]
        version = raw.headers.get("x-rtrl-model-version")
        return Answer(req.event_id, req.user_id, req.org_id, arm, sample,
                      int(version) if version and version.isdigit() else None,
                      raw.headers.get("x-rtrl-adapter-version"), features_of(msg.content or "", calls),
                      msg.content or "")


def replay(cfg: Config, requests: list[Request], base_version: int, samples: int, seed: int, log: Path,
           concurrency: int = 2, arms: tuple[str, ...] = ARMS) -> list[Answer]:
    """Every request to each arm, `samples` times, through a gateway of its own (started here, stopped after);
    answers in request, sample, arm order. About 3 s an answer on 2 cores (SmolLM2-135M, 96 tokens)."""
    jobs = [(r, arm, j) for r in requests for j in range(samples) for arm in arms]
    proc, url = gw.start_gateway(cfg, airflow_env(cfg) | {"RTRL_SERVING__PREWARM_SPARE": "false"}, log)
    try:
        ask = _Asker(cfg, url, base_version)
        return _answer_all(jobs, lambda job: ask(job[0], job[1], job[2], seed), concurrency)
    finally:
        stop(proc)


def _answer_all(jobs: list, answer, concurrency: int) -> list[Answer]:
    """answer(job) for every job, `concurrency` at once, in job order; progress every 50 answers on stderr."""
    done, lock = [0], threading.Lock()

    def one(job) -> Answer:
        a = answer(job)
        with lock:
            done[0] += 1
            if done[0] % 50 == 0 or done[0] == len(jobs):
                print(f"[replay] {done[0]}/{len(jobs)} answers", file=sys.stderr)
        return a

    with ThreadPoolExecutor(concurrency, thread_name_prefix="replay") as pool:
        return list(pool.map(one, jobs))


def sample(cfg: Config, requests: list[Request], base_version: int, samples: int, seed: int) -> list[Answer]:
    """The replay's measurement on the serving engine: vLLM (multi-LoRA) where the config serves with it, else the
    transformers backend, batched (sample_batched)."""
    from rl_core.serving.backends import engine_kind

    if engine_kind(cfg.serving.backend) == "vllm":
        return sample_engine(cfg, requests, base_version, samples, seed)
    return sample_batched(cfg, requests, base_version, samples, seed)


def sample_engine(cfg: Config, requests: list[Request], base_version: int, samples: int, seed: int,
                  concurrency: int = 16) -> list[Answer]:
    """sample_batched on vLLM, as the gateway serves it: one engine on the base version with each org's measured
    adapter loaded into it (multi-LoRA: the very weights `auto` answers with), every (request, sample, arm) a
    request of its own, `concurrency` in flight, which the engine batches step by step (no padding). Sample j of a
    request has the same seed on both arms, and vLLM seeds each request's sampler: common random numbers. Each
    prompt is rendered to token ids once, for both arms and every sample."""
    from rl_core.registry import store
    from rl_core.serving.backends.base import Sampling
    from rl_core.serving.backends.vllm import VLLMBackend

    engine = VLLMBackend(store.checkpoint_path(cfg, base_version), cfg, base_version)
    try:
        adapters = {}
        for org in sorted({r.org_id for r in requests}):
            ad = _measured_adapter(cfg, org, base_version)
            engine.load_adapter(ad.adapter_version, str(ad.path))
            adapters[org] = ad.adapter_version
        ids = {r.event_id: prompt_ids(engine.tokenizer, r.messages, r.tools) for r in requests}
        jobs = [(r, j, arm) for r in requests for j in range(samples) for arm in ARMS]

        def one(job: tuple[Request, int, str]) -> Answer:
            req, j, arm = job
            adapter = adapters[req.org_id] if arm == "adapter" else None
            g = engine.generate(ids[req.event_id], Sampling(max_tokens=cfg.simulate.max_tokens,
                                                            temperature=cfg.simulate.temperature, top_p=1.0,
                                                            seed=sample_seed(seed, req.event_id, j)), adapter=adapter)
            content, calls = toolcalls.parse(g.text) if req.tools else (g.text, [])
            return Answer(req.event_id, req.user_id, req.org_id, arm, j, base_version, adapter,
                          features_of(content, calls), content)

        return _answer_all(jobs, one, concurrency)
    finally:
        engine.close()


def sample_batched(cfg: Config, requests: list[Request], base_version: int, samples: int, seed: int,
                   batch: int = 16) -> list[Answer]:
    """The same measurement without the gateway, batched: each arm's weights are the ones the gateway serves it
    (the pinned version; that version with the org's live adapter merged, rl_core/orgs/serving.py), sampled as
    the gateway samples (temperature only, no top-k, the serving max_tokens), rendered and parsed as the gateway
    does. A batch holds batch // samples requests of one org, the same on both arms, with the same seed (common
    random numbers). An org's requests are batched shortest prompt first, so a batch pads little: measured on
    the 2-core EPYC (SmolLM2-135M, 160 tokens, 2026-12-06), 5.7 s an answer for 8 rows of mixed prompts
    (227-629 tokens), 3.5 s for 8 of one length, 2.9 s for 16 of one length, 11 s one at a time."""
    from rl_core.orgs.serving import load_adapter_backend
    from rl_core.registry import store
    from rl_core.serving.backends.hf import TransformersBackend

    per = max(1, batch // samples)
    base_ck = store.checkpoint_path(cfg, base_version)
    arms = {"base": (TransformersBackend(base_ck, dtype=cfg.model.dtype), None)}
    ids = {r.event_id: prompt_ids(arms["base"][0].tokenizer, r.messages, r.tools) for r in requests}  # rendered once
    out: list[Answer] = []
    for org in sorted({r.org_id for r in requests}):
        ad = _measured_adapter(cfg, org, base_version)
        arms["adapter"] = (load_adapter_backend(base_ck, ad.path, cfg.model.dtype), ad.adapter_version)
        mine = sorted((r for r in requests if r.org_id == org), key=lambda r: len(ids[r.event_id]))
        for i in range(0, len(mine), per):
            group = mine[i:i + per]
            rows = [ids[r.event_id] for r in group for _ in range(samples)]
            for arm, (backend, adapter) in arms.items():
                texts = _generate(backend, rows, sample_seed(seed, group[0].event_id, 0),
                                  cfg.simulate.temperature, cfg.simulate.max_tokens)
                for n, text in enumerate(texts):
                    req = group[n // samples]
                    content, calls = toolcalls.parse(text) if req.tools else (text, [])
                    out.append(Answer(req.event_id, req.user_id, org, arm, n % samples, base_version, adapter,
                                      features_of(content, calls), content))
            print(f"[replay] {org}: {min(i + per, len(mine))}/{len(mine)} requests", file=sys.stderr)
    return out


def _measured_adapter(cfg: Config, org: str, base_version: int):
    """The org's live adapter on base_version; where its gates refused it (none live), the newest one registered on
    base_version, so a run still reports what the update learned (the served check then shows it is not served)."""
    from rl_core.orgs.registry import live_adapter, newest_adapter  # lazy: the gateway path does not need it

    live = live_adapter(cfg, org)
    if live is not None and int(live.base_version) == base_version:
        return live
    newest = newest_adapter(cfg, org)
    if newest is None or int(newest.base_version) != base_version:
        raise RuntimeError(f"replay: {org} has no adapter on version {base_version} to measure")
    print(f"[replay] {org}: no live adapter (its gates refused it); measuring the newest registered one, "
          f"{newest.adapter_version}, which no user is served", file=sys.stderr)
    return newest


def _generate(backend, rows: list[list[int]], seed: int, temperature: float, max_tokens: int) -> list[str]:
    """A completion of each prompt (token ids) in one left-padded batch; the text up to the first EOS."""
    import torch  # lazy: heavy

    width = max(len(r) for r in rows)
    eos = sorted(backend.eos_ids)
    pad = backend.tokenizer.pad_token_id if backend.tokenizer.pad_token_id is not None else eos[0]
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # (B, T) left-padded prompts
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])  # (B, T) 1 = a real token
    torch.manual_seed(seed)
    with torch.inference_mode():
        gen = backend.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature,
                                     top_p=1.0, top_k=0, max_new_tokens=max_tokens, eos_token_id=eos,
                                     pad_token_id=pad)[:, width:]  # (B, <= max_tokens) completions
    texts = []
    for row in gen.tolist():
        stop = next((i for i, t in enumerate(row) if t in backend.eos_ids), len(row))
        texts.append(backend.tokenizer.decode(row[:stop], skip_special_tokens=True))
    return texts


def save(answers: list[Answer], path: Path) -> Path:
    """The answers as JSON lines (one per answer): what the summary's numbers are computed from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(a), sort_keys=True) + "\n" for a in answers))
    return path
