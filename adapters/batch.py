"""Rollouts and their calls -> one training batch.

- The rules are in docs/architecture.md, "Loss weight per rollout", "Packing" and "Staleness".
- Owns the pipeline around the merge and the estimators: input checks, the rollouts that count
  (`Rollout.counts`), staleness, missing rewards, rollout-level loss weights (verl's sample-level
  modes kept for comparison), whole-rollout mini-batches, packing over data-parallel ranks with
  zero-weight padding, metrics.
- The batch is flat numpy per token (`offsets` marks samples).
- Padding rows, truncated importance weights and verl's `DataProto` are the trainer's; no verl, no
  store here.
"""

import heapq
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from adapters.advantage import rollout_advantages
from adapters.merge import BREAKS, Draft, Segment, merge
from adapters.settings import AdapterError, AdapterSettings
from agl.types import Call, Rollout

# Counted in every batch's metrics, zero or not.
COUNTS = [
    # rollouts
    "rollouts_infra_or_cancelled",
    "rollouts_dropped_stale",
    "missing_reward_filled",
    "rollouts_without_tokens",
    # groups
    "groups",
    "groups_degenerate",
    "rollouts_dropped_degenerate",
    # calls and samples
    "calls",
    "calls_untrained",
    "calls_temperature_mismatch",
    "calls_merged",
    "calls_shaped",
    "overlong_samples",
    *[f"mismatch_{kind}" for kind in BREAKS],
]


@dataclass(frozen=True)
class Batch:
    """Samples ordered by (mini-batch, rank); sample i is tokens `offsets[i]:offsets[i + 1]`. One
    optimizer step per mini-batch, whose loss `sum(loss_weights * token_loss)` (verl's `token-sum`)
    is the same however samples split."""

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


class Merged(NamedTuple):
    """A valid rollout, its reward (filled in if it had none) and its samples."""

    rollout: Rollout
    reward: float
    drafts: list[Draft]


class Trained(NamedTuple):
    """A trained rollout: its samples and each one's advantage."""

    rollout_id: str
    advantages: list[float]
    drafts: list[Draft]


class Sample(NamedTuple):
    """A sample of a mini-batch: its rollout (an index into the trained rollouts; -1 for padding),
    its draft, its loss weight and advantage, and the intermediate rewards that shape it (per call
    seq)."""

    rollout: int
    draft: Draft
    weight: float
    advantage: float
    shaping: Mapping[int, float]


class Placed(NamedTuple):
    """A sample where it is trained: its mini-batch and its data-parallel rank."""

    sample: Sample
    minibatch: int
    rank: int


class Tokens(NamedTuple):
    """The batch's per-token arrays."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    advantages: np.ndarray
    loss_weights: np.ndarray
    logprobs: np.ndarray


def balanced_partitions(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Indices in `k` parts of equal count with balanced length sums (each sorted): Karmarkar-Karp
    largest differencing, as verl's `get_seqlen_balanced_partitions(lengths, k, equal_size=True)`;
    `k` divides the count."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    heap: list[tuple[int, int, int, list[tuple[int, list[int]]]]] = []
    # equal spreads: the older partition first
    ties = itertools.count()

    def push(sets: list[tuple[int, list[int]]]) -> None:
        sets.sort(reverse=True)
        heapq.heappush(heap, (sets[-1][0] - sets[0][0], -sets[0][0], next(ties), sets))

    for start in range(0, len(order), k):
        push([(lengths[i], [i]) for i in order[start : start + k]])
    while len(heap) > 1:
        a = heapq.heappop(heap)[3]
        b = heapq.heappop(heap)[3]
        push([(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b), strict=True)])
    if not heap:
        return [[] for _ in range(k)]
    return [sorted(items) for _, items in heap[0][3]]


def build_batch(
    rollouts: Sequence[Rollout],
    calls: Mapping[str, Sequence[Call]],
    settings: AdapterSettings | None = None,
    *,
    version: int | None = None,
    intermediate: Mapping[str, Mapping[int, float]] | None = None,
) -> Batch:
    """The training batch of finished rollouts (`calls` as `Store.calls_for` returns them), trained
    at `version`; `intermediate`: per rollout, per call seq, the sum of the call's intermediate
    rewards."""
    s = settings or AdapterSettings()
    _check_input(rollouts, calls)
    stats: Counter[str] = Counter(dict.fromkeys(COUNTS, 0))
    merged: list[Merged] = []
    for r, reward in _valid(rollouts, calls, s, version, stats):
        drafts = merge(r.id, calls.get(r.id, ()), s, stats, r.attempt)
        merged.append(Merged(rollout=r, reward=reward, drafts=drafts))
    trained: list[Trained] = []
    for m, advantages in zip(merged, _advantages(merged, s, stats), strict=True):
        if advantages is None:
            continue
        if any(d.trained for d in m.drafts):
            trained.append(Trained(rollout_id=m.rollout.id, advantages=advantages, drafts=m.drafts))
        else:
            stats["rollouts_without_tokens"] += 1
    return _assemble(trained, s, stats, len(rollouts), intermediate or {})


def _check_input(rollouts: Sequence[Rollout], calls: Mapping[str, Sequence[Call]]) -> None:
    """Each rollout is listed once, and every call belongs to one of them."""
    ids = {r.id for r in rollouts}
    if len(ids) != len(rollouts):
        raise AdapterError("the same rollout is listed twice")
    unknown = [rid for rid in calls if rid not in ids]
    if unknown:
        first = None
        if calls[unknown[0]]:
            first = calls[unknown[0]][0].seq
        raise AdapterError(f"calls reference unknown rollout {unknown[0]} (call seq {first})")


def _valid(
    rollouts: Sequence[Rollout],
    calls: Mapping[str, Sequence[Call]],
    s: AdapterSettings,
    version: int | None,
    stats: Counter[str],
) -> list[tuple[Rollout, float]]:
    """The rollouts whose outcome is the policy's and recent enough, with their rewards; the others
    are counted."""
    valid: list[tuple[Rollout, float]] = []
    for r in rollouts:
        if not r.status.terminal:
            raise AdapterError(f"rollout {r.id} is {r.status.value}, not finished")
        if not r.counts:
            # not the policy's outcome
            stats["rollouts_infra_or_cancelled"] += 1
        elif _stale(calls.get(r.id, ()), s, version):
            stats["rollouts_dropped_stale"] += 1
        else:
            valid.append((r, _reward(r, s, stats)))
    return valid


def _stale(calls: Sequence[Call], s: AdapterSettings, version: int | None) -> bool:
    """Whether a rollout's oldest call is more than `max_staleness` versions behind `version`."""
    if s.max_staleness is None:
        return False
    if version is None:
        raise ValueError("max_staleness needs the trained version")
    oldest = min((c.model_version for c in calls), default=version)
    return version - oldest > s.max_staleness


def _reward(r: Rollout, s: AdapterSettings, stats: Counter[str]) -> float:
    """The rollout's reward, or `missing_reward` (counted) when it ended without one."""
    if r.reward is not None:
        return r.reward
    if s.missing_reward is None:
        raise AdapterError(f"rollout {r.id} has no reward")
    stats["missing_reward_filled"] += 1
    return s.missing_reward


def _advantages(
    merged: list[Merged], s: AdapterSettings, stats: Counter[str]
) -> list[list[float] | None]:
    """Per rollout, its samples' advantages, or None when it is not trained. Group members are the
    rollouts (`advantage_level: rollout`) or their trained samples (`sample`: k samples, k members,
    as transition-level GRPO)."""
    if s.advantage_level == "rollout":
        owners = list(range(len(merged)))
    else:
        owners = [i for i, m in enumerate(merged) for d in m.drafts if d.trained]
    rewards = np.array([merged[i].reward for i in owners], dtype=np.float64)
    groups = [merged[i].rollout.group for i in owners]
    adv, kept = rollout_advantages(rewards, groups, s, stats)
    if s.advantage_level == "rollout":
        return [
            [a] * len(m.drafts) if k else None
            for m, a, k in zip(merged, adv.tolist(), kept, strict=True)
        ]
    out: list[list[float] | None] = []
    members = iter(zip(adv.tolist(), kept, strict=True))
    for m in merged:
        # an untrained sample is no member: advantage 0; a dropped member's advantage is 0
        sample = [next(members) if d.trained else (0.0, False) for d in m.drafts]
        if any(k for _, k in sample):
            out.append([a for a, _ in sample])
        else:
            out.append(None)
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


def _minibatches(n: int, s: AdapterSettings) -> list[list[int]]:
    """The trained rollouts of each mini-batch: consecutive, as many (within one) in each."""
    count = 1
    if s.minibatch_rollouts and n:
        count = -(-n // s.minibatch_rollouts)
    return [[i for i in range(n) if i * count // n == mb] for mb in range(count)]


def _samples(
    trained: list[Trained],
    members: list[int],
    s: AdapterSettings,
    intermediate: Mapping[str, Mapping[int, float]],
) -> list[Sample]:
    """A mini-batch's samples, with their loss weights, padded with zero-weight samples to a
    multiple of `dp_size`."""
    weights = _weights([trained[i].drafts for i in members], s.loss_mode)
    samples: list[Sample] = []
    for i, rollout_weights in zip(members, weights, strict=True):
        t = trained[i]
        shaping: Mapping[int, float] = {}
        if s.intermediate_coef:
            shaping = intermediate.get(t.rollout_id, {})
        for d, w, a in zip(t.drafts, rollout_weights, t.advantages, strict=True):
            samples.append(Sample(rollout=i, draft=d, weight=w, advantage=a, shaping=shaping))
    ids = np.array([s.pad_token_id], dtype=np.int32)
    pad = Draft(agent="", segments=[Segment(ids=ids, logprobs=None, seq=-1)], length=1)
    padding = Sample(rollout=-1, draft=pad, weight=0.0, advantage=0.0, shaping={})
    return samples + [padding] * (-len(samples) % s.dp_size)


def _place(
    trained: list[Trained], s: AdapterSettings, intermediate: Mapping[str, Mapping[int, float]]
) -> list[Placed]:
    """Every sample in the batch's order: by mini-batch, then by the rank it is packed on."""
    order: list[Placed] = []
    for mb, members in enumerate(_minibatches(len(trained), s)):
        samples = _samples(trained, members, s, intermediate)
        lengths = [sample.draft.length for sample in samples]
        for rank, part in enumerate(balanced_partitions(lengths, s.dp_size)):
            order += [Placed(sample=samples[j], minibatch=mb, rank=rank) for j in part]
    return order


def _fill(
    order: list[Placed], offsets: np.ndarray, s: AdapterSettings, stats: Counter[str]
) -> Tokens:
    """The per-token arrays, preallocated and filled slice by slice: one pass over the output, no
    per-token Python work."""
    total = int(offsets[-1])
    tokens = Tokens(
        input_ids=np.empty(total, np.int32),
        loss_mask=np.zeros(total, bool),
        advantages=np.zeros(total, np.float32),
        loss_weights=np.zeros(total, np.float32),
        logprobs=np.zeros(total, np.float32),
    )
    for placed, start in zip(order, offsets.tolist(), strict=False):
        sample = placed.sample
        for g in sample.draft.segments:
            end = start + len(g.ids)
            tokens.input_ids[start:end] = g.ids
            # sampled (padding has none)
            if g.logprobs is not None:
                shaped = sample.shaping.get(g.seq, 0.0)
                tokens.advantages[start:end] = sample.advantage + s.intermediate_coef * shaped
                stats["calls_shaped"] += g.seq in sample.shaping
                tokens.logprobs[start:end] = g.logprobs
                tokens.loss_mask[start:end] = True
                tokens.loss_weights[start:end] = sample.weight
            start = end
    return tokens


def _rate(part: float, whole: float) -> float:
    """part / whole, or 0 when there is no whole."""
    if not whole:
        return 0.0
    return part / whole


def _metrics(
    stats: Counter[str], n_in: int, n_trained: int, order: list[Placed], tokens: Tokens
) -> dict[str, float]:
    """The batch's counts and the rates derived from them."""
    real = sum(1 for placed in order if placed.sample.rollout >= 0)
    trained_calls = stats["calls"] - stats["calls_untrained"] - stats["calls_temperature_mismatch"]
    return dict(stats) | {
        "rollouts": n_in,
        "rollouts_trained": n_trained,
        "samples": real,
        "padding_samples": len(order) - real,
        "samples_per_rollout": _rate(real, n_trained),
        "merge_rate": _rate(stats["calls_merged"], trained_calls),
        "degenerate_rate": _rate(stats["groups_degenerate"], stats["groups"]),
        "tokens": len(tokens.input_ids),
        "trained_tokens": int(tokens.loss_mask.sum()),
    }


def _assemble(
    trained: list[Trained],
    s: AdapterSettings,
    stats: Counter[str],
    n_in: int,
    intermediate: Mapping[str, Mapping[int, float]],
) -> Batch:
    """The batch of the trained rollouts: samples placed, their tokens filled in, metrics."""
    order = _place(trained, s, intermediate)
    drafts = [placed.sample.draft for placed in order]
    offsets = np.cumsum([0, *(d.length for d in drafts)], dtype=np.int64)
    tokens = _fill(order, offsets, s, stats)
    return Batch(
        input_ids=tokens.input_ids,
        loss_mask=tokens.loss_mask,
        advantages=tokens.advantages,
        loss_weights=tokens.loss_weights,
        logprobs=tokens.logprobs,
        offsets=offsets,
        sample_rollout=np.array([placed.sample.rollout for placed in order], dtype=np.int32),
        sample_rank=np.array([placed.rank for placed in order], dtype=np.int32),
        sample_minibatch=np.array([placed.minibatch for placed in order], dtype=np.int32),
        rollout_ids=tuple(t.rollout_id for t in trained),
        rollout_advantages=np.array([np.mean(t.advantages) for t in trained], dtype=np.float64),
        sample_calls=tuple(
            tuple(dict.fromkeys(g.seq for g in d.segments if g.seq >= 0)) for d in drafts
        ),
        metrics=_metrics(stats, n_in, len(trained), order, tokens),
    )
