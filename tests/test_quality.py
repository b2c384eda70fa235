"""Great Expectations gates: pass on clean data, fail loudly (counts + examples) on planted defects."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lab.testing.synth import ArmSpec, Defects, generate, window
from rl_core.cli import main
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.quality import gate_episodes, gate_raw, gate_rewards
from rl_core.reports import GateFailed, read_verdict
from rl_core.rewards import score_run

START, END = window(hours=2)
KNOWN = [1, 2]


def pipeline(cfg, run_id="run-q", n=400, seed=11, defects=None):
    r = generate(n, START, END, seed=seed, lake=Lake(cfg.lake_root), defects=defects)
    harvest(cfg, START, END, 2, run_id)
    score_run(cfg, run_id)
    return r


def rewrite(cfg, run_id: str, name: str, fn) -> None:
    lake = Lake(cfg.lake_root)
    path = f"runs/{run_id}/{name}.parquet"
    lake.write_parquet(path, fn(lake.read_parquet(path)))


def set_col(table: pa.Table, name: str, values) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(name), pa.array(values, table.schema.field(name).type))


def test_clean_data_passes_every_gate_and_saves_gx_results(cfg):
    pipeline(cfg)
    for verdict in (gate_raw(cfg, START, END, "run-q", known=KNOWN), gate_episodes(cfg, "run-q"),
                    gate_rewards(cfg, "run-q")):
        assert verdict.passed and verdict.reasons == []
    lake = Lake(cfg.lake_root)
    for name in ("gate_raw", "gate_episodes", "gate_rewards"):
        saved = lake.read_json(f"runs/run-q/quality/{name}.json")
        assert saved["success"] is True and saved["validations"][0]["results"]
        assert read_verdict(lake, "run-q", name).passed


@pytest.mark.parametrize("defect, expectation", [
    ("duplicate_events", "event_id unique (no duplicated events)"),
    ("positive_logprobs", "completion logprobs all finite and <= 0"),
    ("nan_logprobs", "completion logprobs all finite and <= 0"),
    ("wrong_version", "model_version is a registered version"),
    ("nan_latency", "latency_ms finite and >= 0"),
])
def test_gate_raw_refuses_each_planted_defect(cfg, defect, expectation):
    r = generate(300, START, END, seed=12, lake=Lake(cfg.lake_root), defects=Defects(**{defect: 2}))
    with pytest.raises(GateFailed) as err:
        gate_raw(cfg, START, END, "run-d", known=KNOWN)
    msg = str(err.value)
    assert msg.startswith("gate_raw failed:") and expectation in msg
    assert r.planted[defect][0] in msg  # an example id names the bad row
    n = 4 if defect == "duplicate_events" else 2  # both copies of a duplicate are unexpected
    assert f"{n} of {r.n_interactions} rows unexpected" in msg
    verdict = read_verdict(Lake(cfg.lake_root), "run-d", "gate_raw")
    assert not verdict.passed and any(expectation in x for x in verdict.reasons)
    assert Lake(cfg.lake_root).read_json("runs/run-d/quality/gate_raw.json")["success"] is False


@pytest.mark.slow  # builds and registers the tiny model (~40 s)
def test_gate_raw_reads_known_versions_from_the_registry(registered):
    cfg = registered  # version 1 only: the challenger arm logs version 2
    arms = (ArmSpec(share=0.5), ArmSpec(name="challenger", model_version=2, share=0.5))
    generate(200, START, END, seed=13, lake=Lake(cfg.lake_root), arms=arms)
    with pytest.raises(GateFailed, match=r"model_version is a registered version .*value_set=\[1\]"):
        gate_raw(cfg, START, END, "run-reg")


def test_gate_episodes_refuses_wrong_version_and_thin_or_skewed_data(cfg):
    pipeline(cfg, run_id="run-e")
    rewrite(cfg, "run-e", "episodes",
            lambda t: set_col(t, "version_lag", [7] + t["version_lag"].to_pylist()[1:]))
    with pytest.raises(GateFailed) as err:
        gate_episodes(cfg, "run-e")
    msg = str(err.value)
    assert "version lag within max_staleness" in msg and "1 of 400 rows unexpected" in msg
    assert "model_version + version_lag is the harvested policy version" in msg

    pipeline(cfg, run_id="run-f")
    cfg.gates.min_episodes, cfg.gates.max_org_share, cfg.gates.min_feedback_share = 1000, 0.3, 1.0
    rewrite(cfg, "run-f", "episodes", lambda t: set_col(t, "n_feedback", [0] * t.num_rows))
    with pytest.raises(GateFailed) as err:
        gate_episodes(cfg, "run-f")
    msg = str(err.value)
    for text in ("enough episodes for an update", "observed 400", "no single org above max_org_share",
                 "share of episodes with feedback"):
        assert text in msg


def test_gate_episodes_of_an_org_adapter_refuses_another_orgs_rows(cfg):
    generate(400, START, END, seed=11, lake=Lake(cfg.lake_root))
    harvest(cfg, START, END, 2, "run-o", org_id="org-acme")
    cfg.gates.min_episodes = 1
    assert gate_episodes(cfg, "run-o").passed  # one org by construction: the org-share check does not apply
    rewrite(cfg, "run-o", "episodes", lambda t: set_col(t, "org_id", ["org-globex"] + t["org_id"].to_pylist()[1:]))
    with pytest.raises(GateFailed) as err:
        gate_episodes(cfg, "run-o")
    assert "only the adapter's own organisation" in str(err.value) and "1 of" in str(err.value)


def test_gate_episodes_schema_problem_is_named(cfg):
    pipeline(cfg, run_id="run-s")
    rewrite(cfg, "run-s", "episodes", lambda t: t.drop_columns(["completion_logprobs"]))
    with pytest.raises(GateFailed, match="lacks column 'completion_logprobs'"):
        gate_episodes(cfg, "run-s")


def test_gate_rewards_refuses_nan_reward_from_planted_nan_latency(cfg):
    r = pipeline(cfg, run_id="run-n", defects=Defects(nan_latency=1))
    with pytest.raises(GateFailed) as err:
        gate_rewards(cfg, "run-n")
    msg = str(err.value)
    assert "reward present and not NaN" in msg and "reward finite" in msg and r.planted["nan_latency"][0] in msg


def test_gate_rewards_refuses_tampered_or_stale_rewards(cfg):
    pipeline(cfg, run_id="run-t")
    rewrite(cfg, "run-t", "rewards", lambda t: set_col(
        t, "reward", pc.if_else(t["broken_tool_call"], 1.0, t["reward"]).to_pylist()).slice(0, t.num_rows - 1))
    cfg.rewards.weights = cfg.rewards.weights | {"thumbs": 0.7}
    with pytest.raises(GateFailed) as err:
        gate_rewards(cfg, "run-t")
    msg = str(err.value)
    for text in ("broken tool calls have negative reward", "one reward per episode",
                 "rewards computed with the current [rewards] config"):
        assert text in msg


def test_cli_gate(cfg, capsys, monkeypatch):
    pipeline(cfg, run_id="run-c")
    assert main(["gate", "episodes", "--run-id", "run-c"]) == 0
    monkeypatch.setenv("RTRL_GATES__MIN_EPISODES", "100000")
    assert main(["gate", "episodes", "--run-id", "run-c"]) == 1
    assert "enough episodes for an update" in capsys.readouterr().out
    assert main(["gate", "raw", "--run-id", "run-c"]) == 2
