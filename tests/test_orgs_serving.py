"""The gateway answers an org's token with that org's live adapter (peft, transformers backend), over real HTTP.

The adapter is a real peft LoRA with random (non-zero) weights, registered in MLflow as `rtrl-adapter-org-acme`
and made live by its alias: what the trainer would produce, without spending a training run on it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import openai
import pyarrow.parquet as pq
import pytest

from rl_core.lake import Lake
from rl_core.orgs.pipeline import OrgRun
from rl_core.orgs.registry import LIVE_ALIAS, adapter_registry, deploy_adapter, register_adapter_folder

MSG = [{"role": "user", "content": "rename the helper in utils.py"}]


def make_adapter(base: Path, out: Path, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    lora = LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False,
                      task_type="CAUSAL_LM")
    get_peft_model(model, lora).save_pretrained(out)
    return out


def peft_logprobs(base: Path, adapter: Path | None, prompt: list[int], completion: list[int]) -> list[float]:
    """Logprobs of the completion under base (+ adapter, by peft unmerged: independent of serving)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def ask(base_url: str, token: str, model: str = "champion"):
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=token, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model=model, messages=MSG, temperature=0, max_tokens=6)
    return raw.headers, raw.parse()


def test_org_token_is_served_its_live_adapter_and_logged(registered, tmp_path):
    from rl_core.registry import store
    from rl_core.serving.server import build_gateway, serve_in_thread

    cfg = registered
    base = store.checkpoint_path(cfg, 1)
    v1 = register_adapter_folder(cfg, "org-acme", make_adapter(base, tmp_path / "a1", 1),
                                 {"parent_version": 1, "run_id": "manual-a1"})
    now = datetime.now(UTC)
    assert not deploy_adapter(cfg, OrgRun.of(cfg, now, now, 1, "manual", "org-acme"), v1.version)  # no verdicts: never live that way
    store.set_alias(adapter_registry(cfg, "org-acme"), LIVE_ALIAS, v1.version, reason="test")

    gw = build_gateway(cfg, poll=False)
    with serve_in_thread(cfg, gateway=gw) as url:
        h_acme, r_acme = ask(url, "rtrl-acme-token")
        h_glob, _ = ask(url, "rtrl-globex-token")
        h_pin, _ = ask(url, "rtrl-acme-token", model=f"{cfg.mlflow.model_name}/1")
        assert h_acme["x-rtrl-adapter-version"] == v1.adapter_version and h_acme["x-rtrl-model-version"] == "1"
        assert "x-rtrl-adapter-version" not in h_glob and "x-rtrl-adapter-version" not in h_pin

        # a new adapter version goes live: a new, never-reused name; acme's next request uses it
        v2 = register_adapter_folder(cfg, "org-acme", make_adapter(base, tmp_path / "a2", 2),
                                     {"parent_version": 1, "run_id": "manual-a2"})
        store.set_alias(adapter_registry(cfg, "org-acme"), LIVE_ALIAS, v2.version, reason="test")
        assert gw.router.adapters.sync()
        h2, _ = ask(url, "rtrl-acme-token")
        assert h2["x-rtrl-adapter-version"] == v2.adapter_version != v1.adapter_version
        assert v1.adapter_version.startswith("org-acme-v1-") and v2.adapter_version.startswith("org-acme-v2-")

        # the champion moves to a version the adapter was not trained on: acme gets the plain champion
        v_new = store.register_checkpoint(cfg, base, run_name="new-champion", tags={"run_id": "new-champion"})
        store.set_alias(cfg, "champion", v_new, reason="test")
        assert gw.router.sync()
        h3, _ = ask(url, "rtrl-acme-token")
        assert h3["x-rtrl-model-version"] == str(v_new) and "x-rtrl-adapter-version" not in h3

    lake = Lake(cfg.lake_root)
    rows = {r["event_id"]: r for p in lake.list_files("raw/interactions") for r in pq.read_table(p).to_pylist()}
    by_header = {h["x-rtrl-event-id"]: h.get("x-rtrl-adapter-version") for h in (h_acme, h_glob, h_pin, h2, h3)}
    assert {e: rows[e]["adapter_version"] for e in by_header} == by_header  # logged in every interaction
    row = rows[h_acme["x-rtrl-event-id"]]
    assert row["org_id"] == "org-acme" and json.loads(row["messages"])["messages"][0]["content"] == MSG[0]["content"]
    # the logged behaviour logprobs are the adapter's (what RL will train on), not the base model's
    want = peft_logprobs(base, tmp_path / "a1", row["prompt_token_ids"], row["completion_token_ids"])
    assert row["completion_logprobs"] == pytest.approx(want, abs=2e-4)
    plain = peft_logprobs(base, None, row["prompt_token_ids"], row["completion_token_ids"])
    assert max(abs(a - b) for a, b in zip(want, plain, strict=True)) > 1e-2  # the adapter does change the model
