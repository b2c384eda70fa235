"""Token-level policy-gradient loss for (almost) on-policy data.

The completions were sampled by the serving engine, possibly by a version up to `max_staleness` behind
the policy being updated, and their logprobs were logged then (the behaviour policy, mu). The ratio
pi_new / mu = exp(logp_new - logp_behaviour) is factored through the proximal policy (the parent
checkpoint we start from, also the KL reference):

    pi_new / mu = [pi_new / pi_prox] * [pi_prox / mu]
                   PPO-clipped ratio    truncated IS weight, min(., is_cap), no gradient

so the trust region is around the parent (PPO clipping, eps) while stale or engine-mismatched tokens get
an importance weight that can never exceed `is_cap` (truncated IS, Ionides 2008; "decoupled PPO",
Hilton et al. 2021). Without proximal logprobs (no reference) the proximal policy is mu itself. For
negative advantages a dual clip at `is_cap` bounds the weight too, so no single token can dominate.
KL to the reference is exact at every completion position: sum over the vocabulary of
pi_new * (log pi_new - log pi_ref), KL(pi_new || pi_ref), averaged over the positions. Why not the sampled k3
estimator exp(r) - r - 1, r = logp_ref - logp_new: k3 is unbiased only for tokens sampled from pi_new, and
ours were sampled from the behaviour policy, which is the parent itself at the start of an update. There a
token the update pushed down (p_ref 0.77 -> p_new 0.0026) counts exp(5.7) = 290 instead of about 1, and one
such token in 268 made a step read KL 1.1 and the gate refuse an update whose exact KL was small
(SmolLM2, run E of experiments/early-runs/history.md, replayed). Every mean is over completion tokens only (mask); an
all-masked batch gives 0.

Shapes: B sequences, C completion positions (right-aligned, masked where a sequence is shorter), V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from rl_core.config import TrainConfig


@dataclass(frozen=True)
class LossConfig:
    clip_eps: float = 0.2  # PPO clip range around the proximal policy
    is_cap: float = 2.0  # truncation of the importance weight pi_prox / mu (and dual clip for A < 0)
    kl_coef: float = 0.0  # weight of the KL to the reference (exact over the vocabulary)
    entropy_coef: float = 0.0  # entropy bonus (subtracted from the loss)

    @classmethod
    def from_train(cls, tc: TrainConfig) -> LossConfig:
        """From a config.TrainConfig (the loss module stays importable without the config's dependencies)."""
        return cls(clip_eps=tc.clip_eps, is_cap=tc.is_cap, kl_coef=tc.kl_coef, entropy_coef=tc.entropy_coef)


@dataclass
class LossOutput:
    loss: Tensor  # [] what to backpropagate
    metrics: dict[str, Tensor]  # detached scalars: pg_loss, kl, entropy, clip_frac, is_weight_mean/max, ...


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over mask==1 (0 when nothing is unmasked: an all-padding batch contributes nothing)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)  # []


def token_logprobs(logits: Tensor, targets: Tensor, with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """Logprob of each target token under logits, and the full-distribution entropy per position.

    logits [B,C,V] predict targets [B,C]; computed in float32 whatever the model dtype (bf16 logprobs
    are off by ~0.4 nats, enough to fake a ratio far from 1).
    """
    return pick(log_probs(logits), targets, with_entropy)  # [B,C], [B,C]


def pick(logp_all: Tensor, targets: Tensor, with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """From a full log-distribution [B,C,V]: the targets' logprobs [B,C] and the entropy per position [B,C]."""
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B,C]
    if not with_entropy:
        return logp, None
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B,C]
    return logp, entropy


def log_probs(logits: Tensor) -> Tensor:
    """The full log-distribution [B,C,V] of logits [B,C,V], in float32 whatever the model dtype."""
    return torch.log_softmax(logits.float(), dim=-1)  # [B,C,V]


def kl_to_reference(logp_all: Tensor, ref_logp_all: Tensor) -> Tensor:
    """Exact KL(pi_new || pi_ref) at each position [B,C], from both full log-distributions [B,C,V].

    Differentiable in logp_all (the penalty's gradient); ref_logp_all carries no gradient.
    """
    return (logp_all.exp() * (logp_all - ref_logp_all.detach())).sum(-1)  # [B,C] >= 0


def policy_loss(
    logp: Tensor,
    behaviour_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    lc: LossConfig,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    kl: Tensor | None = None,
) -> LossOutput:
    """The loss of one micro batch.

    logp [B,C] (with grad), behaviour_logp [B,C] (logged at serving), advantages [B] or [B,C],
    mask [B,C] (1 on completion tokens), ref_logp [B,C] (parent/reference, no grad), entropy [B,C],
    kl [B,C] (kl_to_reference, with grad): required with ref_logp, the KL metric and penalty.
    """
    if ref_logp is not None and kl is None:
        raise ValueError("policy_loss: ref_logp needs kl (kl_to_reference of the full distributions)")
    m = mask.to(logp.dtype)  # [B,C]
    adv = advantages.to(logp.dtype)  # [B] or [B,C]
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [B,1] or [B,C]
    on = m > 0  # [B,C] bool
    zero = torch.zeros_like(logp)  # [B,C]
    beh = torch.where(on, behaviour_logp.to(logp.dtype), zero)  # [B,C] padding never reaches exp()
    new = torch.where(on, logp, zero)  # [B,C]
    prox = beh if ref_logp is None else torch.where(on, ref_logp.to(logp.dtype), zero).detach()  # [B,C]

    is_w = torch.exp(prox - beh).clamp(max=lc.is_cap).detach()  # [B,C] truncated pi_prox / mu
    ratio = torch.exp(new - prox)  # [B,C] pi_new / pi_prox
    clipped = ratio.clamp(1.0 - lc.clip_eps, 1.0 + lc.clip_eps)  # [B,C]
    surr = torch.minimum(ratio * adv, clipped * adv)  # [B,C] PPO pessimistic surrogate
    surr = torch.where(adv < 0, torch.maximum(surr, lc.is_cap * adv), surr)  # [B,C] dual clip
    pg = -(is_w * surr)  # [B,C]
    pg_loss = masked_mean(pg, m)  # []
    loss = pg_loss  # []

    metrics: dict[str, Tensor] = {"pg_loss": pg_loss.detach()}
    if ref_logp is not None:
        kl_mean = masked_mean(torch.where(on, kl, zero), m)  # [] exact KL per position, averaged
        if lc.kl_coef > 0:
            loss = loss + lc.kl_coef * kl_mean  # []
        metrics["kl"] = kl_mean.detach()
    else:
        metrics["kl"] = torch.zeros((), dtype=logp.dtype)
    if entropy is not None:
        ent_mean = masked_mean(entropy, m)  # []
        if lc.entropy_coef > 0:
            loss = loss - lc.entropy_coef * ent_mean  # []
        metrics["entropy"] = ent_mean.detach()

    with torch.no_grad():
        full = torch.exp(new - beh) * m  # [B,C] pi_new / mu, the importance weight before any truncation
        metrics["clip_frac"] = masked_mean(((ratio - 1.0).abs() > lc.clip_eps).to(m.dtype), m)  # []
        metrics["is_weight_mean"] = masked_mean(full, m)  # []
        metrics["is_weight_max"] = full.max() if full.numel() else torch.zeros(())  # []
        metrics["is_trunc_frac"] = masked_mean((torch.exp(prox - beh) > lc.is_cap).to(m.dtype), m)  # []
        metrics["tokens"] = m.sum()  # []
    return LossOutput(loss=loss, metrics=metrics)
