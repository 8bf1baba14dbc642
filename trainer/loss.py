"""Our policy loss in verl's registry, and the adapter's batch laid out the way verl's actor reads
it.

The `agl` loss is dual-clip PPO, each token's loss times its weight (the adapter's rollout-level
loss weight times the truncated importance weight: the policy before the step over the behaviour
policy), summed: the objective of docs/architecture.md, "Loss weight per rollout", exact however
samples split over micro-batches and data-parallel ranks (the weights normalize; verl's
`loss_agg_mode` is unused). `agl_ppo_loss` adds verl's KL and entropy terms with the same weights.
Importing this module registers the loss (verl's workers must import it too); nothing here runs a
model.
"""

from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import kl_penalty, register_policy_loss

from adapters import Batch
from trainer.config import LOSS


@register_policy_loss(LOSS)
def agl_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-sum",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """sum over tokens of weight * dual-clip PPO loss (times verl's dp size, which its gradient
    average undoes)."""
    clip = config.clip_ratio
    low = config.get("clip_ratio_low") or clip
    high = config.get("clip_ratio_high") or clip
    dual = config.get("clip_ratio_c", 3.0)
    mask = response_mask.to(log_prob.dtype)
    log_ratio = torch.clamp(log_prob - old_log_prob, -20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - low, 1 + high)
    ppo = torch.maximum(unclipped, clipped)
    losses = torch.where(advantages < 0, torch.minimum(ppo, -advantages * dual), ppo)
    weights = rollout_is_weights
    if weights is None:
        weights = torch.ones_like(losses)
    info = getattr(config, "global_batch_info", None) or {}
    loss = (losses * weights * mask).sum() * info.get("dp_size", 1)
    n = mask.sum().clamp(min=1)
    return loss, {
        "actor/pg_clipfrac": ((clipped > unclipped).to(mask.dtype) * mask).sum().item() / n.item(),
        "actor/ppo_kl": (-(log_ratio * mask).sum() / n).item(),
    }


def agl_ppo_loss(
    config: Any, model_output: Any, data: Any, dp_group: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's `ppo_loss` (its actor's loss function) with our policy loss, and its KL-to-reference
    loss (`use_kl_loss`, `kl_loss_coef`, `kl_loss_type`) and entropy bonus (`entropy_coeff`) summed
    with the per-token `loss_weights` (0 off the trained tokens), per rollout as the policy loss is,
    where verl sums them unweighted."""
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    # backend.update asks for it (calculate_entropy)
    entropy = no_padding_2_padding(model_output["entropy"], data)
    dp = data["dp_size"]
    config.global_batch_info["dp_size"] = dp
    fields = ["response_mask", "rollout_log_probs", "advantages", "loss_weights"]
    fields += [k for k in ("old_log_probs", "ref_log_prob") if k in data]
    d = data.select(*fields).to_padded_tensor()
    mask = d["response_mask"].to(bool)
    n = mask.sum().clamp(min=1)
    # without old log-probs the step is one epoch over one mini-batch: this forward pass is
    # the old policy's
    if "old_log_probs" in d:
        old = d["old_log_probs"]
    else:
        old = log_prob.detach()
    # truncated IS weights
    tis = (old - d["rollout_log_probs"]).detach().exp().clamp(max=data["is_cap"]) * mask
    pg, pg_metrics = agl_policy_loss(
        old, log_prob, d["advantages"], mask, "token-sum", config, d["loss_weights"] * tis
    )
    metrics: dict[str, Any] = Metric.from_dict(pg_metrics, aggregation=AggregationType.MEAN)
    metrics["actor/pg_loss"] = Metric(value=pg, aggregation=AggregationType.SUM)
    metrics["actor/tis_mean"] = Metric(value=(tis.sum() / n).item(), aggregation="mean")
    metrics["actor/tis_max"] = Metric(value=tis.max().item(), aggregation="max")
    weights = d["loss_weights"] * mask
    extra = 0.0
    if config.get("use_kl_loss"):  # partial sums: verl adds them over micro-batches
        kl_type = config.kl_loss_type
        penalty = kl_penalty(log_prob, d["ref_log_prob"], kl_type)  # type: ignore[arg-type]
        kl = (penalty * weights).sum()
        extra += config.kl_loss_coef * kl
        metrics["actor/kl_loss"] = Metric(value=kl.detach().item(), aggregation=AggregationType.SUM)
    if config.get("entropy_coeff"):
        bonus = (entropy * weights).sum()
        extra -= config.entropy_coeff * bonus
        metrics["actor/entropy_loss"] = Metric(
            value=bonus.detach().item(), aggregation=AggregationType.SUM
        )
    # the policy's entropy at the trained tokens (mean)
    metrics["actor/entropy"] = Metric(
        value=((entropy.detach() * mask).sum() / n).item(), aggregation="mean"
    )
    return pg + extra * dp, metrics


def to_dataproto(batch: Batch, *, temperature: float = 1.0) -> DataProto:
    """Samples as verl rows: prompt = the tokens before the first trained one (left-padded),
    response = the rest (right-padded), padding 0, `response_mask` = its trained tokens. Per
    response token: `rollout_log_probs` (behaviour), `advantages`, `loss_weights`; per sample:
    `minibatch`."""
    starts = batch.offsets[:-1]
    ends = batch.offsets[1:]
    spans = zip(starts.tolist(), ends.tolist(), strict=True)
    first = np.array([first_trained(batch.loss_mask, s, e) for s, e in spans], np.int64)
    P = int((first - starts).max(initial=1))
    R = int((ends - first).max(initial=1))
    # the token in each cell: a prompt ends at `first` (left-padded), its response starts there
    # (right-padded)
    at = first[:, None] + np.arange(-P, R)
    real = (at >= starts[:, None]) & (at < ends[:, None])
    at = at.clip(0, len(batch.input_ids) - 1)

    def cells(values: np.ndarray, cols: slice = slice(P, None)) -> torch.Tensor:
        return torch.from_numpy(np.where(real[:, cols], values[at[:, cols]], 0))

    input_ids = cells(batch.input_ids, slice(None)).long()
    attention = torch.from_numpy(real.astype(np.int64))
    tensors = {
        "prompts": input_ids[:, :P].contiguous(),
        "responses": input_ids[:, P:].contiguous(),
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": torch.clip(torch.cumsum(attention, dim=-1) - 1, min=0),
        "response_mask": cells(batch.loss_mask).long(),
        "rollout_log_probs": cells(batch.logprobs),
        "advantages": cells(batch.advantages),
        "loss_weights": cells(batch.loss_weights),
        "minibatch": torch.from_numpy(batch.sample_minibatch.astype(np.int64)),
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": temperature})


def first_trained(loss_mask: np.ndarray, start: int, end: int) -> int:
    """The index of the first trained token in `start:end`, or `end` if none is trained."""
    if not loss_mask[start:end].any():
        return end
    return start + int(np.argmax(loss_mask[start:end]))
