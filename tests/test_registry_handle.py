"""One registry handle (rl_core.registry.store.Registry): read once from the config, an org's adapters are the same
registry under their own model name, and nothing of the policy's model moves when an adapter's alias does."""

from __future__ import annotations

from rl_core.config import load_config
from rl_core.registry import store
from rl_core.registry.adapters import LIVE_ALIAS, adapter_model_name, adapter_registry


def test_the_handle_is_read_once_and_an_org_changes_only_the_model_name(rtrl_home):
    cfg = load_config()
    reg = store.Registry.of(cfg)
    assert (reg.tracking_uri, reg.model_name, reg.experiment) == (cfg.tracking_uri, cfg.mlflow.model_name,
                                                                  cfg.mlflow.experiment)
    assert store.Registry.of(reg) is reg
    areg = adapter_registry(cfg, "org-acme")
    assert areg.model_name == adapter_model_name("org-acme") and areg.tracking_uri == reg.tracking_uri
    assert cfg.mlflow.model_name == reg.model_name  # the config is not copied or changed


def test_an_adapter_alias_lives_on_its_own_model(rtrl_home, tmp_path):
    cfg = load_config()
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    areg = adapter_registry(cfg, "org-acme")
    v = store.register_checkpoint(areg, folder, run_name="t", tags={"run_id": "t"})
    store.set_alias(areg, LIVE_ALIAS, v, reason="test")
    assert store.aliases(areg) == {LIVE_ALIAS: v}
    assert LIVE_ALIAS not in store.aliases(cfg)  # the policy's model has no such alias
    assert store.recorded_aliases(areg) == {LIVE_ALIAS: v}
