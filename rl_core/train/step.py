"""One micro batch through the policy (and the frozen reference), into the loss.

Logprobs are taken at each row's sampling temperature (logits / T): the behaviour logprobs were logged
under that tempered distribution, so at T = 0.8 an untempered policy would put the ratio of an unchanged
policy far from 1 (measured before this: 25% of tokens clipped, IS weights up to 25 in one SmolLM2 cycle).

Shared by the DeepSpeed trainer and the plain-torch loop of the bench, so both measure the same work.
The reference is a callable: a frozen copy of the parent checkpoint, or, in LoRA mode, the policy with
its adapters switched off (no second copy of the weights).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch import Tensor

from rl_core.train.loss import LossConfig, LossOutput, kl_to_reference, log_probs, pick, policy_loss


def completion_logprobs(model, t: dict, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """Logprobs [B,C] of the completion tokens (and entropy [B,C]) under model, for to_tensors() inputs."""
    return pick(completion_distribution(model, t), t["targets"], with_entropy)  # [B,C], [B,C]


def completion_distribution(model, t: dict) -> Tensor:
    """The full log-distribution [B,C,V] at each completion position under model, at each row's temperature."""
    comp_len = t["comp_len"]
    out = model(
        input_ids=t["input_ids"],  # [B,L]
        attention_mask=t["attention_mask"],  # [B,L]
        position_ids=t["position_ids"],  # [B,L]
        logits_to_keep=comp_len + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1]  # [B,C,V] position j predicts token j+1
    if "temperature" in t:  # the distribution the behaviour logprobs were sampled under
        logits = logits / t["temperature"].to(logits.dtype)[:, None, None]  # [B,C,V]
    return log_probs(logits)  # [B,C,V] float32


def reference_fn(ref_model=None, peft_model=None) -> Callable[[dict], Tensor]:
    """The parent's full log-distribution [B,C,V]: a frozen model, or the LoRA policy with adapters disabled."""

    def run(t: dict) -> Tensor:
        ctx = peft_model.disable_adapter() if peft_model is not None else nullcontext()
        with torch.no_grad(), ctx:
            return completion_distribution(ref_model if ref_model is not None else peft_model, t)  # [B,C,V]

    return run


def compute_loss(model, t: dict, lc: LossConfig, ref: Callable[[dict], Tensor] | None) -> LossOutput:
    """Reference distribution (no grad), then the policy forward and the loss of one micro batch."""
    ref_all = ref(t) if ref is not None else None  # [B,C,V]
    ref_logp = pick(ref_all, t["targets"], with_entropy=False)[0] if ref_all is not None else None  # [B,C]
    logp_all = completion_distribution(model, t)  # [B,C,V]
    logp, entropy = pick(logp_all, t["targets"])  # [B,C], [B,C]
    kl = kl_to_reference(logp_all, ref_all) if ref_all is not None else None  # [B,C]
    return policy_loss(
        logp, t["behaviour_logprobs"], t["advantages"], t["loss_mask"], lc, ref_logp=ref_logp, entropy=entropy, kl=kl
    )
