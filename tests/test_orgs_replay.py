"""The replay measurement (lab/simulate/replay.py): an org's logged requests go back through a real gateway
to the pinned base version and to the org's live adapter, with the same sampling seed on both arms; the summary
pairs them by request, clusters by user, and says when an answer came from the wrong weights."""

from __future__ import annotations

import openai
import pytest
from test_orgs_serving import make_adapter

from lab.simulate.org_protocol import replay_summary
from lab.simulate.replay import Answer, Request, logged_requests, replay, sample_batched, sample_seed
from rl_core.orgs.registry import LIVE_ALIAS, adapter_registry, register_adapter_folder
from rl_core.registry import store


def _answer(user: str, org: str, eid: str, arm: str, j: int, hit: bool, adapter: str | None = None) -> Answer:
    return Answer(eid, user, org, arm, j, 1, adapter, {"prose_after_code": hit})


def _conventions(cfg):
    from rl_core.config import Preference

    cfg.simulate.conventions = {"org-acme": Preference(feature="prose_after_code", want=True),
                                "org-globex": Preference(feature="prose_after_code", want=False)}
    return cfg


def test_replay_summary_pairs_by_request_and_clusters_by_user(cfg):
    cfg = _conventions(cfg)
    answers = []
    for u in range(4):  # acme's adapter always writes the feature, its base half the time; globex's the reverse
        for org, ad_hit in (("org-acme", True), ("org-globex", False)):
            user = f"{org}-u{u}"
            for r in range(2):
                eid = f"{user}-e{r}"
                for j in range(2):
                    answers += [_answer(user, org, eid, "base", j, j == 0),
                                _answer(user, org, eid, "adapter", j, ad_hit, f"{org}-v1-abc")]
    s = replay_summary(cfg, "prose_after_code", answers, [])
    assert s["org_moves"]["org-acme"]["mean_rate_change"] == pytest.approx(0.5)
    assert s["org_moves"]["org-globex"]["mean_rate_change"] == pytest.approx(-0.5)
    assert s["did"]["diff"] == pytest.approx(1.0) and s["did"]["n_a"] == s["did"]["n_b"] == 4  # users, not requests
    assert s["checks"]["did_excludes_zero"] and s["checks"]["each_org_moves_toward_its_convention"]
    assert s["checks"]["adapters_isolated"] and s["org_rates_by_cycle"]["org-acme"] == [0.5, 1.0]
    assert not s["checks"]["shared_suite_no_regression"]  # no trained cycle given: no eval verdict, never a pass

    leak = answers + [_answer("org-acme-u0", "org-acme", "org-acme-u0-e0", "adapter", 2, True, "org-globex-v1-x")]
    assert not replay_summary(cfg, "prose_after_code", leak, [])["checks"]["adapters_isolated"]
    adapted_base = answers + [_answer("org-acme-u0", "org-acme", "org-acme-u0-e0", "base", 2, True, "org-acme-v1-abc")]
    assert not replay_summary(cfg, "prose_after_code", adapted_base, [])["checks"]["adapters_isolated"]
    unadapted = [a for a in answers if not (a.org_id == "org-globex" and a.arm == "adapter")]
    unadapted += [_answer(a.user_id, a.org_id, a.event_id, "adapter", a.sample, False) for a in answers
                  if a.org_id == "org-globex" and a.arm == "adapter"]
    assert not replay_summary(cfg, "prose_after_code", unadapted, [])["checks"]["each_org_served_its_adapter"]


def test_a_guard_fails_an_adapter_that_meets_its_convention_by_dropping_code(cfg):
    """globex rejects prose after code; an adapter that writes no code block at all meets that (v3's route):
    the DiD passes, the guard on code_block does not."""
    cfg = _conventions(cfg)
    answers = []
    for u in range(4):
        for org in ("org-acme", "org-globex"):
            user = f"{org}-u{u}"
            for j in range(2):
                base = {"prose_after_code": j == 0, "code_block": True}
                adapted = {"prose_after_code": org == "org-acme", "code_block": org == "org-acme" or j == 0}
                answers += [Answer(f"{user}-e0", user, org, "base", j, 1, None, base),
                            Answer(f"{user}-e0", user, org, "adapter", j, 1, f"{org}-v1-abc", adapted)]
    s = replay_summary(cfg, "prose_after_code", answers, [], guard="code_block", guard_tolerance=0.05)
    assert s["checks"]["did_excludes_zero"] and s["checks"]["each_org_moves_toward_its_convention"]
    assert s["guard"]["org-globex"]["mean_rate_change"] == pytest.approx(-0.5)
    assert s["guard"]["org-acme"]["mean_rate_change"] == pytest.approx(0.0)
    assert s["checks"]["guard_kept"] is False
    # the answers' shape is reported for every run, guard or not (features an old replay lacks are left out)
    assert s["shape"]["code_block"]["org-globex"]["mean_rate_change"] == pytest.approx(-0.5)
    assert set(s["shape"]) == {"code_block"}
    whole = [Answer(a.event_id, a.user_id, a.org_id, a.arm, a.sample, 1, a.adapter_version,
                    {**a.features, "code_block": True}) for a in answers]
    kept = replay_summary(cfg, "prose_after_code", whole, [], guard="code_block")
    assert kept["checks"]["guard_kept"] is True and "guard_kept" not in replay_summary(
        cfg, "prose_after_code", answers, [])["checks"]


def test_the_writes_code_guard_fails_an_adapter_whose_preamble_pushes_the_code_past_the_token_cap(cfg):
    """v5's failure, from answer texts through the real feature checks: acme wants a sentence before the code,
    and its adapter writes one so long that, cut at max_tokens, half its answers never open a fence. The DiD
    on summary_first passes; the writes_code guard (on the same texts) does not."""
    from rl_core.config import Preference
    from rl_core.features import features_of

    cfg.simulate.conventions = {"org-acme": Preference(feature="summary_first", want=True, needs="writes_code"),
                                "org-globex": Preference(feature="summary_first", want=False, needs="writes_code")}
    code = "```python\ndef f(x):\n    return x + 1\n```"
    texts = {("org-acme", "base"): [code, code],
             ("org-acme", "adapter"): ["This change adds one to x.\n" + code, "First, let me explain " + "why " * 60],
             ("org-globex", "base"): ["Here is the fix.\n" + code, code],
             ("org-globex", "adapter"): [code, code]}
    answers = [Answer(f"{org}-u{u}-e0", f"{org}-u{u}", org, arm, j, 1, None if arm == "base" else f"{org}-v1-abc",
                      features_of(texts[org, arm][j]))
               for u in range(4) for (org, arm) in texts for j in range(2)]
    s = replay_summary(cfg, "summary_first", answers, [], guard="writes_code", guard_tolerance=0.05)
    assert s["org_moves"]["org-acme"]["mean_rate_change"] == pytest.approx(0.5)  # 0 of 2 -> 1 of 2...
    assert s["org_moves"]["org-globex"]["mean_rate_change"] == pytest.approx(-0.5)
    assert s["checks"]["did_excludes_zero"] and s["checks"]["each_org_moves_toward_its_convention"]
    assert s["guard"]["org-acme"]["feature"] == "writes_code"
    assert s["guard"]["org-acme"]["mean_rate_change"] == pytest.approx(-0.5)  # ...but half its answers lost the code
    assert s["guard"]["org-globex"]["mean_rate_change"] == pytest.approx(0.0)
    assert s["checks"]["guard_kept"] is False
    assert s["shape"]["writes_code"]["org-acme"]["mean_rate_change"] == pytest.approx(-0.5)


def test_sample_seeds_are_shared_by_the_arms_and_differ_by_sample():
    assert sample_seed(3, "e1", 0) == sample_seed(3, "e1", 0)
    assert len({sample_seed(3, "e1", j) for j in range(8)} | {sample_seed(4, "e1", 0), sample_seed(3, "e2", 0)}) == 10


def test_logged_requests_replay_to_the_base_and_to_the_orgs_adapter(registered, tmp_path):
    from rl_core.serving.server import build_gateway, serve_in_thread

    cfg = _conventions(registered)
    cfg.simulate.max_tokens = 8
    with serve_in_thread(cfg, gateway=build_gateway(cfg, poll=False)) as url:  # the traffic a cycle logged
        for token, user in (("rtrl-acme-token", "org-acme-u0"), ("rtrl-globex-token", "org-globex-u1")):
            client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
            client.chat.completions.create(model="auto", user=user, max_tokens=4, messages=[
                {"role": "user", "content": f"write a helper for {user}"}])
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    reqs = logged_requests(cfg, now - timedelta(hours=1), now + timedelta(minutes=1), ["org-acme", "org-globex"])
    assert [(r.org_id, r.user_id) for r in reqs] == [("org-acme", "org-acme-u0"), ("org-globex", "org-globex-u1")]
    assert reqs[0].messages == [{"role": "user", "content": "write a helper for org-acme-u0"}]

    base = store.checkpoint_path(cfg, 1)
    live = {}
    for org, folder in (("org-acme", make_adapter(base, tmp_path / "org-acme", 0)),
                        ("org-globex", identity_adapter(base, tmp_path / "org-globex"))):
        v = register_adapter_folder(cfg, org, folder, {"parent_version": 1, "run_id": f"manual-{org}"})
        store.set_alias(adapter_registry(cfg, org), LIVE_ALIAS, v.version, reason="test")
        live[org] = v.adapter_version
    answers = replay(cfg, reqs, 1, 2, seed=0, log=tmp_path / "replay.log")
    assert len(answers) == 2 * 2 * 2  # requests x samples x arms
    for a in answers:
        assert a.model_version == 1 and set(a.features) >= {"prose_after_code"}
        assert a.adapter_version == (live[a.org_id] if a.arm == "adapter" else None)
    s = replay_summary(cfg, "prose_after_code", answers, [])
    assert s["checks"]["adapters_isolated"] and s["checks"]["each_org_served_its_adapter"]
    assert s["answers"] == 8 and s["wrong_version"] == 0

    # the batched sampler: the same arms without the gateway. Globex's adapter is the identity (LoRA B = 0), so
    # with the same seed on both arms (common random numbers) its answers are the base's, token for token;
    # acme's random adapter changes them
    cfg.simulate.max_tokens = 16
    batched = sample_batched(cfg, reqs, 1, 3, seed=0, batch=6)
    assert len(batched) == 2 * 3 * 2 and {a.adapter_version for a in batched if a.arm == "adapter"} == set(live.values())
    text = {(a.org_id, a.arm, a.sample): a.text for a in batched}
    assert all(text["org-globex", "base", j] == text["org-globex", "adapter", j] for j in range(3))
    assert any(text["org-acme", "base", j] != text["org-acme", "adapter", j] for j in range(3))
    assert len({text["org-globex", "base", j] for j in range(3)}) > 1  # the samples are samples, not one answer
    assert replay_summary(cfg, "prose_after_code", batched, [])["org_moves"]["org-globex"]["mean_rate_change"] == 0
    # an org's requests are batched shortest prompt first (a batch pads little): a long one logged first comes last
    long = Request("e-long", "org-globex-u1", "org-globex", [{"role": "user", "content": "explain this " * 60}], None)
    ordered = sample_batched(cfg, [long, reqs[1]], 1, 1, seed=0, batch=1)
    assert [a.event_id for a in ordered if a.arm == "base"] == [reqs[1].event_id, "e-long"]

    # an adapter its gates refused (no live alias) is still measured, so the run reports what the update learned;
    # the gateway serves that org nothing but the base, which the served check reports
    store.delete_alias(adapter_registry(cfg, "org-acme"), LIVE_ALIAS, reason="test: refused by its eval")
    refused = sample_batched(cfg, reqs[:1], 1, 1, seed=0)
    assert {a.adapter_version for a in refused if a.arm == "adapter"} == {live["org-acme"]}
    served = replay(cfg, reqs, 1, 1, seed=0, log=tmp_path / "served.log", arms=("adapter",))
    s = replay_summary(cfg, "prose_after_code", refused, [], served_answers=served)
    assert not s["checks"]["each_org_served_its_adapter"] and s["adapters_served"]["org-acme"]["adapter"] == {"none": 1}


def identity_adapter(base, out):
    """A real peft LoRA that changes nothing (B = 0, peft's default init): base + adapter == base."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    lora = LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora).save_pretrained(out)
    return out
