"""Rollout-level advantages: equal to verl's outcome estimators on per-rollout rewards; groups and
exclusions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import ESTIMATORS, AdapterSettings, build_batch
from agl.types import FailureKind, Status
from tests.adapters.factory import call, chain, rollout

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

VERL = {
    "grpo": lambda scores, mask, index, norm: core_algos.compute_grpo_outcome_advantage(
        scores, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm
    ),
    "rloo": lambda scores, mask, index, norm: core_algos.compute_rloo_outcome_advantage(
        scores, mask, index
    ),
    "reinforce_pp": lambda scores, mask, index, norm: (
        core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(scores, mask, index)
    ),
}

groups_of_rewards = st.lists(
    st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0, 3.0]), min_size=1, max_size=5),
    min_size=1,
    max_size=4,
)


@settings(max_examples=25, deadline=None)
@given(groups=groups_of_rewards, estimator=st.sampled_from(sorted(VERL)), norm=st.booleans())
def test_equal_to_verl_on_per_rollout_rewards(
    groups: list[list[float]], estimator: str, norm: bool
) -> None:
    rollouts, calls, rewards, index = [], {}, [], []
    for g, rewards_of_group in enumerate(groups):
        for k, reward in enumerate(rewards_of_group):
            rid = f"g{g}r{k}"
            rollouts.append(rollout(rid, f"task{g}", reward))
            # One trained token each, so verl's token-level whitening (REINFORCE++) sees each rollout once.
            calls[rid] = [call(rid, 0, [1, 2], [3])]
            rewards.append(reward)
            index.append(f"task{g}")
    s = AdapterSettings(estimator=estimator, norm_by_std=norm, drop_degenerate=False)
    batch = build_batch(rollouts, calls, s)
    if estimator == "reinforce_pp" and len(rewards) < 2:
        return  # verl's unbiased whitening divides by zero on one token
    scores = torch.tensor(rewards, dtype=torch.float32)[:, None]
    expected, _ = VERL[estimator](
        scores, torch.ones_like(scores), np.array(index, dtype=object), norm
    )
    got = dict(zip(batch.rollout_ids, batch.rollout_advantages, strict=True))
    assert [got[r.id] for r in rollouts] == pytest.approx(
        expected[:, 0].tolist(), abs=2e-5, rel=1e-5
    )
    # Every trained token carries its rollout's advantage.
    token_rollout = np.repeat(batch.sample_rollout, np.diff(batch.offsets))
    mask = batch.loss_mask
    assert batch.advantages[mask] == pytest.approx(
        batch.rollout_advantages[token_rollout[mask]], abs=1e-6
    )
    assert not batch.advantages[~mask].any()


def test_a_rollout_split_into_many_samples_counts_once() -> None:
    split = [call("a", k, [100 + k], [k]) for k in range(5)]  # five unrelated prompts: five samples
    rollouts = [rollout("a", reward=1.0), rollout("b", reward=0.0), rollout("c", reward=0.0)]
    calls = {"a": split, "b": [call("b", 0, [1], [2])], "c": [call("c", 0, [1], [3])]}
    batch = build_batch(rollouts, calls)
    assert batch.metrics["samples"] == 7
    scores = torch.tensor([[1.0], [0.0], [0.0]])
    expected, _ = core_algos.compute_grpo_outcome_advantage(
        scores, torch.ones_like(scores), np.array(["g"] * 3)
    )
    assert batch.rollout_advantages.tolist() == pytest.approx(expected[:, 0].tolist(), abs=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_sample_level_makes_each_sample_a_group_member(estimator: str) -> None:
    """`advantage_level: sample`: a rollout split into k samples is k members of its group, and the
    advantages are verl's over those samples, each scored with its rollout's reward."""
    split = lambda rid, k: [call(rid, j, [100 + j], [j]) for j in range(k)]  # noqa: E731  (k unrelated prompts)
    rollouts = [rollout("a", "g", 1.0), rollout("b", "g", 0.0), rollout("c", "g", 0.0)]
    rollouts += [rollout("d", "h", 1.0), rollout("e", "h", 0.0)]
    calls = {
        "a": split("a", 3),
        "b": split("b", 1),
        "c": split("c", 2),
        "d": split("d", 2),
        "e": split("e", 1),
    }
    batch = build_batch(
        rollouts, calls, AdapterSettings(estimator=estimator, advantage_level="sample")
    )
    members = [(r.id, j, r.group, r.reward) for r in rollouts for j in range(len(calls[r.id]))]
    assert batch.metrics["samples"] == len(members) == 9
    scores = torch.tensor([[reward] for *_, reward in members])
    index = np.array([group for _, _, group, _ in members], dtype=object)
    expected, _ = VERL[estimator](scores, torch.ones_like(scores), index, True)
    got = {}
    for i in range(batch.n_samples):
        t = slice(int(batch.offsets[i]), int(batch.offsets[i + 1]))
        (seq,) = batch.sample_calls[i]
        got[batch.rollout_ids[batch.sample_rollout[i]], seq] = batch.advantages[t][
            batch.loss_mask[t]
        ][0]
    assert [got[rid, j] for rid, j, *_ in members] == pytest.approx(
        expected[:, 0].tolist(), abs=1e-5
    )
    # The rollout level on the same batch: each rollout once, whatever its samples.
    by_rollout = build_batch(rollouts, calls, AdapterSettings(estimator=estimator))
    scores = torch.tensor([[r.reward] for r in rollouts])
    index = np.array([r.group for r in rollouts], dtype=object)
    expected, _ = VERL[estimator](scores, torch.ones_like(scores), index, True)
    assert by_rollout.rollout_advantages.tolist() == pytest.approx(
        expected[:, 0].tolist(), abs=1e-5
    )


def test_infra_failures_and_cancelled_rollouts_are_not_in_the_group() -> None:
    rollouts = [
        rollout("a", reward=1.0),
        rollout("b", reward=0.0, status=Status.FAILED, failure=FailureKind.TASK),
        rollout("x", reward=None, status=Status.FAILED, failure=FailureKind.INFRA),
        rollout("y", reward=5.0, status=Status.CANCELLED),
    ]
    calls = {rid: [call(rid, 0, [1], [2])] for rid in "abxy"}
    batch = build_batch(rollouts, calls, AdapterSettings(estimator="rloo"))
    assert batch.rollout_ids == ("a", "b")
    assert batch.rollout_advantages.tolist() == pytest.approx([1.0, -1.0])
    assert batch.metrics["rollouts_infra_or_cancelled"] == 2


@pytest.mark.parametrize("drop", [True, False])
def test_degenerate_groups_are_counted_and_dropped_or_kept(drop: bool) -> None:
    rollouts = [rollout("a1", "a", 1.0), rollout("a2", "a", 0.0)]  # a real group
    rollouts += [rollout("s1", "single", 1.0)]  # one valid rollout left
    rollouts += [rollout("e1", "equal", 1.0), rollout("e2", "equal", 1.0)]  # zero variance
    rollouts += [
        rollout("e3", "infra", 1.0),
        rollout("e4", "infra", None, failure=FailureKind.INFRA),
    ]
    calls = {r.id: chain(r.id, [([1], [2])]) for r in rollouts}
    batch = build_batch(rollouts, calls, AdapterSettings(drop_degenerate=drop))
    assert batch.metrics["groups"] == 4
    assert batch.metrics["groups_degenerate"] == 3
    if drop:
        assert batch.rollout_ids == ("a1", "a2")
        assert batch.metrics["rollouts_dropped_degenerate"] == 4
    else:
        assert set(batch.rollout_ids) == {"a1", "a2", "s1", "e1", "e2", "e3"}
        adv = dict(zip(batch.rollout_ids, batch.rollout_advantages, strict=True))
        assert adv["e1"] == adv["e2"] == 0.0
        assert adv["s1"] == pytest.approx(
            1.0 / (1.0 + 1e-6)
        )  # verl: mean 0, std 1 for a lone rollout


def test_estimators_share_one_contract() -> None:
    rewards = np.array([1.0, 0.0, 0.5, 2.0, 2.5])
    group = np.array([0, 0, 0, 1, 1])
    for name, estimator in ESTIMATORS.items():
        adv = estimator(rewards, group, AdapterSettings())
        assert adv.shape == rewards.shape and np.isfinite(adv).all(), name
        # A constant added to every reward of a group changes nothing (a baseline is subtracted).
        assert estimator(rewards + 3.0 * group, group, AdapterSettings()) == pytest.approx(adv), (
            name
        )
