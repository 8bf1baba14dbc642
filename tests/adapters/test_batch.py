"""The batch: exact rollout-level loss weighting however rollouts split, packing, staleness,
importance weights."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from adapters import AdapterSettings, Batch, build_batch
from adapters.batch import balanced_partitions
from agl.types import Call, FailureKind, Rollout
from tests.adapters.factory import call, chain, rollout

VOCAB = 12


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Rollout], dict[str, list[Call]]]:
    """Random groups of rollouts whose calls extend, rewrite or start chains of two agents."""
    rollouts, calls = [], {}
    tokens = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=5)
    for g in range(draw(st.integers(1, 3))):
        for k in range(draw(st.sampled_from([1, 2, 3, 4, 4]))):
            rid = f"g{g}r{k}"
            infra = draw(st.integers(0, 9)) == 0
            reward = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0, 3.0]))
            rollouts.append(
                rollout(rid, f"task{g}", reward, failure=FailureKind.INFRA if infra else None)
            )
            context: dict[str, list[int]] = {}
            calls[rid] = []
            for seq in range(draw(st.integers(0, 7))):
                agent = draw(st.sampled_from(["main", "main", "sub"]))
                how = draw(st.sampled_from(["extend", "extend", "extend", "rewrite", "fresh"]))
                old = context.get(agent, [])
                if how == "extend" or not old:
                    prompt = old + draw(tokens)
                elif how == "rewrite":
                    prompt = old[: draw(st.integers(0, len(old)))] + draw(tokens)
                else:
                    prompt = draw(tokens)
                response = draw(st.lists(st.integers(0, VOCAB - 1), max_size=4))
                logprobs = [-draw(st.floats(0.0625, 3.0, width=32)) for _ in response]
                calls[rid].append(call(rid, seq, prompt, response, logprobs, agent=agent))
                context[agent] = prompt + response
    return rollouts, calls


adapter_settings = st.builds(
    AdapterSettings,
    mode=st.sampled_from(["trajectory", "trajectory", "transition"]),
    max_length=st.integers(4, 80),
    trained_agents=st.sampled_from([None, frozenset({"main"})]),
    estimator=st.sampled_from(["grpo", "rloo", "reinforce_pp"]),
    drop_degenerate=st.booleans(),
    dp_size=st.integers(1, 4),
    minibatch_rollouts=st.sampled_from([None, 1, 2, 5]),
)


def token_logprobs(w: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
    """A toy policy: log p(token | previous token), so a token's logprob does not depend on how it
    was split."""
    x = torch.as_tensor(ids, dtype=torch.long)
    logits = torch.log_softmax(w[x[:-1]], dim=-1)
    return torch.cat([torch.zeros(1, dtype=w.dtype), logits.gather(1, x[1:, None])[:, 0]])


def token_loss(
    w: torch.Tensor, ids: np.ndarray, old: np.ndarray, adv: torch.Tensor
) -> torch.Tensor:
    """The vanilla policy-gradient token loss, -A * exp(logp - old)."""
    return -adv * torch.exp(token_logprobs(w, ids) - torch.as_tensor(old, dtype=w.dtype))


def expected_rollouts(
    rollouts: list[Rollout], calls: dict[str, list[Call]], s: AdapterSettings
) -> set[str]:
    """Which rollouts should be trained, worked out independently of the adapter."""
    valid = [r for r in rollouts if r.failure_kind is not FailureKind.INFRA]
    by_group = defaultdict(list)
    for r in valid:
        by_group[r.group].append(r.reward)
    keep = {
        r.id
        for r in valid
        if not s.drop_degenerate or (len(by_group[r.group]) > 1 and len(set(by_group[r.group])) > 1)
    }
    return {rid for rid in keep if trained_tokens(calls[rid], s)}


def trained_tokens(calls: list[Call], s: AdapterSettings) -> int:
    return sum(
        len(c.response_ids)
        for c in calls
        if s.trained_agents is None or c.agent in s.trained_agents
    )


def sample_slices(batch: Batch) -> list[slice]:
    return [
        slice(int(lo), int(hi))
        for lo, hi in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)
    ]


@settings(max_examples=60, deadline=None)
@given(world=worlds(), s=adapter_settings, seed=st.integers(0, 2**16))
def test_gradient_equals_the_rollout_level_reference_however_rollouts_split(world, s, seed) -> None:
    rollouts, calls = world
    batch = build_batch(rollouts, calls, s)
    assert set(batch.rollout_ids) == expected_rollouts(rollouts, calls, s)
    rng = np.random.default_rng(seed)
    w = torch.tensor(rng.normal(size=(VOCAB, VOCAB)), requires_grad=True)
    for mb in range(int(batch.sample_minibatch.max(initial=-1)) + 1):
        # Reference: (1/|M|) sum_r (1/T_r) sum_t l_t, straight from the calls, in one full batch.
        members = [
            batch.rollout_ids[r]
            for r in np.unique(batch.sample_rollout[batch.sample_minibatch == mb])
            if r >= 0
        ]
        reference = torch.zeros((), dtype=w.dtype)
        for rid in members:
            adv = torch.tensor(
                float(batch.rollout_advantages[batch.rollout_ids.index(rid)]), dtype=w.dtype
            )
            n_tokens = trained_tokens(calls[rid], s)
            for c in calls[rid]:
                if (s.trained_agents is None or c.agent in s.trained_agents) and len(
                    c.response_ids
                ):
                    ids = np.array(list(c.prompt_ids) + list(c.response_ids))
                    old = np.concatenate([np.zeros(len(c.prompt_ids)), np.array(c.logprobs)])
                    losses = token_loss(w, ids, old, adv)[len(c.prompt_ids) :]
                    reference = reference + losses.sum() / (len(members) * n_tokens)
        (want,) = torch.autograd.grad(reference, w)

        # Adapter: each rank's samples of this mini-batch in random micro-batches, losses summed (token-sum).
        got = torch.zeros_like(w)
        for rank in range(s.dp_size):
            mine = np.flatnonzero((batch.sample_minibatch == mb) & (batch.sample_rank == rank))
            assert len(mine) == len(np.flatnonzero(batch.sample_minibatch == mb)) // s.dp_size
            micro = rng.integers(0, 3, size=len(mine))
            for m in range(3):
                loss = torch.zeros((), dtype=w.dtype)
                for j in mine[micro == m]:
                    sl = sample_slices(batch)[j]
                    adv = torch.as_tensor(batch.advantages[sl], dtype=w.dtype)
                    per_token = token_loss(w, batch.input_ids[sl], batch.logprobs[sl], adv)
                    loss = (
                        loss
                        + (torch.as_tensor(batch.loss_weights[sl], dtype=w.dtype) * per_token).sum()
                    )
                if loss.requires_grad:
                    got += torch.autograd.grad(loss, w)[0]
        assert torch.allclose(got, want, atol=1e-6, rtol=0), (got - want).abs().max()


@settings(max_examples=40, deadline=None)
@given(world=worlds(), s=adapter_settings)
def test_packing_keeps_every_trained_token_and_rollout_weight_is_split_invariant(world, s) -> None:
    rollouts, calls = world
    batch = build_batch(rollouts, calls, s)
    token_rollout = np.repeat(batch.sample_rollout, np.diff(batch.offsets))
    rollout_mb = [
        np.unique(batch.sample_minibatch[batch.sample_rollout == r])
        for r in range(len(batch.rollout_ids))
    ]
    assert all(len(m) == 1 for m in rollout_mb)  # all samples of a rollout are in one mini-batch
    for r, rid in enumerate(batch.rollout_ids):
        mine = token_rollout == r
        # Every trained response token, with its recorded logprob, is in the batch exactly once.
        trained = [c for c in calls[rid] if s.trained_agents is None or c.agent in s.trained_agents]
        want = sorted(float(x) for c in trained for x in c.logprobs)
        assert sorted(batch.logprobs[mine & batch.loss_mask].tolist()) == want
        merged = [
            seq for j in np.flatnonzero(batch.sample_rollout == r) for seq in batch.sample_calls[j]
        ]
        assert sorted(merged) == [c.seq for c in trained]
        # Its total weight is 1/|M|, however many samples it became.
        size = sum(m[0] == rollout_mb[r][0] for m in rollout_mb)
        assert batch.loss_weights[mine].sum(dtype=np.float64) == pytest.approx(1.0 / size, rel=1e-6)
    # Padding is all zero-weight, never trained.
    real = batch.sample_rollout >= 0
    assert batch.metrics["samples"] == real.sum()
    pad = token_rollout < 0
    assert not batch.loss_weights[pad].any() and not batch.loss_mask[pad].any()
    assert not batch.loss_weights[~batch.loss_mask].any()
    # A batch splits into the data-parallel ranks evenly.
    for mb in np.unique(batch.sample_minibatch):
        counts = np.bincount(batch.sample_rank[batch.sample_minibatch == mb], minlength=s.dp_size)
        assert (counts == counts[0]).all() and len(counts) == s.dp_size


@settings(max_examples=30, deadline=None)
@given(world=worlds(), k=st.integers(2, 3))
def test_k_minibatches_average_to_the_one_minibatch_gradient(world, k) -> None:
    """With learning rate 0 between its k steps (so every step's gradient is taken at the same weights), the
    mean of the k mini-batch gradients is the one-mini-batch gradient: each token's weight, summed over the
    mini-batches and divided by k, is its weight in one mini-batch. Holds when k divides the rollouts."""
    rollouts, calls = world
    one = build_batch(rollouts, calls, AdapterSettings())
    n = len(one.rollout_ids)
    assume(n > 0 and n % k == 0)
    split = build_batch(rollouts, calls, AdapterSettings(minibatch_rollouts=n // k))
    assert int(split.sample_minibatch.max()) + 1 == k and split.rollout_ids == one.rollout_ids

    def per_rollout_token(b: Batch) -> dict[int, list[float]]:
        token_rollout = np.repeat(b.sample_rollout, np.diff(b.offsets))
        return {
            r: sorted(b.loss_weights[(token_rollout == r) & b.loss_mask].tolist()) for r in range(n)
        }

    want, got = per_rollout_token(one), per_rollout_token(split)
    for r in range(n):
        assert np.allclose(np.array(got[r]) / k, want[r], rtol=1e-6, atol=0)


@pytest.mark.parametrize("mode", ["trajectory", "transition"])
def test_an_intermediate_reward_shifts_only_its_own_calls_tokens(mode: str) -> None:
    """Rollout "a" (3 calls, merged into one sample in trajectory mode) has a penalty on call 1 and a reward
    for a call it does not have; "b" has none. Each call's sampled tokens get the rollout's advantage plus
    the coefficient times its own intermediate rewards; the default coefficient, 0, changes nothing."""
    calls = {rid: chain(rid, [([1, 2], [3, 4]), ([5], [6, 7, 8]), ([9], [10])]) for rid in "ab"}
    rollouts = [rollout("a", reward=1.0), rollout("b", reward=0.0)]
    intermediate = {"a": {1: -1.0, 7: 5.0}, "b": {}}
    base = build_batch(rollouts, calls, AdapterSettings(mode=mode), intermediate=intermediate)
    shaped = build_batch(
        rollouts,
        calls,
        AdapterSettings(mode=mode, intermediate_coef=0.5),
        intermediate=intermediate,
    )
    assert base.metrics["calls_shaped"] == 0 and shaped.metrics["calls_shaped"] == 1
    assert np.array_equal(base.input_ids, shaped.input_ids) and np.array_equal(
        base.loss_mask, shaped.loss_mask
    )
    response_of = {3: 1, 4: 1, 6: 2, 7: 2, 8: 2, 10: 3}  # token -> its call's seq + 1 (0: fed)
    token_rollout = np.repeat(base.sample_rollout, np.diff(base.offsets))
    for t in np.flatnonzero(base.loss_mask):
        rid = base.rollout_ids[token_rollout[t]]
        call_seq = response_of[int(base.input_ids[t])] - 1
        want = base.advantages[t] - (0.5 if (rid, call_seq) == ("a", 1) else 0.0)
        assert shaped.advantages[t] == pytest.approx(want)
    assert not shaped.advantages[~shaped.loss_mask].any()


def test_sample_level_modes_weigh_a_split_rollout_more() -> None:
    # Both rollouts have 4 trained tokens; "a" is one sample, "b" four (each call rewrites the context).
    calls = {
        "a": [call("a", 0, [0], [7]), call("a", 1, [0, 7, 1], [7, 7, 7])],
        "b": [call("b", k, [9 - k], [7]) for k in range(4)],
    }
    rollouts = [rollout("a", reward=1.0), rollout("b", reward=0.0)]

    def weight(mode: str) -> dict[str, float]:
        batch = build_batch(rollouts, calls, AdapterSettings(loss_mode=mode))  # type: ignore[arg-type]
        token_rollout = np.repeat(batch.sample_rollout, np.diff(batch.offsets))
        w = np.bincount(token_rollout, weights=batch.loss_weights)
        return {rid: float(w[r]) for r, rid in enumerate(batch.rollout_ids)}

    assert weight("rollout") == pytest.approx({"a": 0.5, "b": 0.5})
    assert weight("token-mean") == pytest.approx({"a": 0.5, "b": 0.5})
    assert weight("seq-mean-token-mean") == pytest.approx({"a": 0.2, "b": 0.8})


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=40), k=st.integers(1, 6))
def test_balanced_partitions_match_verl(lengths: list[int], k: int) -> None:
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    lengths = lengths + [1] * (-len(lengths) % k)
    ours = balanced_partitions(lengths, k)
    theirs = get_seqlen_balanced_partitions(lengths, k, equal_size=True)
    assert sorted(i for part in ours for i in part) == list(range(len(lengths)))
    assert {len(part) for part in ours} == {len(lengths) // k}
    sums = sorted(sum(lengths[i] for i in part) for part in ours)
    assert sums == sorted(sum(lengths[i] for i in part) for part in theirs)


def test_stale_rollouts_are_dropped() -> None:
    rollouts = [
        rollout("fresh", reward=1.0),
        rollout("mixed", reward=0.0),
        rollout("stale", reward=0.5),
    ]
    calls = {
        "fresh": [call("fresh", 0, [1], [2], version=5)],
        "mixed": [
            call("mixed", 0, [1], [2], version=4),
            call("mixed", 1, [1, 2, 3], [4], version=5),
        ],
        "stale": [
            call("stale", 0, [1], [2], version=3),
            call("stale", 1, [1, 2, 3], [4], version=5),
        ],
    }
    batch = build_batch(rollouts, calls, AdapterSettings(max_staleness=1), version=5)
    assert batch.rollout_ids == ("fresh", "mixed")
    assert batch.metrics["rollouts_dropped_stale"] == 1
    with pytest.raises(ValueError, match="trained version"):
        build_batch(rollouts, calls, AdapterSettings(max_staleness=1))


BAD_SETTINGS = {
    "mode": "tree",
    "loss_mode": "sum",
    "max_length": 0,
    "dp_size": 0,
    "minibatch_rollouts": 0,
}
BAD_SETTINGS |= {"max_staleness": -1, "eps": -1.0}


@pytest.mark.parametrize(("name", "value"), BAD_SETTINGS.items())
def test_bad_settings_are_refused_naming_the_field(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name):
        AdapterSettings(**{name: value})  # type: ignore[arg-type]
