"""Who is calling: the caller record the auth dependencies leave (its role, and its rollout for
a token), and the token cache, which keeps roles and forgets a rollout with its last token."""

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from agl.store import Created, hash_token
from agl.types import Mode, Rollout, Status
from gateway.auth import Auth, Caller, Role, Tokens


def rollout(rollout_id: str, status: Status = Status.QUEUED) -> Rollout:
    return Rollout(id=rollout_id, task={}, group="g", mode=Mode.TRAIN, status=status)


def test_a_caller_names_its_credential_as_messages_and_reward_sources_do() -> None:
    assert Caller(role=Role.ADMIN).credential == "admin"
    assert Caller(role=Role.AGENT, rollout=rollout("r")).credential == "agent token"
    assert Caller(role=Role.GRADER, rollout=rollout("r")).credential == "grader token"


def test_the_token_cache_keeps_roles_and_forgets_a_rollout_with_its_last_token() -> None:
    unused: Any = None  # the store: read only on a lookup of a token not cached
    tokens = Tokens(unused, size=2)
    tokens.issued(Created(rollout=rollout("a"), agent_token="a-agent", grader_token="a-grader"))
    roles = {digest: role for digest, (_, role) in tokens.found.items()}
    assert roles == {hash_token("a-agent"): Role.AGENT, hash_token("a-grader"): Role.GRADER}
    running = rollout("a", Status.RUNNING)
    tokens.changed("a", running)
    assert tokens.found[hash_token("a-grader")] == (running, Role.GRADER)
    tokens.issued(Created(rollout=rollout("b"), agent_token="b-agent", grader_token=None))
    tokens.issued(Created(rollout=rollout("c"), agent_token="c-agent", grader_token=None))
    assert set(tokens.found) == {hash_token("b-agent"), hash_token("c-agent")}
    assert set(tokens.of_rollout) == {"b", "c"}  # none left of "a": its entry went too


@pytest.mark.parametrize("single_process", [True, False])
def test_a_cached_token_is_read_again_only_where_a_replica_may_change_its_rollout(
    single_process: bool,
) -> None:
    """A store that serves one gateway process (SQLite) changes only through it, and the gateway
    follows its own changes (`Tokens.changed`): a cached token is not read again, where each call
    of a rollout whose calls came over `TTL_S` apart paid a thread switch and a query. With
    replicas it is read again once `TTL_S` old."""
    running = rollout("a", Status.RUNNING)
    reads = []

    def token_holders(digests: list[str]) -> dict[str, tuple[Rollout, str]]:
        reads.append(digests)
        return {hash_token("a-agent"): (running, "agent")}

    store: Any = SimpleNamespace(single_process=single_process, token_holders=token_holders)
    auth = Auth("admin", store)
    auth.tokens.issued(Created(rollout=running, agent_token="a-agent", grader_token=None))
    auth.tokens.read_at[hash_token("a-agent")] -= Tokens.TTL_S  # read that long ago
    assert asyncio.run(auth.tokens.lookup("a-agent")) == (running, Role.AGENT)
    assert len(reads) == (0 if single_process else 1)


def test_with_replicas_the_tokens_read_ttl_ago_are_read_again_in_one_read() -> None:
    """A replica that serves every rollout's calls (round-robin) holds every token: they go stale
    together and are read again together, in one read. A token its rollout no longer holds
    (rotated by another replica) is dropped, and its next lookup reads it alone (here: unknown,
    401); one the gateway changed during the read keeps its change."""
    stale = [rollout(name, Status.RUNNING) for name in "abc"]
    ended = rollout("c", Status.SUCCEEDED)
    reads: list[Any] = []

    def token_holders(digests: list[str]) -> dict[str, tuple[Rollout, str]]:
        reads.append(sorted(digests))
        tokens.changed("c", ended)  # the gateway's own change, while the read is under way
        return {
            hash_token("a-agent"): (stale[0], "agent"),
            hash_token("c-agent"): (stale[2], "agent"),
        }

    def rollout_for_token(token: str) -> None:
        reads.append(token)

    store: Any = SimpleNamespace(
        single_process=False, token_holders=token_holders, rollout_for_token=rollout_for_token
    )
    tokens = Tokens(store)
    for r in stale:
        tokens.issued(Created(rollout=r, agent_token=f"{r.id}-agent", grader_token=None))
        tokens.read_at[hash_token(f"{r.id}-agent")] -= Tokens.TTL_S

    async def lookups() -> list[Any]:
        return await asyncio.gather(*(tokens.lookup(f"{r.id}-agent") for r in stale))

    assert asyncio.run(lookups()) == [(stale[0], Role.AGENT), None, (ended, Role.AGENT)]
    assert reads == [sorted(hash_token(f"{r.id}-agent") for r in stale), "b-agent"]
