"""Small builders of rollouts and calls for the adapter tests (no store: the adapter's input is
plain records)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from agl.types import Call, FailureKind, Mode, Rollout, Status


def call(
    rid: str,
    seq: int,
    prompt: Sequence[int],
    response: Sequence[int],
    logprobs: Sequence[float] | None = None,
    *,
    agent: str = "main",
    version: int = 0,
) -> Call:
    if logprobs is None:
        logprobs = [-0.25 - 0.01 * i for i in range(len(response))]
    return Call(
        rollout_id=rid,
        prompt_ids=array("i", prompt),
        response_ids=array("i", response),
        logprobs=array("f", logprobs),
        seq=seq,
        agent=agent,
        model_version=version,
    )


def rollout(
    rid: str,
    group: str = "g",
    reward: float | None = 1.0,
    *,
    status: Status = Status.SUCCEEDED,
    failure: FailureKind | None = None,
) -> Rollout:
    return Rollout(
        id=rid,
        task={},
        group=group,
        mode=Mode.TRAIN,
        status=status,
        reward=reward,
        failure_kind=failure,
    )


def chain(
    rid: str, turns: Sequence[tuple[Sequence[int], Sequence[int]]], *, agent: str = "main"
) -> list[Call]:
    """Calls whose prompts each extend the last: turn k is (new fed tokens, response)."""
    calls, context = [], []
    for seq, (fed, response) in enumerate(turns):
        context = context + list(fed)
        calls.append(call(rid, seq, context, response, agent=agent))
        context = context + list(response)
    return calls
