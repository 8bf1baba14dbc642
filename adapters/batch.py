"""Rollouts and their calls -> one training batch (DESIGN.md sections 6.3-6.5).

Owns the pipeline around the merge and the estimators: input checks, infra exclusion, staleness, missing rewards,
rollout-level loss weights (verl's sample-level modes kept for comparison), whole-rollout mini-batches, packing
over data-parallel ranks with zero-weight padding, metrics. The batch is flat numpy per token (`offsets` marks
samples); padding rows, truncated importance weights and verl's `DataProto` are the trainer's. No verl, no store.
"""

import heapq
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from adapters.advantage import rollout_advantages
from adapters.merge import MISMATCHES, Draft, Segment, merge
from adapters.settings import AdapterError, AdapterSettings
from agl.types import Call, FailureKind, Rollout, Status

# Counted in every batch's metrics, zero or not.
COUNTS = [
    *[
        "rollouts_excluded_infra",
        "rollouts_dropped_stale",
        "missing_reward_filled",
        "rollouts_without_tokens",
    ],
    *["groups", "groups_degenerate", "rollouts_dropped_degenerate"],
    *[
        "calls",
        "calls_untrained",
        "calls_temperature_mismatch",
        "calls_merged",
        "calls_shaped",
        "overlong_samples",
    ],
    *[f"mismatch_{m}" for m in MISMATCHES],
]


@dataclass(frozen=True)
class Batch:
    """Samples ordered by (mini-batch, rank); sample i is tokens `offsets[i]:offsets[i + 1]`. One optimizer step per
    mini-batch, whose loss `sum(loss_weights * token_loss)` (verl's `token-sum`) is the same however samples split."""

    input_ids: np.ndarray  # int32, per token
    loss_mask: np.ndarray  # bool, per token: sampled by the policy and trained
    advantages: np.ndarray  # float32, per token; 0 where loss_mask is False
    loss_weights: np.ndarray  # float32, per token; the loss is sum(weight * token loss)
    logprobs: np.ndarray  # float32, per token: behaviour logprobs; 0 where loss_mask is False
    offsets: np.ndarray  # int64, n_samples + 1
    sample_rollout: np.ndarray  # int32, per sample: index into rollout_ids; -1 for padding
    sample_rank: np.ndarray  # int32, per sample: data-parallel rank
    sample_minibatch: np.ndarray  # int32, per sample
    rollout_ids: tuple[str, ...]  # the trained rollouts
    rollout_advantages: np.ndarray  # float64, per rollout (at the sample level: its samples' mean)
    sample_calls: tuple[tuple[int, ...], ...]  # per sample: seqs of the calls merged into it
    metrics: dict[str, float]

    @property
    def n_samples(self) -> int:
        return len(self.offsets) - 1


def balanced_partitions(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Indices in `k` parts of equal count with balanced length sums (each sorted): Karmarkar-Karp largest
    differencing, as verl's `get_seqlen_balanced_partitions(lengths, k, equal_size=True)`; `k` divides the count."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    heap: list[tuple[int, int, int, list[tuple[int, list[int]]]]] = []
    ties = itertools.count()  # equal spreads: the older partition first

    def push(sets: list[tuple[int, list[int]]]) -> None:
        sets.sort(reverse=True)
        heapq.heappush(heap, (sets[-1][0] - sets[0][0], -sets[0][0], next(ties), sets))

    for start in range(0, len(order), k):
        push([(lengths[i], [i]) for i in order[start : start + k]])
    while len(heap) > 1:
        a, b = heapq.heappop(heap)[3], heapq.heappop(heap)[3]
        push([(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b), strict=True)])
    return [sorted(items) for _, items in heap[0][3]] if heap else [[] for _ in range(k)]


def build_batch(
    rollouts: Sequence[Rollout],
    calls: Mapping[str, Sequence[Call]],
    settings: AdapterSettings | None = None,
    *,
    version: int | None = None,
    intermediate: Mapping[str, Mapping[int, float]] | None = None,
) -> Batch:
    """The training batch of finished rollouts (`calls` as `Store.calls_for` returns them), trained at `version`;
    `intermediate`: per rollout, per call seq, the sum of the call's intermediate rewards."""
    s = settings or AdapterSettings()
    ids = {r.id for r in rollouts}
    if len(ids) != len(rollouts):
        raise AdapterError("the same rollout is listed twice")
    if unknown := [rid for rid in calls if rid not in ids]:
        first = calls[unknown[0]][0].seq if calls[unknown[0]] else None
        raise AdapterError(f"calls reference unknown rollout {unknown[0]} (call seq {first})")
    stats: Counter[str] = Counter(dict.fromkeys(COUNTS, 0))
    valid: list[tuple[Rollout, float]] = []
    for r in rollouts:
        if not r.status.terminal:
            raise AdapterError(f"rollout {r.id} is {r.status.value}, not finished")
        if (
            r.failure_kind is FailureKind.INFRA or r.status is Status.CANCELLED
        ):  # not the policy's outcome
            stats["rollouts_excluded_infra"] += 1
            continue
        if s.max_staleness is not None:
            if version is None:
                raise ValueError("max_staleness needs the trained version")
            oldest = min((c.model_version for c in calls.get(r.id, ())), default=version)
            if version - oldest > s.max_staleness:
                stats["rollouts_dropped_stale"] += 1
                continue
        reward = r.reward
        if reward is None:
            if s.missing_reward is None:
                raise AdapterError(f"rollout {r.id} has no reward")
            reward = s.missing_reward
            stats["missing_reward_filled"] += 1
        valid.append((r, reward))

    merged = [
        (r, reward, merge(r.id, calls.get(r.id, ()), s, stats, r.attempt)) for r, reward in valid
    ]
    trained: list[tuple[str, list[float], list[Draft]]] = []
    for (r, _, drafts), advantages in zip(merged, _advantages(merged, s, stats), strict=True):
        if advantages is not None and any(d.trained for d in drafts):
            trained.append((r.id, advantages, drafts))
        elif advantages is not None:
            stats["rollouts_without_tokens"] += 1
    return _assemble(trained, s, stats, len(rollouts), intermediate or {})


def _advantages(
    merged: list[tuple[Rollout, float, list[Draft]]], s: AdapterSettings, stats: Counter[str]
) -> list[list[float] | None]:
    """Per rollout, its samples' advantages, or None when it is not trained. Group members are the rollouts
    (`advantage_level: rollout`) or their trained samples (`sample`: k samples, k members, as transition-level GRPO)."""
    if s.advantage_level == "rollout":
        owners = list(range(len(merged)))
    else:
        owners = [i for i, (_, _, drafts) in enumerate(merged) for d in drafts if d.trained]
    rewards = np.array([merged[i][1] for i in owners], dtype=np.float64)
    adv, kept = rollout_advantages(rewards, [merged[i][0].group for i in owners], s, stats)
    if s.advantage_level == "rollout":
        return [
            [a] * len(m[2]) if k else None
            for m, a, k in zip(merged, adv.tolist(), kept, strict=True)
        ]
    out: list[list[float] | None] = []
    members = iter(zip(adv.tolist(), kept, strict=True))
    for _, _, drafts in merged:
        sample = [next(members) if d.trained else (0.0, False) for d in drafts]
        out.append([a if k else 0.0 for a, k in sample] if any(k for _, k in sample) else None)
    return out


def _weights(rollouts: list[list[Draft]], mode: str) -> list[list[float]]:
    """The loss weight of each sampled token of each sample of a mini-batch's rollouts."""
    tokens = [sum(d.trained for d in ds) for ds in rollouts]
    if mode == "rollout":
        return [
            [1.0 / (len(rollouts) * t)] * len(ds) for ds, t in zip(rollouts, tokens, strict=True)
        ]
    if mode == "token-mean":
        return [[1.0 / sum(tokens)] * len(ds) for ds in rollouts]
    used = sum(1 for ds in rollouts for d in ds if d.trained)
    return [[1.0 / (used * d.trained) if d.trained else 0.0 for d in ds] for ds in rollouts]


def _assemble(
    trained: list[tuple[str, list[float], list[Draft]]],
    s: AdapterSettings,
    stats: Counter[str],
    n_in: int,
    intermediate: Mapping[str, Mapping[int, float]],
) -> Batch:
    n = len(trained)
    n_mb = -(-n // s.minibatch_rollouts) if s.minibatch_rollouts and n else 1
    pad = Draft("", [Segment(np.array([s.pad_token_id], dtype=np.int32), None, -1)], length=1)
    # One entry per sample, in output order: (rollout index or -1, draft, weight, advantage, mini-batch, rank).
    order: list[tuple[int, Draft, float, float, int, int]] = []
    for mb in range(n_mb):
        members = [
            i for i in range(n) if i * n_mb // n == mb
        ]  # consecutive rollouts, as many (within one) per mb
        weights = _weights([trained[i][2] for i in members], s.loss_mode)
        samples = [
            (i, d, w, a)
            for i, ws in zip(members, weights, strict=True)
            for d, w, a in zip(trained[i][2], ws, trained[i][1], strict=True)
        ]
        samples += [(-1, pad, 0.0, 0.0)] * (-len(samples) % s.dp_size)
        for rank, part in enumerate(
            balanced_partitions([d.length for _, d, _, _ in samples], s.dp_size)
        ):
            order.extend((*samples[j], mb, rank) for j in part)

    drafts = [o[1] for o in order]
    offsets = np.cumsum([0, *(d.length for d in drafts)], dtype=np.int64)
    total = int(offsets[-1])
    # Preallocate and fill slices: one pass over the output, no per-token Python work.
    input_ids = np.empty(total, np.int32)
    loss_mask, logprobs = np.zeros(total, bool), np.zeros(total, np.float32)
    advantages, loss_weights = np.zeros(total, np.float32), np.zeros(total, np.float32)
    for (i, draft, w, a, _, _), start in zip(order, offsets.tolist(), strict=False):
        shaped = intermediate.get(trained[i][0], {}) if i >= 0 and s.intermediate_coef else {}
        for g in draft.segments:
            end = start + len(g.ids)
            input_ids[start:end] = g.ids
            if g.logprobs is not None:  # sampled (padding has none)
                advantages[start:end] = a + s.intermediate_coef * shaped.get(g.seq, 0.0)
                stats["calls_shaped"] += g.seq in shaped
                logprobs[start:end] = g.logprobs
                loss_mask[start:end] = True
                loss_weights[start:end] = w
            start = end

    real = sum(1 for o in order if o[0] >= 0)
    trained_calls = stats["calls"] - stats["calls_untrained"] - stats["calls_temperature_mismatch"]
    metrics = dict(stats) | {
        "rollouts": n_in,
        "rollouts_trained": n,
        "samples": real,
        "padding_samples": len(order) - real,
        "samples_per_rollout": real / n if n else 0.0,
        "merge_rate": stats["calls_merged"] / trained_calls if trained_calls else 0.0,
        "degenerate_rate": stats["groups_degenerate"] / stats["groups"] if stats["groups"] else 0.0,
        "tokens": total,
        "trained_tokens": int(loss_mask.sum()),
    }
    return Batch(
        input_ids=input_ids,
        loss_mask=loss_mask,
        advantages=advantages,
        loss_weights=loss_weights,
        logprobs=logprobs,
        offsets=offsets,
        sample_rollout=np.array([o[0] for o in order], dtype=np.int32),
        sample_rank=np.array([o[5] for o in order], dtype=np.int32),
        sample_minibatch=np.array([o[4] for o in order], dtype=np.int32),
        rollout_ids=tuple(t[0] for t in trained),
        rollout_advantages=np.array([np.mean(t[1]) for t in trained], dtype=np.float64),
        sample_calls=tuple(
            tuple(dict.fromkeys(g.seq for g in d.segments if g.seq >= 0)) for d in drafts
        ),
        metrics=metrics,
    )
