"""Per-org adapters end to end on the tiny model, and isolation as a tested property.

Org A's data carries planted markers (a text string in prompts, completions and follow-ups, and a token-id
4-gram in its prompts). Org B's adapter is harvested, scored, trained (real DeepSpeed, LoRA), evaluated and
registered; then B's training batches, every file of its run (lake and model folder) and its MLflow version
and run are searched for A's markers and event ids. The same search over A's run finds them: it can fail.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lab.testing.synth import TOOLS, feedback_row, interaction_row, window
from rl_core.harvest import harvest
from rl_core.lake import Lake
from rl_core.orgs.branch import adapt_org, org_targets
from rl_core.orgs.pipeline import OrgError, OrgRun, eligible_orgs, org_run_id, prepare_org
from rl_core.orgs.registry import adapter_model_name, adapter_registry, live_adapter, register_adapter
from rl_core.reports import read_verdicts
from rl_core.schema import to_table
from rl_core.train.launch import TrainSummary

START, END = window()
MARKER = "ZQXMARKER-ACME-7f3e"
MARKER_IDS = [40001, 40002, 40003, 40004]
RUN = "cyc-iso"


def _row(org: str, i: int, marked: bool) -> dict:
    text = f"fix the loop in mod{i}.py" + (f" {MARKER}" if marked else "")
    prompt = [5 + i, 6, 7, 8 + (i % 3)] + (MARKER_IDS if marked else [9, 10])
    comp = [11 + (i % 5), 12, 13]
    return interaction_row(
        START + timedelta(minutes=3 * i + (1 if marked else 0)), org_id=org, user_id=f"{org}-u{i % 3}",
        session_id=f"{org}-s{i}", messages=json.dumps({"messages": [{"role": "user", "content": text}], "tools": TOOLS}),
        prompt_token_ids=prompt, completion_token_ids=comp, completion_logprobs=[-0.7, -1.1, -0.4],
        completion_text=f"Changed the loop.{' ' + MARKER if marked else ''}")


def land(lake: Lake) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {"org-a": [], "org-b": []}
    for org in ids:
        for i in range(12):
            r = _row(org, i, marked=org == "org-a")
            fb = [feedback_row(r, "thumbs", value_bool=i % 2 == 0)]
            if org == "org-a":
                fb.append(feedback_row(r, "followup_message", text=f"no, that is wrong {MARKER}"))
            lake.write_partition("interactions", r["ts_request"], to_table("interactions", [r]))
            lake.write_partition("feedback", r["ts_request"], to_table("feedback", fb))
            ids[org].append(r["event_id"])
    return ids


def leaks(texts: list[str], needles: list[str]) -> list[str]:
    return sorted({n for n in needles for t in texts if n in t})


def run_texts(cfg, orun: str) -> list[str]:
    """The text of every file of a run: its lake folder (Parquet as rows) and its model folder (text files)."""
    lake = Lake(cfg.lake_root)
    out = []
    for p in sorted(lake.fs.find(lake.path(lake.run(orun).root))):
        out.append(str(pq.read_table(p).to_pylist()) if p.endswith(".parquet") else Path(p).read_text())
    for p in sorted((cfg.models_dir / "runs" / orun).rglob("*")):
        if p.is_file() and p.suffix in (".json", ".log", ".md", ".txt", "") and p.stat().st_size < 5_000_000:
            out.append(p.read_text(errors="replace"))
    return out


def has_ngram(seq: list[int], gram: list[int]) -> bool:
    return any(seq[i:i + len(gram)] == gram for i in range(len(seq) - len(gram) + 1))


def prepared(cfg) -> dict[str, list[str]]:
    """Both orgs' traffic landed, the cycle harvested, each org's run harvested and scored."""
    ids = land(Lake(cfg.lake_root))
    harvest(cfg, START, END, 1, RUN)
    assert eligible_orgs(cfg, RUN) == {"org-a": 12, "org-b": 12}
    assert eligible_orgs(cfg, RUN, min_episodes=13) == {}
    for org in ("org-a", "org-b"):
        assert prepare_org(cfg, OrgRun.of(cfg, START, END, 1, RUN, org)).n_episodes == 12
    return ids


def check_batches(cfg, ids: dict[str, list[str]]) -> None:
    """B's training batches hold only B's events and never A's marker tokens (and A's do: the control)."""
    from rl_core.train.data import load_samples, plan_batches

    lake = Lake(cfg.lake_root)
    samples, _ = load_samples(lake, org_run_id(RUN, "org-b"), cfg.train)
    batches = plan_batches(samples, cfg.train, 0, 1, 0)
    assert {e for b in batches for e in b.event_ids} == set(ids["org-b"])
    assert not any(has_ngram(seq, MARKER_IDS) for b in batches for seq in b.input_ids)
    a_batches = plan_batches(load_samples(lake, org_run_id(RUN, "org-a"), cfg.train)[0], cfg.train, 0, 1, 0)
    real = [seq for b in a_batches for seq, m in zip(b.input_ids, b.loss_mask, strict=True) if any(m)]
    assert len(real) == 12 and all(has_ngram(seq, MARKER_IDS) for seq in real)


def check_files(cfg, ids: dict[str, list[str]], min_files: int) -> None:
    """No file of B's run mentions A's marker or event ids; the same search over A's run finds them all."""
    needles = [MARKER, *ids["org-a"]]
    b_texts = run_texts(cfg, org_run_id(RUN, "org-b"))
    assert len(b_texts) >= min_files and leaks(b_texts, needles) == []
    assert leaks(b_texts, ids["org-b"])  # the search does see B's own rows
    assert set(leaks(run_texts(cfg, org_run_id(RUN, "org-a")), needles)) == set(needles)


def test_isolation_of_org_episodes_rewards_and_batches(cfg):
    ids = prepared(cfg)
    check_batches(cfg, ids)
    check_files(cfg, ids, min_files=3)  # episodes, rewards, harvest.json


@pytest.mark.slow
def test_org_adapter_end_to_end_and_isolation(registered):
    from mlflow import MlflowClient

    from rl_core.registry import store

    cfg = registered
    cfg.eval.task_limit = 2
    ids = prepared(cfg)
    b_run = org_run_id(RUN, "org-b")

    assert org_targets(cfg, RUN) == ["org-a", "org-b"]
    out = adapt_org(cfg, START, END, 1, RUN, "org-b")  # what the DAG's mapped task runs per org
    summary = TrainSummary.model_validate(Lake(cfg.lake_root).read_json(f"runs/{b_run}/train/summary.json"))
    assert summary.status == "ok" and summary.steps == out["train_steps"] >= 1
    assert Path(summary.adapter, "adapter_config.json").is_file() and out["episodes"] == 12
    av = register_adapter(cfg, OrgRun.of(cfg, START, END, 1, RUN, "org-b"))  # idempotent: the version adapt_org registered
    assert (av.version, av.adapter_version) == (out["version"], out["adapter_version"])
    assert av.model_name == adapter_model_name("org-b") and av.adapter_version.startswith(f"org-b-v{av.version}-")
    verdicts = read_verdicts(Lake(cfg.lake_root), b_run)
    assert {"train", "eval", "eval_org"} <= set(verdicts) and verdicts["eval_org"].details["n_tasks"] == 2
    assert out["live"] == all(verdicts[n].passed for n in ("train", "eval", "eval_org"))
    assert (live_adapter(cfg, "org-b") is not None) == out["live"]

    # B's batches, then every file of its run (episodes, rewards, spec, log, summary, evals, reports, verdicts)
    check_batches(cfg, ids)
    check_files(cfg, ids, min_files=12)
    # B's MLflow version and runs: org lineage, nothing of A
    needles = [MARKER, *ids["org-a"]]
    c = MlflowClient(tracking_uri=cfg.tracking_uri, registry_uri=cfg.tracking_uri)
    mv = store.get_version(adapter_registry(cfg, "org-b"), av.version)
    assert mv.tags["org_id"] == "org-b" and mv.tags["kind"] == "org_adapter" and mv.tags["run_id"] == b_run
    assert mv.tags["parent_version"] == "1" and mv.tags["episodes"] == "12"
    run = c.get_run(mv.run_id)
    mlflow_text = json.dumps([dict(mv.tags), run.data.tags, run.data.params, sorted(run.data.metrics)])
    assert leaks([mlflow_text], needles) == []
    train_run = c.get_run(summary.mlflow_run_id)
    assert leaks([json.dumps([train_run.data.tags, train_run.data.params])], needles) == []


def test_opted_out_or_bad_org_gets_no_adapter(cfg):
    cfg.harvest.opt_out_orgs = ["org-a"]
    with pytest.raises(OrgError, match="opted out"):
        adapt_org(cfg, START, END, 1, RUN, "org-a")
    with pytest.raises(OrgError, match="plain name"):
        prepare_org(cfg, OrgRun.of(cfg, START, END, 1, RUN, "../org"))
    with pytest.raises(OrgError, match="no episodes"):
        prepare_org(cfg, OrgRun.of(cfg, START, END, 1, RUN, "org-empty"))
    assert not Lake(cfg.lake_root).exists(f"runs/{org_run_id(RUN, 'org-a')}")
