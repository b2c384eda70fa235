"""The `auto` router: stable user split, alias moves followed from MLflow, atomic swaps under load with
in-flight requests finishing on the weights they started with, in-place reload with drain."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from rl_core.serving.app import prompt_ids
from rl_core.serving.backends.base import Sampling
from rl_core.serving.backends.hf import TransformersBackend
from rl_core.serving.router import Router, UnknownModel, user_bucket

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def two_checkpoints(tiny_checkpoint, tmp_path_factory):
    """v1 = the session's tiny model; v2 = the same architecture with other random weights."""
    from rl_core.config import load_config
    from rl_core.models import build_tiny

    mc = load_config(REPO / "rtrl.toml", environ={"RTRL_PROFILE": "tiny"}).model.model_copy(update={"seed": 1})
    v2 = build_tiny(tmp_path_factory.mktemp("v2") / "tiny-v2", mc)
    return {1: Path(tiny_checkpoint), 2: v2}


def make_router(ckpts, aliases: dict, share: float = 0.5, reload: bool = False, poll_s: float = 0.05) -> Router:
    return Router(factory=lambda ckpt, v: TransformersBackend(ckpt, supports_reload=reload),
                  checkpoint_for=lambda v: ckpts[v], alias_source=lambda: dict(aliases),
                  challenger_share=share, poll_s=poll_s)


_REFERENCE: dict[Path, TransformersBackend] = {}


def forward_logprobs(ckpt: Path, prompt: list[int], completion: list[int]) -> np.ndarray:
    """A fresh fp32 forward pass of the checkpoint (its own model object, loaded once per test module)."""
    b = _REFERENCE.setdefault(ckpt, TransformersBackend(ckpt))
    with torch.no_grad():
        lp = torch.log_softmax(b.model(torch.tensor([prompt + completion])).logits[0].float(), -1)
    return np.array([float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)])


def test_user_split_is_stable_and_matches_share():
    users = [f"user-{i}" for i in range(20000)]
    share = np.mean([user_bucket(u) < 0.1 for u in users])
    assert 0.09 < share < 0.11
    assert all(user_bucket(u) == user_bucket(u) for u in users[:100])


def test_routes_by_alias_and_hash(two_checkpoints):
    aliases = {"champion": 1}
    r = make_router(two_checkpoints, aliases, share=0.5)
    r.start(background=False)
    assert {r.route("auto", f"u{i}").version for i in range(50)} == {1}, "no challenger: all to champion"
    with pytest.raises(UnknownModel, match="challenger"):
        r.route("challenger", "u1")
    aliases["challenger"] = 2
    assert r.sync() is True
    arms = {}
    for i in range(200):
        lease = r.route("auto", f"u{i}")
        lease.release()
        arms[f"u{i}"] = (lease.arm, lease.version)
        assert lease.version == (2 if lease.arm == "challenger" else 1)
        assert (lease.arm == "challenger") == (user_bucket(f"u{i}") < 0.5)
    assert {a for a, _ in arms.values()} == {"champion", "challenger"}
    pinned = r.route("rtrl-policy/2", "u1")
    pinned.release()
    assert pinned.arm == "pinned" and pinned.version == 2
    r.close()


def test_inflight_request_finishes_on_old_weights_during_swap(two_checkpoints):
    aliases = {"champion": 1}
    r = make_router(two_checkpoints, aliases)
    r.start(background=False)
    lease = r.route("champion", "u")
    ids = prompt_ids(lease.backend.tokenizer, [{"role": "user", "content": "hello"}], None)
    steps = lease.backend.stream(ids, Sampling(max_tokens=20, temperature=1.0, seed=2))
    first = [next(steps) for _ in range(3)]
    aliases["champion"] = 2
    assert r.sync() is True  # the new version loads and takes over while the stream is mid-way
    newer = r.route("champion", "u")
    assert newer.version == 2
    rest = list(steps)
    lease.release()
    newer.release()
    tokens = [t for s in first + rest for t in s.token_ids]
    logged = np.array([lp for s in first + rest for lp in s.logprobs])
    on_v1 = np.abs(forward_logprobs(two_checkpoints[1], ids, tokens) - logged).max()
    on_v2 = np.abs(forward_logprobs(two_checkpoints[2], ids, tokens) - logged).max()
    assert on_v1 < 1e-4 < on_v2, f"every token came from v1 (diff {on_v1:.1e}) not v2 ({on_v2:.1e})"
    r.close()


def test_inplace_reload_drains_inflight_then_swaps(two_checkpoints):
    """Engines with reload (vLLM's reload_weights; here transformers' in-place load) reuse the slot."""
    aliases = {"champion": 1}
    r = make_router(two_checkpoints, aliases, reload=True)
    r.start(background=False)
    lease = r.route("champion", "u")
    backend = lease.backend
    done = threading.Event()
    threading.Thread(target=lambda: (aliases.update(champion=2), r.sync(), done.set()), daemon=True).start()
    time.sleep(0.3)
    assert not done.is_set(), "the reload waits for the in-flight lease"
    lease.release()
    assert done.wait(30)
    after = r.route("champion", "u")
    after.release()
    assert after.version == 2 and after.backend is backend, "same engine, new weights"
    ids = prompt_ids(backend.tokenizer, [{"role": "user", "content": "hi"}], None)
    g = backend.generate(ids, Sampling(max_tokens=8, temperature=1.0, seed=1))
    assert np.abs(forward_logprobs(two_checkpoints[2], ids, g.token_ids) - np.array(g.logprobs)).max() < 1e-4
    r.close()


def test_rolled_back_engine_stays_warm_for_the_next_deploy(two_checkpoints):
    """challenger 2 rolled back: its engine is kept as a spare (not routable), and the next deploy reloads it
    in place instead of starting an engine; with spares=0 it is closed."""
    for spares in (1, 0):
        made: list[object] = []
        aliases = {"champion": 1, "challenger": 2}
        r = make_router(two_checkpoints, aliases, reload=True)
        r.spares = spares
        factory = r.factory
        r.factory = lambda ckpt, v, made=made, factory=factory: made.append(v) or factory(ckpt, v)
        r.start(background=False)
        assert sorted(made) == [1, 2]
        engine2 = r.route("challenger", "u")
        engine2.release()
        del aliases["challenger"]  # rollback
        assert r.sync() and r.versions() == {"champion": 1}
        with pytest.raises(UnknownModel):
            r.route("rtrl-policy/2", "u")  # a spare serves nobody
        aliases["challenger"] = 1  # the next deploy (any version: here the champion's weights)
        assert r.sync() and r.versions() == {"champion": 1, "challenger": 1}
        assert sorted(made) == [1, 2], "no new engine either way: the spare was reloaded, or v1's slot reused"
        if spares:
            aliases["challenger"] = 2
            assert r.sync()
            lease = r.route("challenger", "u")
            lease.release()
            assert lease.backend is engine2.backend and lease.version == 2 and sorted(made) == [1, 2]
        else:
            assert engine2.slot.retired
        r.close()


def test_no_request_fails_while_aliases_move_under_load(two_checkpoints, cfg):
    """Real HTTP load through the gateway while the poller swaps champion 1 -> 2 -> 1 -> 2."""
    from rl_core.collect.collector import Collector
    from rl_core.serving.app import create_app
    from rl_core.serving.server import Gateway, serve_in_thread

    aliases = {"champion": 1}
    router = make_router(two_checkpoints, aliases)
    router.start(background=True)
    collector = Collector.from_config(cfg, background=False)
    gw = Gateway(create_app(cfg, router, collector), router, collector)
    results: list[tuple[int, str, str]] = []
    errors: list[str] = []
    stop = threading.Event()

    def load(i: int, base: str) -> None:
        with httpx.Client(base_url=base, headers={"authorization": "Bearer rtrl-dev-token"}, timeout=60) as c:
            n = 0
            while not stop.is_set():
                n += 1
                body = {"model": "champion", "messages": [{"role": "user", "content": f"q{i}-{n}"}], "max_tokens": 6,
                        "stream": n % 2 == 0}
                try:
                    resp = c.post("/v1/chat/completions", json=body)
                    ok = resp.status_code == 200 and (not body["stream"] or resp.text.endswith("data: [DONE]\n\n"))
                    if not ok:
                        errors.append(f"{resp.status_code} {resp.text[:200]}")
                    results.append((resp.status_code, resp.headers.get("x-rtrl-model-version"),
                                    resp.headers.get("x-rtrl-event-id")))
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))

    with serve_in_thread(cfg, gateway=gw) as base:
        threads = [threading.Thread(target=load, args=(i, base)) for i in range(4)]
        for t in threads:
            t.start()
        for target in (2, 1, 2):
            time.sleep(0.6)
            aliases["champion"] = target
            deadline = time.time() + 30
            while router.versions().get("champion") != target and time.time() < deadline:
                time.sleep(0.05)
            assert router.versions()["champion"] == target
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:5]
    versions = {v for _, v, _ in results}
    assert versions == {"1", "2"} and len(results) > 20
    from rl_core.collect import wal

    logged = {r["event_id"]: r["model_version"] for seg in wal.sealed_segments(cfg.wal_dir)
              for k, r in wal.read_segment(seg) if k == "interactions"}
    import pyarrow.parquet as pq

    from rl_core.lake import Lake

    for p in Lake(cfg.lake_root).list_files("raw/interactions"):
        logged.update(dict(zip(*pq.read_table(p, columns=["event_id", "model_version"]).to_pydict().values(), strict=True)))
    assert all(logged[e] == int(v) for _, v, e in results), "each logged row names the version that answered"


def test_a_prewarmed_spare_makes_the_first_deploy_a_weight_swap(two_checkpoints):
    """prewarm: the gateway starts a spare engine beside the champion, so the first challenger deploy reloads it
    instead of starting an engine; engines that cannot reload get no spare."""
    for reload in (True, False):
        made: list[int] = []
        aliases = {"champion": 1}
        r = make_router(two_checkpoints, aliases, reload=reload)
        r.prewarm = True
        factory = r.factory
        r.factory = lambda ckpt, v, made=made, factory=factory: made.append(v) or factory(ckpt, v)
        r.start(background=False)
        assert made == ([1, 1] if reload else [1])
        with pytest.raises(UnknownModel):
            r.route("rtrl-policy/2", "u")
        aliases["challenger"] = 2  # the first deploy
        assert r.sync() and r.versions() == {"champion": 1, "challenger": 2}
        lease = r.route("challenger", "u")
        lease.release()
        assert lease.version == 2
        assert made == ([1, 1] if reload else [1, 2]), "with a spare, no engine starts at the deploy"
        r.close()
