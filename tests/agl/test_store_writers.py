"""Two stores writing one PostgreSQL database at once, as two gateway replicas do.

Each `Store` has one writer thread; two of them are two writers whose transactions interleave on
the server. What must hold whatever the interleaving:
- a rollout's calls get unique, dense seq numbers, and read back whole, even when consecutive
  calls of one conversation were recorded by different writers (each writer chains a call to
  the last call it saw; the stored base names that call's seq, so it reads back exactly);
- the trainer's cursor over ended rollouts (`terminal_after`) sees every end exactly once,
  whatever order the writers' transactions commit in.
"""

from __future__ import annotations

import threading
from array import array

import pytest

from agl.store import Store
from agl.types import Call, Status

pytestmark = pytest.mark.postgres


def running(store: Store, group: str) -> str:
    rollout_id = store.create_rollout({}, group).result().rollout.id
    store.transition(rollout_id, Status.RUNNING).result()
    return rollout_id


def call(rollout_id: str, prompt: list[int], response: list[int]) -> Call:
    return Call(
        rollout_id=rollout_id,
        prompt_ids=array("i", prompt),
        response_ids=array("i", response),
        logprobs=array("f", [-0.5] * len(response)),
        request={"messages": [{"role": "user", "content": str(len(prompt))}]},
    )


def test_two_writers_keep_seq_numbers_dense_and_chains_whole(postgres_url):
    with Store(postgres_url) as a, Store(postgres_url) as b:
        rollout_ids = [running(a, "g") for _ in range(4)]
        written: dict[str, list[list[int]]] = {rid: [] for rid in rollout_ids}
        errors: list[BaseException] = []

        def converse(rollout_id: str, writer: int) -> None:
            """One conversation per thread, each call alternately through `a` and `b`."""
            prompt = [writer, 7, 7]
            try:
                for turn in range(30):
                    response = [1000 + turn, writer]
                    store = (a, b)[(turn + writer) % 2]
                    store.append_call(call(rollout_id, prompt, response)).result()
                    written[rollout_id].append(prompt)
                    prompt = [*prompt, *response, 500 + turn]
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        # Two conversations per rollout, so both writers append to each rollout at once.
        threads = [
            threading.Thread(target=converse, args=(rid, writer))
            for rid in rollout_ids
            for writer in (0, 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        got = a.calls_for(rollout_ids)
        for rid in rollout_ids:
            calls = got[rid]
            assert [c.seq for c in calls] == list(range(60))  # unique and dense
            stored = sorted(list(c.prompt_ids) for c in calls)
            assert stored == sorted(written[rid])  # every prompt reads back whole


def test_every_end_is_seen_once_whatever_order_the_writers_commit_in(postgres_url):
    with Store(postgres_url) as a, Store(postgres_url) as b:
        per_writer = 150
        to_end = {store: [running(a, "g") for _ in range(per_writer)] for store in (a, b)}
        seen: list[str] = []
        done = threading.Event()

        def page() -> None:
            """The trainer: pages through ended rollouts while they end."""
            cursor = 0
            while True:
                finished = done.is_set()
                for rollout in a.terminal_after(cursor):
                    seen.append(rollout.id)
                    assert rollout.end_seq is not None
                    cursor = rollout.end_seq
                if finished:
                    return

        def end(store: Store) -> None:
            futures = [store.transition(rid, Status.SUCCEEDED) for rid in to_end[store]]
            for future in futures:
                future.result()

        reader = threading.Thread(target=page)
        reader.start()
        writers = [threading.Thread(target=end, args=(store,)) for store in (a, b)]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        done.set()
        reader.join()
        ended = [rid for rids in to_end.values() for rid in rids]
        assert sorted(seen) == sorted(ended)  # each once: none skipped, none twice
