"""The promotion gate is the only path to `challenger`: force each input to fail (or be missing) and
check that no alias moves. Real MLflow over SQLite, one registry for the module (kept fast)."""

from __future__ import annotations

import math
import shutil

import pytest
from test_registry_lifecycle import write_run

from rl_core.lake import Lake
from rl_core.pipeline import REQUIRED_VERDICTS
from rl_core.reports import GateFailed, read_verdict


@pytest.fixture(scope="module")
def reg(tmp_path_factory, mlflow_db_template):
    """A registry with version 1 as champion, on a small stand-in checkpoint folder (no weights needed)."""
    from rl_core.config import REPO_ROOT, load_config
    from rl_core.registry import store

    home = tmp_path_factory.mktemp("gate") / "var"
    cfg = load_config(REPO_ROOT / "rtrl.toml", environ={"RTRL_PROFILE": "tiny", "RTRL_HOME": str(home)})
    home.mkdir(parents=True)
    shutil.copy(mlflow_db_template, home / "mlflow.db")
    ckpt = home / "stand-in-ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "llama"}')
    v1 = store.register_checkpoint(cfg, ckpt, run_name="base", tags={"run_id": "base"})
    store.set_alias(cfg, "champion", v1, "test setup")
    return cfg, ckpt


CASES = (
    [pytest.param({"failing": n}, id=f"{n}-failed") for n in REQUIRED_VERDICTS]
    + [pytest.param({"missing": n}, id=f"{n}-missing") for n in REQUIRED_VERDICTS]
    + [
        pytest.param({"train_details": {"loss": math.nan, "kl": 0.01}}, id="train-nan-loss"),
        pytest.param({"train_details": {"metrics": {"loss": 0.3, "kl": 9.0}}}, id="train-kl-over-bound"),
    ]
)


@pytest.mark.parametrize("bad", CASES)
def test_any_failing_or_missing_verdict_blocks_the_alias(reg, bad, request):
    from rl_core.registry import gate, store
    from rl_core.registry.deploy import deploy
    from rl_core.registry.register import register_run

    cfg, ckpt = reg
    run_id = "cycle-" + request.node.callspec.id
    write_run(cfg, run_id, ckpt, parent=1, **bad)
    before = store.aliases(cfg)
    version = register_run(cfg, run_id)

    verdict = gate.decide(cfg, run_id)
    assert not verdict.passed
    name = bad.get("failing") or bad.get("missing") or "train"
    assert any(r.startswith(f"{name}:") for r in verdict.reasons), verdict.reasons
    with pytest.raises(GateFailed, match=name):
        gate.decide(cfg, run_id, raise_on_fail=True)

    assert deploy(cfg, run_id, version) is False
    assert store.aliases(cfg) == before  # nothing moved
    assert store.get_version(cfg, version).tags["promotion"] == "refused"
    written = read_verdict(Lake(cfg.lake_root), run_id, "promotion")
    assert written is not None and not written.passed


def test_all_verdicts_passing_deploys_as_challenger(reg):
    from rl_core.registry import gate, store
    from rl_core.registry.deploy import deploy
    from rl_core.registry.register import register_run

    cfg, ckpt = reg
    write_run(cfg, "cycle-good", ckpt, parent=1)
    version = register_run(cfg, "cycle-good")
    verdict = gate.decide(cfg, "cycle-good")
    assert verdict.passed and verdict.reasons == []
    assert verdict.details["verdicts"] == {n: "passed" for n in REQUIRED_VERDICTS}
    # the right verdicts but the wrong version (another run's checkpoint, or the champion) -> refused
    assert deploy(cfg, "cycle-good", 1) is False
    assert store.version_for_alias(cfg, "challenger") is None
    assert deploy(cfg, "cycle-good", version) is True
    assert store.version_for_alias(cfg, "challenger") == version
    assert store.get_version(cfg, version).tags["promotion"] == "passed"
    store.delete_alias(cfg, "challenger", "test cleanup")
