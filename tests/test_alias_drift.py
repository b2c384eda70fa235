"""Alias moves made outside rtrl (MLflow's alias pencil, "Promote model"), on real MLflow over SQLite: rtrl's own
moves leave no drift; an outside move is found, recorded (model tag, History line, one log warning), reported by
`rtrl registry` and by the cycle's outcome line, and refused until an operator adopts or reverts it
(rl_core/registry/drift.py)."""

from __future__ import annotations

import argparse
import logging

import pytest
from test_registry_lifecycle import write_run

from rl_core.registry import drift, promote, store
from rl_core.registry.cli import add_registry
from rl_core.registry.deploy import deploy
from rl_core.registry.register import register_run


def rtrl_registry(*argv: str) -> int:
    """`rtrl registry ARGV` (its parser and run function, as rl_core/cli.py wires a command)."""
    p = argparse.ArgumentParser(prog="rtrl registry")
    add_registry(p)
    args = p.parse_args(list(argv))
    return args.run(args)


def outside(cfg):
    """An MlflowClient of someone using MLflow directly, as the UI does: no rtrl code in between."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=cfg.tracking_uri, registry_uri=cfg.tracking_uri)


def copy_version(cfg, name: str) -> int:
    return store.register_checkpoint(cfg, store.checkpoint_path(cfg, 1), run_name=name, tags={"run_id": name})


def test_rtrls_own_moves_leave_no_drift_and_show_in_the_models_list(registered, tiny_checkpoint):
    cfg = registered
    write_run(cfg, "cycle-a", tiny_checkpoint, parent=1)
    v2 = register_run(cfg, "cycle-a")
    assert deploy(cfg, "cycle-a", v2)
    assert drift.check(cfg) == []
    promote.promote(cfg, "A/B better", expected=v2)
    assert drift.check(cfg) == [] and store.aliases(cfg) == {"champion": v2}
    tags = store.client(cfg).get_registered_model(cfg.mlflow.model_name).tags
    assert tags["champion"] == f"v{v2}" and tags["challenger"] == "none"  # the models list's Tags column
    assert not any(k.startswith("drift.") for k in tags)


def test_an_alias_moved_in_mlflow_is_found_recorded_reported_and_refused(registered, tiny_checkpoint, caplog, capsys):
    from rl_core.outcome import settle

    cfg = registered
    v2 = copy_version(cfg, "pencil")
    name = cfg.mlflow.model_name
    outside(cfg).set_registered_model_alias(name, "champion", str(v2))  # the alias pencil in the UI

    with caplog.at_level(logging.WARNING, logger="rl_core.registry.drift"):
        found = drift.check(cfg)
        assert drift.check(cfg) == found  # a second check records nothing new
    assert found == [drift.Drift("champion", 1, v2)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'champion'" in warnings[0] and "expected v1" in warnings[0] \
        and f"found v{v2}" in warnings[0], warnings
    model_tags = store.client(cfg).get_registered_model(name).tags
    assert model_tags["drift.champion"].startswith(f"expected v1, found v{v2} since ")
    history = store.get_version(cfg, v2).description
    assert history.count("set outside rtrl (rtrl's record: v1)") == 1, history

    # every rtrl move that puts a version in front of users is refused, with the way out in the message
    with pytest.raises(drift.AliasDrift, match="expected v1, found v2.*rtrl registry --adopt"):
        promote.point(cfg, "challenger", v2, "deploy by hand")
    with pytest.raises(drift.AliasDrift):
        promote.restore_previous_champion(cfg, "incident")
    write_run(cfg, "cycle-a", tiny_checkpoint, parent=1)
    v3 = register_run(cfg, "cycle-a")
    assert deploy(cfg, "cycle-a", v3) is False  # the promotion verdict says why
    assert store.aliases(cfg) == {"champion": v2}

    # the operator sees it: `rtrl registry` (exit 1) and the cycle's outcome line (not ok: the run stays red)
    assert rtrl_registry() == 1
    out = capsys.readouterr().out
    assert "ALIAS DRIFT: alias 'champion' moved outside rtrl: expected v1, found v2" in out and "--adopt" in out
    states = {t: "success" for t in ("window", "harvest", "train", "register", "gate_promotion", "deploy")}
    outcome = settle(cfg, "cycle-a", states)
    assert not outcome.ok and "alias drift: alias 'champion'" in outcome.line, outcome.line
    assert f"v{v3}, challenger not moved: deploy refused: alias 'champion'" in outcome.line, outcome.line


def test_adopt_records_mlflows_aliases_and_lifts_the_refusal(registered, capsys):
    cfg = registered
    v2 = copy_version(cfg, "pencil")
    outside(cfg).set_registered_model_alias(cfg.mlflow.model_name, "champion", str(v2))
    assert rtrl_registry("--adopt", "--reason", "hotfix agreed in the incident channel") == 0
    assert "adopted: alias 'champion' moved outside rtrl: expected v1, found v2" in capsys.readouterr().out
    assert drift.check(cfg) == [] and drift.recorded_drift(cfg) == {}
    assert "outside move adopted (v1 -> v2): hotfix agreed" in store.get_version(cfg, v2).description
    v3 = copy_version(cfg, "next")
    promote.point(cfg, "challenger", v3, "deploy")  # moves go through again
    assert store.aliases(cfg) == {"champion": v2, "challenger": v3}


def test_revert_moves_drifted_aliases_back_to_rtrls_record(registered):
    cfg = registered
    v2, v3 = copy_version(cfg, "a"), copy_version(cfg, "b")
    promote.point(cfg, "challenger", v2, "deploy")
    c = outside(cfg)
    c.delete_registered_model_alias(cfg.mlflow.model_name, "challenger")  # deleted in the UI
    c.set_registered_model_alias(cfg.mlflow.model_name, "champion", str(v3))  # "Promote"d by hand
    assert {d.alias: (d.expected, d.actual) for d in drift.check(cfg)} == {"challenger": (v2, None),
                                                                           "champion": (1, v3)}
    assert rtrl_registry("--revert") == 0
    assert store.aliases(cfg) == {"champion": 1, "challenger": v2}
    assert drift.check(cfg) == [] and drift.recorded_drift(cfg) == {}
    assert "revert outside move (v3 -> v1)" in store.get_version(cfg, 1).description


def test_taking_a_challenger_off_traffic_still_works_while_only_the_champion_drifted(registered):
    cfg = registered
    v2, v3 = copy_version(cfg, "a"), copy_version(cfg, "b")
    promote.point(cfg, "challenger", v2, "deploy")
    outside(cfg).set_registered_model_alias(cfg.mlflow.model_name, "champion", str(v3))
    assert promote.drop_challenger(cfg, "monitors tripped", expected=v2) == v2  # only removes a model from traffic
    with pytest.raises(drift.AliasDrift):
        promote.promote(cfg, "A/B")
    outside(cfg).set_registered_model_alias(cfg.mlflow.model_name, "challenger", str(v2))  # and now it drifted too
    with pytest.raises(drift.AliasDrift, match="'challenger'"):
        promote.drop_challenger(cfg, "again")


def test_a_registry_without_a_record_is_recorded_once_as_it_is(registered):
    cfg = registered
    c, name = store.client(cfg), cfg.mlflow.model_name
    c.delete_registered_model_tag(name, "champion")  # as a registry made before rtrl recorded its moves
    assert store.recorded_aliases(cfg) is None
    assert drift.check(cfg) == []
    assert store.recorded_aliases(cfg) == {"champion": 1}
    outside(cfg).delete_registered_model_alias(name, "champion")  # from now on, a difference is drift
    assert drift.check(cfg) == [drift.Drift("champion", 1, None)]
    outside(cfg).set_registered_model_alias(name, "champion", "1")  # put back by hand: the drift is settled
    assert drift.check(cfg) == [] and drift.recorded_drift(cfg) == {}
