"""The store against real SQLite and PostgreSQL: state machine, token arrays, concurrency, migrations."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import threading
import time
from array import array
from contextlib import closing
from dataclasses import replace

import pytest
import sqlalchemy as sa

from agl.settings import StoreSettings
from agl.store import (
    SQLITE_WAL_BOUND,
    IllegalTransition,
    InvalidData,
    NotFound,
    OverBudget,
    SchemaTooNew,
    Store,
    StoreError,
    calls,
    events,
    hash_token,
    rollouts,
)
from agl.types import TRANSITIONS, Call, Charge, FailureKind, ModelVersion, Status


@pytest.fixture
def store(db_url):
    with Store(db_url) as s:
        yield s


def kinds(store: Store, rollout_id: str, kind: str) -> list:
    """The rollout's events of one kind."""
    return [e for e in store.events(rollout_id) if e.kind == kind]


def make_call(rollout_id: str, n_prompt: int = 5, n_response: int = 3, **kw) -> Call:
    return Call(
        rollout_id=rollout_id,
        prompt_ids=array("i", range(n_prompt)),
        response_ids=array("i", range(100, 100 + n_response)),
        logprobs=array("f", [-0.5] * n_response),
        **kw,
    )


def counts(store: Store) -> tuple[int, int, int]:
    with store._read_engine.connect() as conn:
        return tuple(
            conn.execute(sa.select(sa.func.count()).select_from(t)).scalar()
            for t in (rollouts, calls, events)
        )


# ------------------------------------------------------------------ rollouts and the state machine


def test_create_rollout_returns_tokens_and_stores_only_hashes(store):
    created = store.create_rollout({"q": "2+2"}, "g1", grader=True, metadata={"k": 1}).result()
    r = created.rollout
    assert r.status is Status.QUEUED and r.attempt == 1 and r.has_grader and r.task == {"q": "2+2"}
    assert (
        created.agent_token and created.grader_token and created.agent_token != created.grader_token
    )
    assert store.rollout_for_token(created.agent_token) == (r, "agent")
    assert store.rollout_for_token(created.grader_token) == (r, "grader")
    assert store.rollout_for_token("nope") is None
    other = store.create_rollout({"q": 1}, "g1").result()
    digests = [hash_token(t) for t in (created.agent_token, created.grader_token, "nope")]
    assert store.token_holders([*digests, hash_token(other.agent_token)]) == {
        digests[0]: (r, "agent"),
        digests[1]: (r, "grader"),
        hash_token(other.agent_token): (other.rollout, "agent"),
    }
    with store._read_engine.connect() as conn:
        row = conn.execute(sa.select(rollouts).where(rollouts.c.id == r.id)).one()
    assert created.agent_token not in str(tuple(row))
    assert store.get_rollout(r.id) == r
    assert [e.kind for e in store.events(r.id)] == ["lifecycle"]


def _drive_to(store: Store, status: Status) -> str:
    """A fresh rollout brought to `status` by legal moves."""
    rid = store.create_rollout({}, "g").result().rollout.id
    if status is Status.QUEUED:
        return rid
    store.transition(rid, Status.RUNNING).result()
    if status is not Status.RUNNING:
        kind = FailureKind.TASK if status is Status.FAILED else None
        store.transition(rid, status, failure_kind=kind).result()
    return rid


def _kind_for(to: Status) -> FailureKind | None:
    return FailureKind.INFRA if to in (Status.QUEUED, Status.FAILED) else None


@pytest.mark.parametrize("start", list(Status))
@pytest.mark.parametrize("to", list(Status))
def test_every_transition_is_legal_or_rejected(db_url, start, to):
    with Store(db_url) as store:
        rid = _drive_to(store, start)
        before = (store.get_rollout(rid), counts(store))
        if to in TRANSITIONS[start]:
            r = store.transition(rid, to, failure_kind=_kind_for(to), reason="test").result()
            assert r.status is to
            assert (r.ended_at is not None) == to.terminal
            assert r.attempt == (2 if to is Status.QUEUED else 1)
            assert store.events(rid)[-1].data["to"] == to.value
        else:
            with pytest.raises(IllegalTransition):
                store.transition(rid, to, failure_kind=_kind_for(to)).result()
            assert (store.get_rollout(rid), counts(store)) == before


def test_transition_guards(store):
    rid = _drive_to(store, Status.RUNNING)
    with pytest.raises(IllegalTransition, match="only an infra failure"):
        store.transition(rid, Status.QUEUED, failure_kind=FailureKind.TASK).result()
    with pytest.raises(IllegalTransition, match="failure kind"):
        store.transition(rid, Status.FAILED).result()
    with pytest.raises(IllegalTransition, match="takes no failure kind"):
        store.transition(rid, Status.SUCCEEDED, failure_kind=FailureKind.TASK).result()
    with pytest.raises(IllegalTransition, match="stale"):
        store.transition(rid, Status.SUCCEEDED, attempt=2).result()
    with pytest.raises(IllegalTransition):
        store.transition(rid, "exploded").result()
    with pytest.raises(NotFound):
        store.transition("missing", Status.RUNNING).result()
    assert store.get_rollout(rid).status is Status.RUNNING  # every refusal changed nothing
    assert store.transition(rid, Status.TIMED_OUT).result().failure_kind is FailureKind.TASK


def test_a_start_moves_only_a_queued_rollout_and_leaves_one_started_or_ended_as_it_is(store):
    """The first model calls of a rollout may reach two gateway replicas at once: the second
    start finds it running and is no refused write (which would undo the writer's whole group)."""
    rid = _drive_to(store, Status.QUEUED)
    started = store.start(rid, "first model call").result()
    assert started.status is Status.RUNNING and started.started_at is not None
    before = (store.get_rollout(rid), counts(store))
    again = [store.start(rid, "first model call"), store.append_call(make_call(rid))]
    assert again[0].result() == before[0]
    assert again[1].result().seq == 0
    assert [e.data.get("reason") for e in kinds(store, rid, "lifecycle")] == [
        None,
        "first model call",
    ]
    ended = store.transition(rid, Status.SUCCEEDED).result()
    assert store.start(rid, "first model call").result() == ended
    with pytest.raises(NotFound):
        store.start("missing", "first model call").result()


def test_a_time_out_is_a_task_failure_and_one_of_another_kind_is_refused(store):
    """Naming no kind names the time-out's own; naming infra is refused, not rewritten."""
    rid = _drive_to(store, Status.RUNNING)
    before = (store.get_rollout(rid), counts(store))
    with pytest.raises(IllegalTransition, match="a time-out is a task failure, not infra"):
        store.transition(rid, Status.TIMED_OUT, failure_kind=FailureKind.INFRA).result()
    assert (store.get_rollout(rid), counts(store)) == before
    ended = store.transition(rid, Status.TIMED_OUT, failure_kind=FailureKind.TASK).result()
    assert (ended.status, ended.failure_kind) == (Status.TIMED_OUT, FailureKind.TASK)


def test_retry_starts_a_new_attempt_and_only_its_calls_count(store):
    rid = _drive_to(store, Status.RUNNING)
    store.append_call(make_call(rid)).result()
    store.append_call(make_call(rid)).result()
    store.set_reward(rid, 1.0).result()
    store.transition(
        rid, Status.QUEUED, failure_kind="infra", reason="pod evicted", attempt=1
    ).result()
    assert store.get_rollout(rid).reward is None  # the failed attempt's reward does not carry over
    store.transition(rid, Status.RUNNING, attempt=2).result()
    third = store.append_call(make_call(rid, n_response=7)).result()
    assert (third.attempt, third.seq) == (2, 2)
    assert [c.seq for c in store.calls_for([rid])[rid]] == [2]
    assert [c.attempt for c in store.calls_for([rid], all_attempts=True)[rid]] == [1, 1, 2]


# ------------------------------------------------------------------ calls and token arrays


@pytest.mark.parametrize("n", [0, 1, 200_000])
def test_token_arrays_round_trip(store, n):
    rid = _drive_to(store, Status.RUNNING)
    prompt = array("i", [(i * 7919) % 151_936 for i in range(n)])
    response = array("i", [(i * 104_729) % 2_147_483_647 for i in range(n)])
    logprobs = array("f", [-(i % 1000) / 37.0 for i in range(n)])
    stored = store.append_call(
        Call(
            rollout_id=rid,
            prompt_ids=prompt,
            response_ids=response,
            logprobs=logprobs,
            agent="solver",
            model_version=3,
            temperature=0.7,
            request={"m": [1]},
        )
    ).result()
    (got,) = store.calls_for([rid])[rid]
    assert got.prompt_ids == prompt and got.response_ids == response and got.logprobs == logprobs
    assert got.prompt_ids.typecode == "i" and got.logprobs.typecode == "f"
    assert (got.seq, stored.seq, got.agent, got.model_version, got.request) == (
        0,
        0,
        "solver",
        3,
        {"m": [1]},
    )
    assert got.temperature == 0.7
    assert got.id is not None
    with store._read_engine.connect() as conn:
        blob = conn.execute(sa.select(calls.c.logprobs)).scalar()
    assert len(blob) == 4 * n  # float32, not JSON


def test_lists_are_accepted_and_stored_compactly(store):
    rid = _drive_to(store, Status.RUNNING)
    store.append_call(Call(rid, [1, 2, 3], [4], [-0.25])).result()  # type: ignore[arg-type]
    (got,) = store.calls_for([rid])[rid]
    assert list(got.prompt_ids) == [1, 2, 3] and list(got.logprobs) == [-0.25]


def test_extreme_ids_and_logprobs_round_trip(db_url):
    with Store(db_url) as store:
        rid = _drive_to(store, Status.RUNNING)
        ids = [0, 127, 128, 2**23, 2**24 - 1, 2**31 - 1]
        logprobs = [-3.0e38] * (len(ids) - 1) + [0.0]  # finite however large, and 0: accepted
        store.append_call(Call(rid, ids, ids[::-1], logprobs)).result()  # type: ignore[arg-type]
        (call,) = store.calls_for([rid])[rid]
        assert list(call.prompt_ids) == ids and list(call.response_ids) == ids[::-1]
        assert list(call.logprobs) == pytest.approx(logprobs, rel=1e-6)


@pytest.mark.parametrize(
    ("prompt", "response", "logprobs", "message"),
    [
        ([1, 2], [3, 4], [-1.0], "2 response_ids but 1 logprobs"),
        (["a"], [], [], "not an array of int32"),
        ([1], [2**31], [-1.0], "not an array of int32"),
        ([-1], [], [], "negative token id"),
        ([1, 2], [5, -7], [-1.0, -1.0], "negative token id"),
        ([-(2**31)], [], [], "negative token id"),
        ([1], [2], [math.nan], "finite"),
        ([1], [2, 3], [-1.0, math.inf], "finite"),
        ([1], [2, 3], [-math.inf, -1.0], "finite"),
        ([1], [2, 3], [math.nan, 0.5], "finite"),
        ([1], [2], [0.5], "at most 0"),
        ([1] * 11, [], [], "more than the limit"),
    ],
)
def test_bad_arrays_are_rejected_and_nothing_is_written(
    db_url, prompt, response, logprobs, message
):

    with Store(db_url, StoreSettings(max_tokens_per_array=10)) as store:
        rid = _drive_to(store, Status.RUNNING)
        before = counts(store)
        with pytest.raises(InvalidData, match=message):
            store.append_call(Call(rid, prompt, response, logprobs)).result()  # type: ignore[arg-type]
        assert counts(store) == before
        assert store.get_rollout(rid).status is Status.RUNNING


def test_calls_need_a_live_rollout(store):
    with pytest.raises(NotFound):
        store.append_call(make_call("missing")).result()
    rid = _drive_to(store, Status.SUCCEEDED)
    before = counts(store)
    with pytest.raises(IllegalTransition, match="has ended"):
        store.append_call(make_call(rid)).result()
    assert counts(store) == before


def test_calls_for_many_rollouts_at_once(store):
    ids = [_drive_to(store, Status.RUNNING) for _ in range(600)]  # more than one query chunk
    for i, rid in enumerate(ids):
        for _ in range(i % 3):
            store.append_call(make_call(rid)).result()
    got = store.calls_for([*ids, "missing"])
    assert [len(got[rid]) for rid in ids] == [i % 3 for i in range(600)]
    assert got["missing"] == []
    assert all([c.seq for c in cs] == list(range(len(cs))) for cs in got.values())


def conversation_call(
    rid: str, prompt: list[int], response: list[int], request: dict, agent: str = "a"
) -> Call:
    return Call(
        rollout_id=rid,
        prompt_ids=array("i", prompt),
        response_ids=array("i", response),
        logprobs=array("f", [-0.25] * len(response)),
        agent=agent,
        request=request,
    )


def test_chained_calls_read_back_whole_through_agents_choices_mismatches_retries_and_reopening(
    db_url,
):
    """Each call is stored as the extension of its agent's last one (`base`); reads must return
    exactly what was appended, whatever the chain: two agents interleaved, n > 1 choices of one
    prompt, a prompt that rewrites the history, a request key that changes or goes, a retried
    attempt, and a new Store that remembers no chain."""
    import random

    rng = random.Random(7)
    appended: list[Call] = []
    with Store(db_url) as store:
        rid = _drive_to(store, Status.RUNNING)
        history = {"a": [1, 2, 3], "b": [9, 9]}
        messages: dict[str, list] = {"a": [{"role": "system", "content": "s"}], "b": []}
        for turn in range(40):
            agent = "b" if turn % 5 == 4 else "a"
            messages[agent].append(
                {"role": "user", "content": f"turn {turn}", "n": [turn, {"x": None}]}
            )
            if turn == 17:  # the harness rewrites history: a prompt that extends nothing
                history[agent] = [7] * 5
                messages[agent] = messages[agent][-2:]
            request = {
                "messages": list(messages[agent]),
                "tools": [{"name": "t"}],
                "max_tokens": 8 + turn % 2,
            }
            if turn == 23:
                del request["tools"]
            prompt = history[agent] + [rng.randrange(50_000) for _ in range(rng.randrange(0, 6))]
            for _ in range(2 if turn % 7 == 3 else 1):  # n > 1: choices of one prompt
                response = [rng.randrange(50_000) for _ in range(rng.randrange(1, 5))]
                appended.append(
                    store.append_call(
                        conversation_call(rid, prompt, response, request, agent)
                    ).result()
                )
            history[agent] = prompt + response
            messages[agent].append({"role": "assistant", "content": str(response)})
            if turn == 29:
                store.transition(rid, Status.QUEUED, failure_kind=FailureKind.INFRA).result()
                store.transition(rid, Status.RUNNING).result()
        with store._read_engine.connect() as conn:
            bases = [
                row.base for row in conn.execute(sa.select(calls.c.base).order_by(calls.c.seq))
            ]

    def same(got: list[Call], want: list[Call]) -> None:
        assert [(c.seq, c.attempt, c.agent) for c in got] == [
            (c.seq, c.attempt, c.agent) for c in want
        ]
        for g, w in zip(got, want, strict=True):
            assert (list(g.prompt_ids), list(g.response_ids), g.request) == (
                list(w.prompt_ids),
                list(w.response_ids),
                w.request,
            )
            assert list(g.request) == list(w.request)  # in the order the harness sent its keys

    # a's first, b's first, and both agents' first after the retry
    assert sum(b is None for b in bases) == 4
    # the rewritten history: chained, nothing shared
    assert any(b and b["prompt_from"] == 0 for b in bases)
    with Store(db_url) as store:
        same(store.calls_for([rid], all_attempts=True)[rid], appended)
        same(store.calls_for([rid])[rid], [c for c in appended if c.attempt == 2])
        same(store.last_calls(rid, 3), appended[-3:])
        more = store.append_call(
            conversation_call(rid, [*appended[-1].prompt_ids, 5], [6], {"k": 1})
        ).result()
        # Stored whole: this Store remembers no chain.
        same(store.calls_for([rid])[rid][-1:], [more])
        with store._read_engine.connect() as conn:
            assert (
                conn.execute(sa.select(calls.c.base).where(calls.c.seq == more.seq)).scalar()
                is None
            )


def _corrupt(store: Store, rid: str, seqs: list[int]) -> None:
    """These calls' rows unreadable: a read that decodes one fails."""
    with store._read_engine.begin() as conn:
        where = sa.and_(calls.c.rollout_id == rid, calls.c.seq.in_(seqs))
        conn.execute(calls.update().where(where).values(prompt_ids=b"\x01"))


def test_a_call_is_read_through_its_chain_alone_back_to_the_call_the_reader_holds(db_url):
    """Two replicas (two Stores) take turns on one conversation, each following the call the other
    recorded (`follows`), as a gateway that catches up does: each call extends the one before.
    `last_calls` reads a call through its chain only, back to a call stored whole or to the one
    the reader holds (`known`): no other row is decoded (the others are made unreadable here)."""
    with Store(db_url) as one, Store(db_url) as two:
        rid = _drive_to(one, Status.RUNNING)
        prompt = [1, 2, 3]
        messages = [{"role": "user", "content": "hi"}]
        appended: list[Call] = []
        for turn in range(6):
            store = (one, two)[turn % 2]
            previous = appended[-1] if appended else None
            call = conversation_call(rid, prompt, [10 + turn], {"messages": list(messages)})
            appended.append(store.append_call(call, follows=previous).result())
            prompt = [*prompt, 10 + turn, 20 + turn]
            messages += [
                {"role": "assistant", "content": str(turn)},
                {"role": "user", "content": "go"},
            ]
            if turn == 2:  # another agent's call: not on the chain
                other = one.append_call(conversation_call(rid, [5], [6], {}, agent="b")).result()
        with one._read_engine.connect() as conn:
            bases = conn.execute(
                sa.select(calls.c.base).where(calls.c.agent == "a").order_by(calls.c.seq)
            ).scalars()
            assert [b and b["seq"] for b in bases] == [None, *(c.seq for c in appended[:-1])]
        last = appended[-1]
        _corrupt(one, rid, [other.seq])
        [read] = one.last_calls(rid)
        assert (list(read.prompt_ids), read.request) == (list(last.prompt_ids), last.request)
        # The reader holds the call before: no call before the last is decoded.
        _corrupt(one, rid, [c.seq for c in appended[:-1]])
        assert one.last_calls(rid, 2, known=appended[-2]) == [appended[-2], read]
        with pytest.raises(StoreError, match="corrupt"):
            one.last_calls(rid)


def test_a_growing_conversation_stores_its_new_tokens_not_its_whole_prompt(store):
    rid = _drive_to(store, Status.RUNNING)
    prompt = list(range(2_000))
    messages = [{"role": "system", "content": "x" * 8_000}]
    for turn in range(30):
        messages.append({"role": "user", "content": f"tool output {turn} " * 100})
        prompt += list(range(turn * 1000, turn * 1000 + 500))
        call = store.append_call(
            conversation_call(rid, prompt, [1] * 64, {"messages": list(messages)})
        ).result()
        prompt = list(call.prompt_ids) + list(call.response_ids)
        messages.append({"role": "assistant", "content": "ok"})
    with store._read_engine.connect() as conn:
        sizes = conn.execute(
            sa.select(
                sa.func.length(calls.c.prompt_ids),
                sa.func.length(sa.cast(calls.c.request, sa.Text)),
            ).order_by(calls.c.seq)
        ).all()
    # The reply is in response_ids.
    assert sizes[0][0] == 4 * 2_500 and all(ids == 4 * 500 for ids, _ in sizes[1:])
    # The new messages, not 30 turns of them.
    assert all(request < 2_000 for _, request in sizes[1:])
    assert len(store.calls_for([rid])[rid][-1].request["messages"]) == 60


# ------------------------------------------------------------------ events, rewards, models


def test_events_and_rewards(store):
    rid = _drive_to(store, Status.RUNNING)
    store.append_event(rid, "harness", {"step": 1}).result()
    store.set_reward(rid, 0.25, source="harness", final=False, call_seq=0).result()
    assert store.get_rollout(rid).reward is None
    store.set_reward(rid, 1.0, source="grader").result()
    assert store.get_rollout(rid).reward == 1.0
    rewards = kinds(store, rid, "reward")
    assert [(e.data["value"], e.data["final"], e.data["source"]) for e in rewards] == [
        (0.25, False, "harness"),
        (1.0, True, "grader"),
    ]
    assert [e.kind for e in store.events(rid, after=rewards[0].id)] == ["reward"]
    before = counts(store)
    for bad in (math.nan, math.inf, "1", True):
        with pytest.raises(InvalidData):
            store.set_reward(rid, bad).result()  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        store.append_event("missing", "harness").result()
    with pytest.raises(InvalidData):
        store.append_event(rid, "", {}).result()
    with pytest.raises(InvalidData):
        store.append_event(rid, "x", [1]).result()  # type: ignore[arg-type]
    assert counts(store) == before


def test_a_rollouts_sent_bytes_are_counted_and_refused_past_its_budget_in_the_write(store):
    """The storage budget is counted in the database, in the call's or event's own transaction
    (gateway replicas share it): past the budget the write is refused and nothing is stored; an
    uncharged write (the admin's) counts nothing; each rollout has its own count."""
    rid = _drive_to(store, Status.RUNNING)
    other = _drive_to(store, Status.RUNNING)
    assert store.sent_bytes(rid) == 0
    with pytest.raises(NotFound):
        store.sent_bytes("missing")
    store.append_call(make_call(rid), Charge(size=600, budget=1000)).result()
    store.append_event(rid, "note", {"x": 1}, charge=Charge(size=300, budget=1000)).result()
    store.append_event(rid, "note", {"x": 2}).result()
    assert store.sent_bytes(rid) == 900
    before = counts(store)
    with pytest.raises(OverBudget, match="has sent 900 bytes; 101 more"):
        store.append_call(make_call(rid), Charge(size=101, budget=1000)).result()
    with pytest.raises(OverBudget):
        store.append_event(rid, "note", {}, charge=Charge(size=101, budget=1000)).result()
    assert counts(store) == before and store.sent_bytes(rid) == 900
    store.append_call(make_call(other), Charge(size=1000, budget=1000)).result()
    assert store.sent_bytes(other) == 1000 and store.sent_bytes(rid) == 900


def test_model_versions_only_grow(store):
    assert store.latest_model() is None
    first = ModelVersion(version=0, path="/ckpt/0", endpoints=["127.0.0.1:30000"])
    store.register_model(first).result()
    store.register_model(ModelVersion(version=1, path="/ckpt/1")).result()
    with pytest.raises(InvalidData, match="not newer"):
        store.register_model(ModelVersion(version=1, path="/ckpt/dup")).result()
    assert [m.version for m in store.models()] == [0, 1]
    latest = store.latest_model()
    assert latest is not None and (latest.version, latest.path) == (1, "/ckpt/1")


def test_bad_rollout_input(store):
    with pytest.raises(InvalidData):
        store.create_rollout([1], "g").result()  # type: ignore[arg-type]
    with pytest.raises(InvalidData):
        store.create_rollout({}, "").result()
    with pytest.raises(InvalidData, match="mode"):
        store.create_rollout({}, "g", "test").result()
    assert counts(store) == (0, 0, 0)


# ------------------------------------------------------------------ cursors and groups


def test_terminal_rollouts_after_a_cursor_in_end_order(store):
    a, b, c = (_drive_to(store, Status.RUNNING) for _ in range(3))
    store.transition(b, Status.SUCCEEDED).result()
    store.transition(a, Status.FAILED, failure_kind="task").result()
    first = store.terminal_after(0)
    assert [r.id for r in first] == [b, a]
    cursor = first[-1].end_seq
    assert cursor is not None and store.terminal_after(cursor) == []
    store.transition(c, Status.CANCELLED).result()
    assert [r.id for r in store.terminal_after(cursor)] == [c]
    assert [r.id for r in store.terminal_after(0, limit=1)] == [b]


def test_rollouts_listed_by_group_and_status(store):
    ids = [store.create_rollout({}, "g1").result().rollout.id for _ in range(3)]
    store.create_rollout({}, "g2").result()
    assert {r.id for r in store.list_rollouts(group="g1")} == set(ids)
    for rid in ids[:2]:
        store.transition(rid, Status.RUNNING).result()
        store.transition(rid, Status.SUCCEEDED).result()
    assert {r.id for r in store.list_rollouts(group="g1", status="succeeded")} == set(ids[:2])
    assert store.list_rollouts(group="g3") == []


# ------------------------------------------------------------------ concurrency


def test_concurrent_writers_lose_nothing(store):
    rids = [_drive_to(store, Status.RUNNING) for _ in range(8)]
    errors: list[BaseException] = []

    def thread_writer(k: int) -> None:
        try:
            for i in range(50):
                store.append_call(make_call(rids[k % 8], n_response=1 + i % 5)).result()
                store.append_event(rids[k % 8], "harness", {"k": k, "i": i}).result()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    async def async_writers() -> None:
        async def one(k: int) -> None:
            for _ in range(50):
                await asyncio.wrap_future(store.append_call(make_call(rids[k % 8])))
                await asyncio.wrap_future(store.append_event(rids[k % 8], "harness", {"k": k}))

        await asyncio.gather(*(one(k) for k in range(16)))

    threads = [threading.Thread(target=thread_writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    asyncio.run(async_writers())
    for t in threads:
        t.join()
    assert not errors
    got = store.calls_for(rids)
    assert sum(len(v) for v in got.values()) == (8 + 16) * 50
    for cs in got.values():
        assert [c.seq for c in cs] == list(range(len(cs)))  # no gaps, no duplicates
    assert sum(len(kinds(store, rid, "harness")) for rid in rids) == (8 + 16) * 50


def _checkpointed_calls(db) -> int:
    """The calls the database file itself holds, its write-ahead log unread: what checkpoints have
    copied. 0 while a checkpoint is halfway through the pages it copies."""
    try:
        with closing(sqlite3.connect(f"file:{db}?immutable=1", uri=True)) as conn:
            return conn.execute("SELECT count(*) FROM calls").fetchone()[0]
    except sqlite3.DatabaseError:
        return 0


@pytest.mark.parametrize("every_s", [0.05, 0.0])
def test_sqlite_checkpoints_beside_the_writer(tmp_path, every_s):
    """The write-ahead log is copied into the database by the store's checkpoint thread, not
    inside a commit (with 0, by SQLite's own checkpoint: only once the log passes 1,000 pages),
    and the log is reused rather than grown."""
    db = tmp_path / "agl.db"
    wal = tmp_path / "agl.db-wal"
    settings = StoreSettings(sqlite_checkpoint_s=every_s)
    wal_sizes = []
    with Store(f"sqlite:///{db}", settings) as store:
        rid = _drive_to(store, Status.RUNNING)
        for round_ in range(4):
            before = db.stat().st_size
            for i in range(20):  # about 80 pages of log: 16 KiB of new prompt IDs each
                start = (round_ * 20 + i) * 4096
                call = replace(make_call(rid), prompt_ids=array("i", range(start, start + 4096)))
                store.append_call(call).result()
            written = (round_ + 1) * 20
            deadline = time.monotonic() + 10
            while every_s and _checkpointed_calls(db) < written and time.monotonic() < deadline:
                time.sleep(0.02)
            assert (db.stat().st_size > before) == bool(every_s)
            # with the thread, the next round starts once a checkpoint has caught up with this one
            assert (_checkpointed_calls(db) == written) == bool(every_s)
            wal_sizes.append(wal.stat().st_size)
        assert len(store.calls_for([rid])[rid]) == 80
    if every_s:
        # Each round's calls are written over the log the checkpoint before them caught up with.
        assert wal_sizes[-1] < 2 * wal_sizes[0]
    else:
        assert wal_sizes[-1] > 3 * wal_sizes[0]
    with Store(f"sqlite:///{db}") as store:
        assert len(store.calls_for([rid])[rid]) == 80


def test_a_burst_between_the_checkpoint_threads_turns_keeps_the_log_bounded(tmp_path):
    """160 MiB written in a burst while the checkpoint thread's turn is an hour away: the log is
    checkpointed as it grows (the thread called early, or the writer past SQLITE_WAL_BOUND), so it
    stays near the bound and the database grows during the burst. Unchecked, the log would hold
    the whole burst."""
    db = tmp_path / "agl.db"
    wal = tmp_path / "agl.db-wal"
    settings = StoreSettings(sqlite_checkpoint_s=3600)
    tokens = 1_048_576  # 4 MiB of prompt IDs a call
    wal_sizes = []
    with Store(f"sqlite:///{db}", settings) as store:
        rid = _drive_to(store, Status.RUNNING)
        for i in range(40):
            ids = array("i", range(i * tokens, (i + 1) * tokens))  # unrelated prompts: stored whole
            store.append_call(replace(make_call(rid), prompt_ids=ids)).result()
            wal_sizes.append(wal.stat().st_size)
        assert db.stat().st_size > 20 * 4 * tokens
        assert len(store.calls_for([rid])[rid]) == 40
    assert max(wal_sizes) < 1.5 * SQLITE_WAL_BOUND < 40 * 4 * tokens


def test_after_a_burst_small_writes_do_not_call_the_checkpoint_thread_each(tmp_path, monkeypatch):
    """A burst grows the log's file past a quarter of SQLITE_WAL_BOUND (the size at which the
    writer calls the checkpoint thread early); once reused, the file is cut back to that size, so
    the small writes after it leave the thread to its own turns (it was called after every commit,
    a checkpoint per call)."""
    db = tmp_path / "agl.db"
    wal = tmp_path / "agl.db-wal"
    settings = StoreSettings(sqlite_checkpoint_s=3600)
    tokens = 1_048_576  # 4 MiB of prompt IDs a call
    with Store(f"sqlite:///{db}", settings) as store:
        checkpoints = []
        checkpoint = store._writer._checkpoint
        monkeypatch.setattr(store._writer, "_checkpoint", lambda: checkpoints.append(checkpoint()))
        rid = _drive_to(store, Status.RUNNING)
        for i in range(8):
            ids = array("i", range(i * tokens, (i + 1) * tokens))
            store.append_call(replace(make_call(rid), prompt_ids=ids)).result()
        assert checkpoints  # the thread was called early
        store._writer._checkpoint()  # once the thread's has ended: the log is copied whole
        after_burst = len(checkpoints)
        for _ in range(50):
            store.append_call(make_call(rid)).result()
        assert len(checkpoints) <= after_burst + 1
        assert wal.stat().st_size <= SQLITE_WAL_BOUND // 4


def test_a_failing_write_does_not_disturb_its_group(store):
    """Good and bad writes committed in the same group: the bad ones are undone, the rest land."""
    rid = _drive_to(store, Status.RUNNING)

    async def main() -> list[object]:
        jobs = []
        for i in range(200):
            target = rid if i % 2 else "missing"
            jobs.append(asyncio.wrap_future(store.append_call(make_call(target))))
        return await asyncio.gather(*jobs, return_exceptions=True)

    results = asyncio.run(main())
    assert sum(isinstance(r, NotFound) for r in results) == 100
    assert [c.seq for c in store.calls_for([rid])[rid]] == list(range(100))


def test_a_write_cancelled_while_queued_does_not_disturb_its_group(store):
    """asyncio cancels the future it wraps when the awaiting task is cancelled (a client gone): the
    others in that write's group still get their results, and the cancelled write still lands."""
    rid = _drive_to(store, Status.RUNNING)
    started = threading.Event()
    release = threading.Event()

    def hold_the_writer(conn: sa.Connection) -> None:
        started.set()
        release.wait(10)

    store._writer.submit(hold_the_writer)
    assert started.wait(10)
    futures = [store.append_call(make_call(rid)) for _ in range(3)]
    assert futures[1].cancel()
    release.set()
    assert [futures[0].result(timeout=10).seq, futures[2].result(timeout=10).seq] == [0, 2]
    assert [c.seq for c in store.calls_for([rid])[rid]] == [0, 1, 2]


def test_a_write_that_raises_after_writing_is_undone_alone_or_in_a_group(store):
    """A group is one transaction, redone one write at a time when a write fails: a write that
    raises must leave nothing behind, whether it ran alone or among others, and the writes around
    it (and the next group) land once."""
    rid = _drive_to(store, Status.RUNNING)
    started = threading.Event()
    release = threading.Event()

    def write_then_fail(conn: sa.Connection) -> None:
        conn.execute(
            events.insert(),
            {"rollout_id": rid, "attempt": 1, "kind": "partial", "data": {}, "created_at": 0},
        )
        raise InvalidData("refused after writing")

    def hold_the_writer(conn: sa.Connection) -> None:
        started.set()
        release.wait(10)

    with pytest.raises(InvalidData, match="refused after writing"):
        store._writer.submit(write_then_fail).result(timeout=10)  # a group of one
    assert store.append_call(make_call(rid)).result(timeout=10).seq == 0
    store._writer.submit(hold_the_writer)
    assert started.wait(10)
    futures = [
        store.append_call(make_call(rid)),
        store._writer.submit(write_then_fail),
        store.append_call(make_call(rid)),
    ]
    futures.append(store.append_event(rid, "harness", {"k": 1}))
    release.set()
    assert [futures[0].result(timeout=10).seq, futures[2].result(timeout=10).seq] == [1, 2]
    with pytest.raises(InvalidData, match="refused after writing"):
        futures[1].result(timeout=10)
    assert futures[3].result(timeout=10).kind == "harness"
    assert [c.seq for c in store.calls_for([rid])[rid]] == [0, 1, 2]
    assert kinds(store, rid, "partial") == []
    assert len(kinds(store, rid, "harness")) == 1


def test_async_reads_and_rollout_creation(store):
    async def main() -> None:
        created = await asyncio.wrap_future(store.create_rollout({"t": 1}, "g", grader=False))
        r = await asyncio.wrap_future(store.transition(created.rollout.id, "running"))
        assert r.status is Status.RUNNING
        assert await asyncio.to_thread(store.get_rollout, r.id) == r
        await asyncio.wrap_future(store.set_reward(r.id, 0.5))
        await asyncio.wrap_future(store.register_model(ModelVersion(version=7)))
        assert (await asyncio.to_thread(store.get_rollout, r.id)).reward == 0.5

    asyncio.run(main())


# ------------------------------------------------------------------ schema and migrations


def test_reopening_keeps_data_and_schema_matches_migrations(db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from agl.store import metadata

    with Store(db_url) as store:
        rid = store.create_rollout({}, "g").result().rollout.id
    with Store(db_url) as store:
        assert store.get_rollout(rid).status is Status.QUEUED
        with store._write_engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


def test_calls_recorded_before_the_temperature_column_read_as_unknown(db_url):
    """A store made by the first schema is upgraded in place: its calls keep everything, with no
    temperature."""
    from alembic import command
    from alembic.config import Config

    from agl.store import MIGRATIONS

    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
        conn.execute(
            sa.text(
                "INSERT INTO rollouts (id, task, group_id, mode, status, attempt, metadata,"
                " agent_token_hash, n_calls, created_at)"
                " VALUES ('r', '{}', 'g', 'train', 'running', 1, '{}', 'h', 1, 0)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO calls (rollout_id, attempt, seq, agent, model_version, request,"
                " response, prompt_ids, response_ids, logprobs, finish_reason, latency_ms,"
                " created_at)"
                " VALUES ('r', 1, 0, 'a', 0, '{}', '{}', :p, :p, :l, 'stop', 1, 0)"
            ),
            {"p": array("i", [5]).tobytes(), "l": array("f", [-0.5]).tobytes()},
        )
    engine.dispose()
    with Store(db_url) as store:
        (old,) = store.calls_for(["r"])["r"]
        assert old.temperature is None and list(old.response_ids) == [5]
        new = store.append_call(
            Call(
                rollout_id="r",
                prompt_ids=array("i", [5]),
                response_ids=array("i", [6]),
                logprobs=array("f", [-0.1]),
                temperature=0.0,
            )
        ).result()
        assert store.calls_for(["r"])["r"][1].temperature == 0.0 and new.seq == 1


def test_a_newer_schema_is_refused_clearly(db_url):
    Store(db_url).close()
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999_future'")
    engine.dispose()
    with pytest.raises(SchemaTooNew, match="newer than this agl"):
        Store(db_url)


def test_in_memory_sqlite_is_refused():
    with pytest.raises(StoreError, match="file URL"):
        Store("sqlite://")


def test_closed_store_refuses_writes(db_url):
    store = Store(db_url)
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.create_rollout({}, "g").result()


def test_a_write_the_database_rejects_is_isolated_from_its_group(store):
    """A bulk run that the database refuses is retried write by write: only the bad one fails."""
    good = _drive_to(store, Status.RUNNING)
    bad = _drive_to(store, Status.RUNNING)
    # A row the store did not count: seq 0 of `bad` is taken.
    with store._write_engine.begin() as conn:
        conn.execute(
            calls.insert().values(
                rollout_id=bad,
                attempt=1,
                seq=0,
                agent="",
                model_version=0,
                request={},
                response={},
                prompt_ids=b"",
                response_ids=b"",
                logprobs=b"",
                finish_reason="stop",
                latency_ms=0.0,
                created_at=0.0,
            )
        )

    async def main() -> list[object]:
        jobs = [
            asyncio.wrap_future(store.append_call(make_call(good if i % 3 else bad)))
            for i in range(30)
        ]
        return await asyncio.gather(*jobs, return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, InvalidData) for r in results[::3])
    assert all(isinstance(r, Call) for i, r in enumerate(results) if i % 3)
    assert [c.seq for c in store.calls_for([good])[good]] == list(range(20))


def test_writes_go_on_after_the_database_drops_the_writers_connection(store):
    """The writer keeps one connection; when the server ends it (a PostgreSQL restart, a proxy's
    idle timeout), the next group reconnects and commits instead of failing its writers."""
    rid = _drive_to(store, Status.RUNNING)
    store.append_call(make_call(rid)).result()
    if store._write_engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no server to drop a connection")
    with store._read_engine.connect() as conn:  # ends every other session of this database
        conn.exec_driver_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    assert store.append_call(make_call(rid)).result().seq == 1
    assert [c.seq for c in store.calls_for([rid])[rid]] == [0, 1]


def test_writes_racing_close_are_committed_or_refused_none_left_waiting(db_url):
    """close() while threads write: each write is either refused at once (StoreError) or
    committed; none is queued behind the writer's stop and left waiting forever."""
    store = Store(db_url)
    rid = _drive_to(store, Status.RUNNING)
    futures: list = []
    refused: list[StoreError] = []

    def write() -> None:
        while True:
            try:
                futures.append(store.append_event(rid, "tick"))
            except StoreError as e:
                refused.append(e)
                return

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    while len(futures) < 200:
        time.sleep(0.001)
    store.close()
    for t in threads:
        t.join()
    assert len(refused) == 4
    assert all(f.result(timeout=10).kind == "tick" for f in futures)
    with Store(db_url) as again:
        assert len(kinds(again, rid, "tick")) == len(futures)
