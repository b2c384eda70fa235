"""The policy-gradient loss against an independent float64 reference, and its edge cases.

The reference is written token by token with explicit branches (no shared code with loss.py beyond the
formulas on paper); loss and gradients with respect to the logits must agree on random inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from rl_core.train.loss import LossConfig, kl_to_reference, log_probs, policy_loss, token_logprobs


def reference_loss(logits, targets, beh, adv, mask, lc: LossConfig, ref_logits=None):
    """Plain float64 loops: the objective as written in the module docstring."""
    logp_all = torch.log_softmax(logits.double(), -1)
    ref_all = None if ref_logits is None else torch.log_softmax(ref_logits.double(), -1)
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
            prox = mu if ref_all is None else float(ref_all[b, c, targets[b, c]])
            w = min(math.exp(prox - mu), lc.is_cap)
            r = torch.exp(lp - prox)
            a = float(adv[b])
            lo, hi = 1 - lc.clip_eps, 1 + lc.clip_eps
            r_clip = torch.clamp(r, lo, hi)
            obj = torch.minimum(r * a, r_clip * a)
            if a < 0:
                obj = torch.maximum(obj, torch.tensor(lc.is_cap * a, dtype=torch.float64))
            pg = pg - w * obj
            p = logp_all[b, c].exp()
            if ref_all is not None:
                for v in range(logp_all.shape[-1]):  # KL(new || ref), every vocabulary entry
                    kl = kl + p[v] * (logp_all[b, c, v] - ref_all[b, c, v])
            ent = ent - (p * logp_all[b, c]).sum()
    n = max(n, 1)
    return pg / n + lc.kl_coef * kl / n - lc.entropy_coef * ent / n


def _inputs(seed: int, B=3, C=5, V=11, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, C, V, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (B, C), generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    beh = logp + spread * torch.randn(B, C, generator=g, dtype=torch.float64)  # a slightly stale behaviour policy
    ref = logits + spread * torch.randn(B, C, V, generator=g, dtype=torch.float64)  # the parent's logits
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, C, generator=g) > 0.3).double()
    mask[0, -1] = 1.0
    return logits, targets, beh, ref, adv, mask


def _ours(logits, targets, beh, adv, mask, lc, ref=None):
    """Our loss and its gradient with respect to the logits; ref: the parent's logits [B,C,V] or None."""
    x = logits.float().clone().requires_grad_(True)
    logp, entropy = token_logprobs(x, targets)
    ref_logp = kl = None
    if ref is not None:
        ref_all = log_probs(ref.float())
        ref_logp = ref_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        kl = kl_to_reference(log_probs(x), ref_all)
    out = policy_loss(logp, beh.float(), adv.float(), mask.float(), lc, ref_logp=ref_logp, entropy=entropy, kl=kl)
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
        out, grad = _ours(logits, targets, beh, adv, mask, lc, ref=logits)
        free, free_grad = _ours(logits, targets, logp, adv, mask, lc, ref=logits)  # the same token, on-policy
        torch.testing.assert_close(grad, lc.is_cap * free_grad)
        assert out.metrics["is_trunc_frac"].item() == 1.0


def test_zero_advantage_gives_no_policy_gradient():
    logits, targets, beh, ref, _, mask = _inputs(3)
    adv = torch.zeros(3, dtype=torch.float64)
    out, grad = _ours(logits, targets, beh, adv, mask, LossConfig(kl_coef=0.0, entropy_coef=0.0), ref)
    assert out.loss.item() == 0.0 and grad.abs().max() == 0
    out, grad = _ours(logits, targets, beh, adv, mask, LossConfig(kl_coef=0.1), ref)  # only the KL pulls
    assert out.loss.item() > 0 and grad.abs().max() > 0


def test_kl_is_zero_at_the_reference_and_exact_away_from_it():
    logits, targets, beh, ref, adv, mask = _inputs(4)
    out, _ = _ours(logits, targets, beh, adv, mask, LossConfig(kl_coef=1.0), ref=logits)
    assert out.metrics["kl"].item() == pytest.approx(0.0, abs=1e-6)
    out, _ = _ours(logits, targets, beh, adv, mask, LossConfig(kl_coef=1.0), ref=ref)
    new, old = torch.log_softmax(logits, -1), torch.log_softmax(ref, -1)
    per_pos = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=new),
                                                torch.distributions.Categorical(logits=old))  # [B,C]
    want = (per_pos * mask).sum() / mask.sum()
    assert out.metrics["kl"].item() == pytest.approx(want.item(), rel=1e-4) and want > 0


def test_kl_of_a_token_pushed_down_is_its_true_size_not_the_sampled_estimate():
    """The parent sampled a token it likes (p 0.77); the update pushed it to p 0.0026. Sampled from the
    parent, the k3 estimate of that token is exp(5.7) - 5.7 - 1 = 290 (one such token in 268 made a SmolLM2
    step read KL 1.1 and the gate refuse the update). The exact KL at that position is what moved: < 2 nats."""
    ref_p = torch.tensor([[[0.77, 0.20, 0.03]]], dtype=torch.float64)
    new_p = torch.tensor([[[0.0026, 0.9674, 0.03]]], dtype=torch.float64)
    targets = torch.tensor([[0]])
    logits, ref = new_p.log(), ref_p.log()
    beh = ref.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # the behaviour policy is the parent
    out, _ = _ours(logits, targets, beh, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1),
                   LossConfig(kl_coef=0.1), ref=ref)
    exact = float((new_p * (new_p.log() - ref_p.log())).sum())
    r = math.log(0.77 / 0.0026)
    assert out.metrics["kl"].item() == pytest.approx(exact, rel=1e-4)
    assert exact < 2.0 < 200 < math.exp(r) - r - 1  # what the sampled k3 said


def test_clip_fraction_counts_tokens_outside_the_trust_region():
    logits, targets, beh, _, adv, _ = _inputs(5, B=2, C=2)
    ref = logits.clone()
    ref[0, 0, targets[0, 0]] += 3.0  # the parent liked this token much more: ratio < 0.8, outside 1 +- 0.2
    out, _ = _ours(logits, targets, beh, adv, torch.ones(2, 2), LossConfig(clip_eps=0.2), ref=ref)
    assert out.metrics["clip_frac"].item() == pytest.approx(0.25)
