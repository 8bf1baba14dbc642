"""Merging calls into samples: prefix chains, sub-agents, re-tokenized and summarized contexts,
overflow, bad input."""

from __future__ import annotations

from dataclasses import replace

import pytest

from adapters import AdapterError, AdapterSettings, Batch, build_batch
from tests.adapters.factory import call, chain, rollout


def build(calls_a: list, settings: AdapterSettings | None = None, **kw) -> Batch:
    """One trained rollout `a` (with a partner `b` so its group is not degenerate)."""
    rollouts = [rollout("a", reward=1.0), rollout("b", reward=0.0)]
    calls = {"a": calls_a, "b": [call("b", 0, [1], [2])]}
    return build_batch(rollouts, calls, settings or AdapterSettings(), **kw)


def samples_of(batch: Batch, rid: str = "a") -> list[tuple[list[int], list[bool], list[float]]]:
    """(input IDs, loss mask, logprobs) of each real sample of rollout `rid`, in output order."""
    r = batch.rollout_ids.index(rid)
    mine = [
        slice(*batch.offsets[j : j + 2])
        for j in range(batch.n_samples)
        if batch.sample_rollout[j] == r
    ]
    return [
        (batch.input_ids[t].tolist(), batch.loss_mask[t].tolist(), batch.logprobs[t].tolist())
        for t in mine
    ]


def test_prefix_chain_is_one_sample_with_fed_tokens_masked() -> None:
    calls = chain("a", [([1, 2, 3], [10, 11]), ([4, 5], [12]), ([6], [13, 14, 15])])
    batch = build(calls)
    [(ids, mask, logps)] = samples_of(batch)
    assert ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14, 15]
    assert ids == list(calls[-1].prompt_ids) + list(calls[-1].response_ids)
    assert mask == [False] * 3 + [True] * 2 + [False] * 2 + [True] + [False] + [True] * 3
    expected = (
        [0.0] * 3
        + list(calls[0].logprobs)
        + [0.0] * 2
        + list(calls[1].logprobs)
        + [0.0, *calls[2].logprobs]
    )
    assert logps == pytest.approx(expected)
    assert batch.metrics["calls_merged"] == 2
    assert batch.metrics["mismatch_new_chain"] == batch.metrics["mismatch_rewritten"] == 0


def test_interleaved_sub_agent_chains_keep_their_own_samples() -> None:
    main = chain("a", [([1, 2], [10]), ([3], [11]), ([4], [12])])
    sub = chain("a", [([1, 7], [20]), ([8], [21])], agent="sub")
    # main0, sub0, main1, sub1, main2: each call extends its own chain, not the last call's.
    ordered = [main[0], sub[0], main[1], sub[1], main[2]]
    calls = [
        call("a", seq, c.prompt_ids, c.response_ids, agent=c.agent) for seq, c in enumerate(ordered)
    ]
    batch = build(calls)
    samples = samples_of(batch)
    assert sorted(ids for ids, _, _ in samples) == sorted(
        [[1, 2, 10, 3, 11, 4, 12], [1, 7, 20, 8, 21]],
    )
    assert batch.metrics["mismatch_new_chain"] == 1
    assert batch.metrics["calls_merged"] == 3
    a = batch.rollout_ids.index("a")
    seqs = {batch.sample_calls[j] for j in range(batch.n_samples) if batch.sample_rollout[j] == a}
    assert seqs == {(0, 2, 4), (1, 3)}  # main's calls, sub's calls


def test_retokenized_boundary_opens_a_new_sample() -> None:
    first = call("a", 0, [1, 2, 3], [10, 11])
    # The harness re-rendered the reply: [10, 11] came back as [10, 99] in the next prompt.
    second = call("a", 1, [1, 2, 3, 10, 99, 4], [12])
    batch = build([first, second])
    assert [ids for ids, _, _ in samples_of(batch)] == [[1, 2, 3, 10, 11], [1, 2, 3, 10, 99, 4, 12]]
    assert batch.metrics["mismatch_retokenized"] == 1
    assert batch.metrics["mismatch_rewritten"] == 0
    assert batch.metrics["merge_rate"] == 0.0


def test_summarized_context_opens_a_new_sample_and_later_calls_extend_it() -> None:
    calls = chain("a", [([1, 2, 3, 4], [10]), ([5], [11])])
    summary = [call("a", 2, [1, 2, 50, 51], [12]), call("a", 3, [1, 2, 50, 51, 12, 6], [13])]
    batch = build(calls + summary)
    assert [ids for ids, _, _ in samples_of(batch)] == [
        [1, 2, 3, 4, 10, 5, 11],
        [1, 2, 50, 51, 12, 6, 13],
    ]
    assert batch.metrics["mismatch_rewritten"] == 1
    assert batch.metrics["calls_merged"] == 2


def test_length_overflow_starts_a_new_sample() -> None:
    calls = chain("a", [([1, 2, 3], [10, 11]), ([4], [12]), ([5, 6], [13])])  # lengths 5, 7, 10
    batch = build(calls, AdapterSettings(max_length=8))
    samples = samples_of(batch)
    assert [ids for ids, _, _ in samples] == [
        [1, 2, 3, 10, 11, 4, 12],
        [1, 2, 3, 10, 11, 4, 12, 5, 6, 13],
    ]
    # The new sample trains only the new call's response; the earlier responses are fed context.
    assert samples[1][1] == [False] * 9 + [True]
    assert batch.metrics["mismatch_overflow"] == 1
    assert (
        batch.metrics["overlong_samples"] == 1
    )  # 10 tokens: one call alone is longer than max_length


def test_transition_mode_makes_one_sample_per_call() -> None:
    calls = chain("a", [([1, 2], [10]), ([3], [11]), ([4], [12])])
    batch = build(calls, AdapterSettings(mode="transition"))
    samples = samples_of(batch)
    assert [ids for ids, _, _ in samples] == [
        list(c.prompt_ids) + list(c.response_ids) for c in calls
    ]
    assert all(sum(mask) == 1 for _, mask, _ in samples)


def test_untrained_agents_are_left_out_and_counted() -> None:
    calls = [
        call("a", 0, [1], [10]),
        call("a", 1, [7], [20], agent="judge"),
        call("a", 2, [1, 10, 2], [11]),
    ]
    batch = build(calls, AdapterSettings(trained_agents=frozenset({"main"})))
    assert [ids for ids, _, _ in samples_of(batch)] == [[1, 10, 2, 11]]
    assert batch.metrics["calls_untrained"] == 1
    assert 20 not in batch.input_ids.tolist()


def test_calls_sampled_at_another_temperature_are_fed_not_trained_and_counted() -> None:
    """Their log-probs are of another distribution: the response becomes context of the next call."""
    first, second, third = chain("a", [([1], [10]), ([2], [11]), ([3], [12])])
    calls = [
        first,
        replace(second, temperature=0.0),
        replace(third, temperature=None),
    ]  # greedy; not recorded
    batch = build(calls, AdapterSettings(temperature=1.0))
    [(ids, mask, _)] = samples_of(batch)
    assert ids == [1, 10]  # the later calls were not trained (one sample, of the first call)
    assert batch.metrics["calls_temperature_mismatch"] == 2 and batch.metrics["merge_rate"] == 0.0
    calls = [first, replace(second, temperature=0.7), replace(third, temperature=0.7)]
    batch = build(calls, AdapterSettings(temperature=1.0))
    assert batch.metrics["calls_temperature_mismatch"] == 2
    [(ids, mask, _)] = samples_of(
        build([replace(c, temperature=0.7) for c in calls], AdapterSettings(temperature=0.7))
    )
    assert ids == [1, 10, 2, 11, 3, 12] and sum(mask) == 3
    no_check = build(calls)  # AdapterSettings().temperature is None: every call trained
    assert (
        no_check.metrics["calls_temperature_mismatch"] == 0 and sum(samples_of(no_check)[0][1]) == 3
    )


def test_mismatched_logprobs_name_the_rollout_and_call() -> None:
    bad = call("a", 3, [1], [10, 11], [-0.1])
    with pytest.raises(AdapterError, match=r"rollout a call seq 3: 2 response IDs but 1 logprobs"):
        build([call("a", 2, [1], [9]), bad])


def test_calls_of_an_unknown_rollout_are_an_error() -> None:
    with pytest.raises(AdapterError, match=r"unknown rollout ghost \(call seq 4\)"):
        build_batch([rollout("a")], {"a": [], "ghost": [call("ghost", 4, [1], [2])]})
    with pytest.raises(AdapterError, match=r"rollout a call seq 0: the call belongs to rollout b"):
        build([call("b", 0, [1], [2])])


def test_missing_reward_is_filled_and_counted_or_an_error() -> None:
    rollouts = [rollout("a", reward=None), rollout("b", reward=1.0)]
    calls = {"a": [call("a", 0, [1], [2])], "b": [call("b", 0, [1], [3])]}
    batch = build_batch(rollouts, calls, AdapterSettings(missing_reward=-1.0, norm_by_std=False))
    assert batch.metrics["missing_reward_filled"] == 1
    adv = dict(zip(batch.rollout_ids, batch.rollout_advantages, strict=True))
    assert adv == pytest.approx({"a": -1.0, "b": 1.0})  # rewards -1 and 1, group mean 0
    with pytest.raises(AdapterError, match="rollout a has no reward"):
        build_batch(rollouts, calls, AdapterSettings(missing_reward=None))


def test_calls_of_another_attempt_or_out_of_order_are_an_error() -> None:
    retried = rollout("a")
    retried = type(retried)(**{**retried.__dict__, "attempt": 2})
    calls = {"a": [call("a", 0, [1], [2])], "b": [call("b", 0, [1], [3])]}
    with pytest.raises(
        AdapterError, match=r"rollout a call seq 0: expected the calls of attempt 2"
    ):
        build_batch([retried, rollout("b", reward=0.0)], calls)
    with pytest.raises(AdapterError, match=r"rollout a call seq 1: .* after seq 2"):
        build([call("a", 2, [1], [2]), call("a", 1, [1, 2], [3])])


def test_no_trainable_rollouts_make_an_empty_batch() -> None:
    batch = build_batch([rollout("a"), rollout("b")], {"a": [], "b": []})
    assert batch.n_samples == 0 and len(batch.input_ids) == 0
    assert batch.metrics["rollouts"] == 2 and batch.metrics["rollouts_trained"] == 0
    assert (
        batch.metrics["rollouts_dropped_stale"] == batch.metrics["mismatch_overflow"] == 0
    )  # always reported
