"""The policy-gradient loss against an independent float64 reference, and its edge cases.

The reference is written token by token with explicit branches (no shared code with loss.py beyond the
formulas on paper); loss and gradients with respect to the logits must agree on random inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from rl_core.train.loss import LossConfig, policy_loss, token_logprobs


def reference_loss(logits, targets, beh, adv, mask, lc: LossConfig, ref=None):
    """Plain float64 loops: the objective as written in the module docstring."""
    logp_all = torch.log_softmax(logits.double(), -1)
    B, C = targets.shape
    pg = kl = ent = 0.0
    n = 0
    for b in range(B):
        for c in range(C):
            if mask[b, c] == 0:
                continue
            n += 1
            lp = logp_all[b, c, targets[b, c]]
            mu = float(beh[b, c])
            prox = mu if ref is None else float(ref[b, c])
            w = min(math.exp(prox - mu), lc.is_cap)
            r = torch.exp(lp - prox)
            a = float(adv[b])
            lo, hi = 1 - lc.clip_eps, 1 + lc.clip_eps
            r_clip = torch.clamp(r, lo, hi)
            obj = torch.minimum(r * a, r_clip * a)
            if a < 0:
                obj = torch.maximum(obj, torch.tensor(lc.is_cap * a, dtype=torch.float64))
            pg = pg - w * obj
            if ref is not None:
                d = prox - lp
                kl = kl + torch.exp(d) - d - 1
            p = logp_all[b, c].exp()
            ent = ent - (p * logp_all[b, c]).sum()
    n = max(n, 1)
    return pg / n + lc.kl_coef * kl / n - lc.entropy_coef * ent / n


def _inputs(seed: int, B=3, C=5, V=11, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, C, V, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (B, C), generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    beh = logp + spread * torch.randn(B, C, generator=g, dtype=torch.float64)  # a slightly stale behaviour policy
    ref = logp + spread * torch.randn(B, C, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, C, generator=g) > 0.3).double()
    mask[0, -1] = 1.0
    return logits, targets, beh, ref, adv, mask


def _ours(logits, targets, beh, adv, mask, lc, ref=None):
    x = logits.float().clone().requires_grad_(True)
    logp, entropy = token_logprobs(x, targets)
    out = policy_loss(logp, beh.float(), adv.float(), mask.float(), lc,
                      ref_logp=None if ref is None else ref.float(), entropy=entropy)
    out.loss.backward()
    return out, x.grad


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_ref", [True, False])
def test_loss_and_gradients_match_float64_reference(seed, with_ref):
    logits, targets, beh, ref, adv, mask = _inputs(seed)
    lc = LossConfig(clip_eps=0.2, is_cap=2.0, kl_coef=0.1 if with_ref else 0.0, entropy_coef=0.01)
    out, grad = _ours(logits, targets, beh, adv, mask, lc, ref if with_ref else None)

    x = logits.clone().requires_grad_(True)
    expected = reference_loss(x, targets, beh, adv, mask, lc, ref if with_ref else None)
    expected.backward()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(grad.double(), x.grad, rtol=1e-4, atol=1e-6)
    assert grad.abs().sum() > 0  # the comparison is not between two zeros


def test_all_tokens_masked_gives_zero_loss_and_no_nan():
    logits, targets, beh, ref, adv, _ = _inputs(1)
    beh = beh - 1e4  # garbage in padding must never reach exp()
    ref = ref + 1e4
    mask = torch.zeros_like(beh)
    out, grad = _ours(logits, targets, beh, adv, mask, LossConfig(kl_coef=0.5, entropy_coef=0.1), ref)
    assert out.loss.item() == 0.0
    assert torch.isfinite(grad).all() and grad.abs().max() == 0
    assert all(torch.isfinite(v) for v in out.metrics.values())
    assert out.metrics["tokens"].item() == 0


def test_ratio_far_above_cap_cannot_dominate():
    """A token whose ratio to the behaviour policy is e^10 gives no gradient without a reference (clip,
    dual clip), and with a reference its importance weight is truncated to is_cap exactly."""
    logits, targets, _, _, _, _ = _inputs(2, B=2, C=1)
    logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    beh = logp - 10.0  # served with probability e^-10 of what the policy now gives
    mask = torch.ones_like(beh)
    lc = LossConfig(clip_eps=0.2, is_cap=2.0)
    for sign in (1.0, -1.0):
        adv = torch.tensor([sign, sign], dtype=torch.float64)
        out, grad = _ours(logits, targets, beh, adv, mask, lc)
        assert math.isfinite(out.loss.item())
        assert grad.abs().max() == 0, sign
        assert out.metrics["is_weight_max"].item() > 1e4  # reported, not hidden

        # with the parent as proximal policy (ratio 1 to it), the stale token weighs is_cap, not e^10
        out, grad = _ours(logits, targets, beh, adv, mask, lc, ref=logp)
        free, free_grad = _ours(logits, targets, logp, adv, mask, lc, ref=logp)  # the same token, on-policy
        torch.testing.assert_close(grad, lc.is_cap * free_grad)
        assert out.metrics["is_trunc_frac"].item() == 1.0


def test_zero_advantage_gives_no_policy_gradient():
    logits, targets, beh, ref, _, mask = _inputs(3)
    adv = torch.zeros(3, dtype=torch.float64)
    out, grad = _ours(logits, targets, beh, adv, mask, LossConfig(kl_coef=0.0, entropy_coef=0.0), ref)
    assert out.loss.item() == 0.0 and grad.abs().max() == 0
    out, grad = _ours(logits, targets, beh, adv, mask, LossConfig(kl_coef=0.1), ref)  # only the KL pulls
    assert out.loss.item() > 0 and grad.abs().max() > 0


def test_kl_is_zero_at_the_reference_and_positive_away_from_it():
    logits, targets, beh, _, adv, mask = _inputs(4)
    logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    out, _ = _ours(logits, targets, beh, adv, mask, LossConfig(kl_coef=1.0), ref=logp)
    assert out.metrics["kl"].item() == pytest.approx(0.0, abs=1e-6)
    out, _ = _ours(logits, targets, beh, adv, mask, LossConfig(kl_coef=1.0), ref=logp + 0.5)
    assert out.metrics["kl"].item() == pytest.approx(math.exp(0.5) - 0.5 - 1, rel=1e-4)


def test_clip_fraction_counts_tokens_outside_the_trust_region():
    logits, targets, beh, _, adv, _ = _inputs(5, B=2, C=2)
    logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ref = logp.clone()
    ref[0, 0] += 1.0  # ratio e^-1: outside 1 +- 0.2
    out, _ = _ours(logits, targets, beh, adv, torch.ones_like(logp), LossConfig(clip_eps=0.2), ref=ref)
    assert out.metrics["clip_frac"].item() == pytest.approx(0.25)
