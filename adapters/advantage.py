"""One advantage per rollout, from rollout rewards grouped by task.

The rule is in docs/architecture.md, "Advantage per rollout".

Owns the estimators (GRPO, RLOO, REINFORCE++-baseline; a small protocol and a registry) and
degenerate groups. Each rollout counts once, however many samples it splits into: with one sample
each, they equal verl's `compute_*_outcome_advantage`. `adapters.batch` settles which rollouts are
valid before; tokens are never seen.
"""

from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from adapters.settings import AdapterError, AdapterSettings


class Estimator(Protocol):
    """An advantage estimator: rollout rewards and their groups in, one advantage each out."""

    def __call__(
        self, rewards: np.ndarray, group: np.ndarray, settings: AdapterSettings
    ) -> np.ndarray:
        """Advantages (float64) of rollouts with `rewards`; `group[i]` is rollout i's group number."""


def _group_stats(
    rewards: np.ndarray, group: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rollout: its group's size, mean and unbiased std (as torch.std); mean 0, std 1 for
    singletons."""
    count = np.bincount(group).astype(np.float64)
    mean = np.bincount(group, weights=rewards) / count
    sq = np.bincount(group, weights=(rewards - mean[group]) ** 2)
    std = np.sqrt(sq / np.maximum(count - 1, 1))
    single = count == 1
    mean[single] = 0.0
    std[single] = 1.0
    return count[group], mean[group], std[group]


def grpo(rewards: np.ndarray, group: np.ndarray, settings: AdapterSettings) -> np.ndarray:
    _, mean, std = _group_stats(rewards, group)
    adv = rewards - mean
    if settings.norm_by_std:
        return adv / (std + settings.eps)
    return adv


def rloo(rewards: np.ndarray, group: np.ndarray, settings: AdapterSettings) -> np.ndarray:
    n, mean, _ = _group_stats(rewards, group)
    return (rewards - mean) * (n / np.maximum(n - 1, 1))  # a singleton: mean 0, scale 1


def reinforce_pp(rewards: np.ndarray, group: np.ndarray, settings: AdapterSettings) -> np.ndarray:
    """REINFORCE++-baseline: subtract the group mean, then whiten over the batch's rollouts, each
    counted once (verl whitens over tokens, so long responses weigh more; the same when each
    rollout has one trained token)."""
    _, mean, _ = _group_stats(rewards, group)
    adv = rewards - mean
    if len(adv) < 2:
        return adv
    return (adv - adv.mean()) / np.sqrt(adv.var(ddof=1) + 1e-8)


# The estimators `AdapterSettings.estimator` names; another is added with `ESTIMATORS[name] = fn`.
ESTIMATORS: dict[str, Estimator] = {"grpo": grpo, "rloo": rloo, "reinforce_pp": reinforce_pp}


def rollout_advantages(
    rewards: np.ndarray, groups: Sequence[str], settings: AdapterSettings, stats: Counter[str]
) -> tuple[np.ndarray, np.ndarray]:
    """(advantage, kept) per rollout; the advantage is 0 where not kept. Degenerate groups are
    counted, and dropped if so set."""
    if settings.estimator not in ESTIMATORS:
        raise AdapterError(f"unknown estimator {settings.estimator!r}; known: {sorted(ESTIMATORS)}")
    names, group = np.unique(np.asarray(groups, dtype=object), return_inverse=True)
    # (group, reward) pairs
    distinct = np.unique(np.column_stack([group, rewards]), axis=0)
    # one reward value: no signal
    degenerate = np.bincount(distinct[:, 0].astype(np.intp), minlength=len(names)) < 2
    stats["groups"] += len(names)
    stats["groups_degenerate"] += int(degenerate.sum())
    kept = np.ones(len(rewards), dtype=bool)
    if settings.drop_degenerate:
        kept = ~degenerate[group]
    stats["rollouts_dropped_degenerate"] += int((~kept).sum())
    adv = np.zeros(len(rewards))
    if kept.any():
        _, kept_group = np.unique(group[kept], return_inverse=True)
        adv[kept] = ESTIMATORS[settings.estimator](rewards[kept], kept_group, settings)
    return adv, kept
