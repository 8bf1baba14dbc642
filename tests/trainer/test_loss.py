"""The policy loss through verl's registry, and the adapter's batch as verl's DataProto."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_policy_loss_fn

from adapters import AdapterSettings, build_batch
from tests.adapters.factory import call, chain, rollout
from trainer.config import LOSS
from trainer.loss import to_dataproto

torch.set_num_threads(1)
CONFIG = OmegaConf.create(
    {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
)


def reference(old, new, adv, mask, weights, low=0.2, high=0.28, c=3.0) -> float:
    """Dual-clip PPO, token by token, in plain Python."""
    total = 0.0
    for o, n, a, m, w in zip(old, new, adv, mask, weights, strict=True):
        if not m:
            continue
        ratio = math.exp(n - o)
        loss = max(-a * ratio, -a * min(max(ratio, 1 - low), 1 + high))
        if a < 0:
            loss = min(loss, -a * c)
        total += w * loss
    return total


@pytest.mark.parametrize("seed", range(5))
def test_registered_loss_equals_the_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    shape = (4, 9)
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3
    # ratios well outside the clip
    new = old + torch.randn(shape, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    mask = torch.rand(shape, generator=g) > 0.3
    weights = torch.rand(shape, generator=g, dtype=torch.float64) * mask
    new.requires_grad_(True)
    loss, metrics = get_policy_loss_fn(LOSS)(old, new, adv, mask, "token-sum", CONFIG, weights)
    want = reference(*(t.flatten().tolist() for t in (old, new.detach(), adv, mask, weights)))
    assert loss.item() == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert 0.0 <= metrics["actor/pg_clipfrac"] <= 1.0
    # the gradient is the reference's too (finite differences on one token with a live ratio)
    loss.backward()
    i, j = (mask & (weights > 0)).nonzero()[0].tolist()
    eps = 1e-6
    bumped = new.detach().clone()
    bumped[i, j] += eps
    numeric = (
        reference(*(t.flatten().tolist() for t in (old, bumped, adv, mask, weights))) - want
    ) / eps
    assert new.grad[i, j].item() == pytest.approx(numeric, rel=1e-4, abs=1e-6)


def test_loss_scales_with_verls_data_parallel_size() -> None:
    """verl averages gradients over ranks; the loss multiplies by dp_size so the sum stays exact."""
    old, new, adv = torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3)
    mask, w = torch.ones(1, 3, dtype=torch.bool), torch.full((1, 3), 0.5)
    config = OmegaConf.create(
        OmegaConf.to_container(CONFIG) | {"global_batch_info": {"dp_size": 4}}
    )
    loss, _ = get_policy_loss_fn(LOSS)(old, new, adv, mask, "token-sum", config, w)
    assert loss.item() == pytest.approx(-1.5 * 4)


def test_batch_becomes_a_dataproto_with_the_fields_verls_actor_reads() -> None:
    calls = {
        "a": chain(
            "a", [([1, 2, 3], [10, 11]), ([4, 5], [12, 13, 14])]
        ),  # one merged sample: prompt 3, rest 9
        "b": [call("b", 0, [1, 2, 3, 4, 5, 6], [20])],
    }
    rollouts = [rollout("a", reward=1.0), rollout("b", reward=0.0)]
    # padded with zero-weight samples to 4
    batch = build_batch(rollouts, calls, AdapterSettings(dp_size=4))
    data = to_dataproto(batch, temperature=0.7)
    b = data.batch
    assert data.meta_info["temperature"] == 0.7
    n, P = b["prompts"].shape
    R = b["responses"].shape[1]
    assert n == batch.n_samples == 4 and b["input_ids"].shape == (n, P + R)
    for key in ("responses", "response_mask", "rollout_log_probs", "advantages", "loss_weights"):
        assert b[key].shape == (n, R), key
    for i in range(n):
        tokens = batch.input_ids[batch.offsets[i] : batch.offsets[i + 1]]
        real = b["attention_mask"][i].bool()
        assert b["input_ids"][i][real].tolist() == tokens.tolist()
        positions = b["position_ids"][i][real]
        assert positions.tolist() == list(range(len(tokens)))
        trained = batch.loss_mask[batch.offsets[i] : batch.offsets[i + 1]]
        # the response starts at the first trained token; the mask marks exactly the trained ones
        assert b["response_mask"][i].sum().item() == trained.sum()
        got = b["responses"][i][b["response_mask"][i].bool()].tolist()
        assert got == tokens[trained].tolist()
        weights = batch.loss_weights[batch.offsets[i] : batch.offsets[i + 1]][trained]
        assert np.allclose(b["loss_weights"][i][b["response_mask"][i].bool()], weights)
    sample_a = next(i for i in range(n) if batch.sample_rollout[i] == batch.rollout_ids.index("a"))
    # tool/user tokens between the two calls are in the response but not trained
    assert b["response_mask"][sample_a].tolist()[:7] == [1, 1, 0, 0, 1, 1, 1]
    assert b["advantages"][sample_a][0].item() == pytest.approx(
        batch.rollout_advantages[batch.rollout_ids.index("a")]
    )
    assert b["minibatch"].tolist() == batch.sample_minibatch.tolist()


def test_the_dataproto_goes_into_verls_no_padding_layout() -> None:
    """What the GPU backend hands `compute_log_prob` / `update_actor`: verl's own conversion accepts it."""
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    calls = {
        "a": chain("a", [([1, 2, 3], [10, 11]), ([4, 5], [12, 13, 14])]),
        "b": [call("b", 0, [1, 2], [20])],
    }
    batch = build_batch(
        [rollout("a", reward=1.0), rollout("b", reward=0.0)], calls, AdapterSettings()
    )
    data = to_dataproto(batch, temperature=0.7)
    td = left_right_2_no_padding(data.to_tensordict())
    assert [len(t) for t in td["input_ids"].unbind()] == [
        int(n) for n in (batch.offsets[1:] - batch.offsets[:-1])
    ]
    assert td["temperature"] == 0.7  # meta_info rides along for the log-prob temperature
    flat = torch.nested.nested_tensor_from_jagged(
        torch.arange(len(batch.input_ids), dtype=torch.float32), offsets=td["input_ids"].offsets()
    )
    back = no_padding_2_padding(flat, td)  # verl's inverse gives the response block back
    assert back.shape == data.batch["responses"].shape
