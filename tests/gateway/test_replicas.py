"""Gateway replicas over one PostgreSQL behind a real load balancer, each a real process.

HAProxy (Debian's package) round-robins between `agl gateway` processes sharing one database, as
a cluster's Service would: it knows nothing of rollouts, so consecutive calls of one conversation
land on different replicas. The engine is bench/gateway.py's stand-in (an instant sglang
`/generate`; no GPU engine runs here). Harnesses are the real openai SDK. What is checked:
- any replica serves any call: a conversation whose calls alternate replicas is recorded whole,
  in one dense seq order, and the replay of a retried call works from another replica;
- a pause through the balancer returns once every replica has drained, a replica started
  during the pause starts paused, two pauses at once do not deadlock, and the resumed version
  is served by all;
- a replica SIGKILLed under load loses nothing and records nothing twice;
- an ended rollout's token is refused by every replica; the storage budget is one count;
- a second gateway on a SQLite store is refused at start, naming PostgreSQL;
- a replica that cannot reach the database answers 503 and says why on /healthz.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import sqlalchemy as sa

from agl.store import Store, calls
from bench import replicas
from bench.stack import ADMIN, ADMIN_HEADERS, Balanced, balanced, free_port

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
SERVER = os.environ.get("AGL_TEST_POSTGRES_URL", "")


@pytest.fixture
def fleet() -> Iterator[Balanced]:
    """The stand-in engine, two replicas on a fresh PostgreSQL database, HAProxy in front."""
    if not SERVER:
        pytest.skip("AGL_TEST_POSTGRES_URL is not set")
    if shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists():
        pytest.skip("needs HAProxy (CI installs Debian's package)")
    with balanced(SERVER, 2) as stack:
        yield stack


def admin(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers=ADMIN_HEADERS, timeout=60)


def rollout(url: str) -> dict:
    with admin(url) as client:
        reply = client.post("/api/rollouts", json={"task": {"q": 1}, "group": "g"})
        reply.raise_for_status()
        return dict(reply.json())


def test_a_conversation_whose_calls_alternate_replicas_is_recorded_whole(fleet: Balanced):
    made = rollout(fleet.url)
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key=made["agent_token"])
    messages = [{"role": "user", "content": "hello"}]
    for turn in range(8):
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=8)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": f"turn {turn}"},
        ]
    with Store(fleet.db) as store:
        calls = store.calls_for([made["id"]])[made["id"]]
    assert [c.seq for c in calls] == list(range(8))
    assert len({c.gateway for c in calls}) == 2  # round-robin: both replicas recorded
    for previous, call in itertools.pairwise(calls):
        # each prompt extends the previous call's prompt and reply: one token chain, read whole
        extended = list(previous.prompt_ids) + list(previous.response_ids)
        assert list(call.prompt_ids)[: len(extended)] == extended


def test_a_call_that_changed_replica_is_stored_as_the_extension_of_the_call_it_continues(
    fleet: Balanced,
):
    """A replica that caught up on the call another recorded stores its next call as that call's
    extension: each call's base is the one before it, and holds only the tokens it added. So a
    replica reading a call back goes one link to the call it recorded itself, however long the
    conversation (`Store.last_calls`)."""
    made = rollout(fleet.url)
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key=made["agent_token"])
    messages = [{"role": "user", "content": "hello"}]
    for turn in range(6):
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=8)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": f"turn {turn}"},
        ]
    with Store(fleet.db) as store:
        recorded = store.calls_for([made["id"]])[made["id"]]
        with store._read_engine.connect() as conn:
            query = sa.select(calls.c.base).where(calls.c.rollout_id == made["id"])
            bases = list(conn.execute(query.order_by(calls.c.seq)).scalars())
    assert len({c.gateway for c in recorded}) == 2
    assert [base and base["seq"] for base in bases] == [None, 0, 1, 2, 3, 4]
    for previous, base in zip(recorded[:-1], bases[1:], strict=True):
        assert base["prompt_from"] == len(previous.prompt_ids) + len(previous.response_ids)


def test_a_retry_of_a_call_another_replica_recorded_gets_the_recorded_reply(fleet: Balanced):
    """A replica that recorded a call may die before its reply leaves; the harness's retry lands
    on another replica, which answers with the recorded reply instead of sampling again."""
    made = rollout(fleet.url)
    body = {"model": "m", "messages": [{"role": "user", "content": "retry me"}], "max_tokens": 8}
    token = {"Authorization": f"Bearer {made['agent_token']}"}
    first = httpx.post(fleet.replica(0) + "/v1/chat/completions", json=body, headers=token)
    for _ in range(2):  # once as the other replica's first call of the rollout, once after
        again = httpx.post(fleet.replica(1) + "/v1/chat/completions", json=body, headers=token)
        assert again.json()["choices"] == first.json()["choices"]
    with Store(fleet.db) as store:
        assert len(store.calls_for([made["id"]])[made["id"]]) == 1


def test_a_pause_drains_every_replica_and_a_replica_started_during_it_starts_paused(
    fleet: Balanced,
):
    made = rollout(fleet.url)
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key=made["agent_token"])
    with admin(fleet.url) as through, admin(fleet.replica(0)) as r0, admin(fleet.replica(1)) as r1:
        # two pauses at once (two trainers): both return, sharing one epoch
        paused = []
        threads = [
            threading.Thread(target=lambda c=c: paused.append(c.post("/api/pause")))
            for c in (r0, r1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [p.status_code for p in paused] == [200, 200]
        assert all(c.get("/api/state").json()["paused"] for c in (r0, r1))
        fleet.start_replica(2)
        with admin(fleet.replica(2)) as r2:
            assert r2.get("/api/state").json()["paused"]  # started paused
            held: list[object] = []
            caller = threading.Thread(
                target=lambda: held.append(
                    client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "held"}], max_tokens=4
                    )
                )
            )
            caller.start()
            time.sleep(1.0)
            assert not held  # held by the pause, on whichever replica it reached
            assert through.post("/api/models", json={"version": 7}).status_code == 200
            assert through.post("/api/resume", json={"version": 7}).status_code == 200
            caller.join(30)
            assert held
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                states = [c.get("/api/state").json() for c in (r0, r1, r2)]
                if all(not s["paused"] and s["version"] == 7 for s in states):
                    break
                time.sleep(0.1)
            assert all(not s["paused"] and s["version"] == 7 for s in states), states


def test_a_replica_killed_under_load_loses_nothing_and_records_nothing_twice(fleet: Balanced):
    out = asyncio.run(replicas.replica_kill(fleet, rollouts=40, calls=4))
    assert out["errors"] == 0 and out["answered"] == 160
    assert out["lost"] == 0 and out["duplicated"] == 0 and out["seq_gaps"] == 0
    # the killed replica came back and serves again
    assert httpx.get(fleet.replica(1) + "/healthz").status_code == 200


def test_an_ended_rollouts_token_is_refused_by_every_replica(fleet: Balanced):
    made = rollout(fleet.url)
    token = {"Authorization": f"Bearer {made['agent_token']}"}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    for i in (0, 1):  # each replica has the token cached
        body["messages"][0]["content"] = f"call {i}"  # the same request again would be a replay
        reply = httpx.post(fleet.replica(i) + "/v1/chat/completions", json=body, headers=token)
        assert reply.status_code == 200
    with admin(fleet.replica(0)) as r0:
        assert r0.post(
            f"/api/rollouts/{made['id']}/status", json={"status": "cancelled"}
        ).is_success
    body["messages"][0]["content"] = "after the end"
    late = httpx.post(fleet.replica(1) + "/v1/chat/completions", json=body, headers=token)
    assert late.status_code in (403, 409)  # the cache's bound, or the store's refusal
    time.sleep(2.5)  # past the token cache's TTL
    later = httpx.post(fleet.replica(1) + "/v1/chat/completions", json=body, headers=token)
    assert later.status_code == 403
    with Store(fleet.db) as store:
        assert len(store.calls_for([made["id"]])[made["id"]]) == 2


def test_the_storage_budget_is_one_count_across_replicas(fleet: Balanced, tmp_path: Path):
    """Each replica's own count would let a rollout send twice its budget; the store's count,
    kept in each call's transaction, refuses the call that would pass it, on any replica."""
    budget = 12_000
    for i in (0, 1):
        fleet.kill(fleet.name(i))
        fleet.env["AGL_GATEWAY_ROLLOUT_MAX_BYTES"] = str(budget)
        fleet.start_replica(i)
    made = rollout(fleet.url)
    token = {"Authorization": f"Bearer {made['agent_token']}"}
    pad = "y" * 3_000
    statuses = []
    for k in range(8):
        body = {"model": "m", "messages": [{"role": "user", "content": f"{k} {pad}"}]}
        reply = httpx.post(
            fleet.replica(k % 2) + "/v1/chat/completions",
            json=body | {"max_tokens": 2},
            headers=token,
        )
        statuses.append(reply.status_code)
    assert statuses[:3] == [200, 200, 200] and 413 in statuses
    with Store(fleet.db) as store:
        assert store.sent_bytes(made["id"]) <= budget
        recorded = store.calls_for([made["id"]])[made["id"]]
    assert len(recorded) == statuses.count(200) < 8


def test_a_second_gateway_on_sqlite_is_refused_naming_postgresql(fleet: Balanced, tmp_path: Path):
    db = f"sqlite:///{tmp_path / 'one.db'}"
    argv = [sys.executable, "-m", "agl.cli", "gateway", "--engine-url", fleet.engine]
    argv += ["--db", db, "--admin-key", ADMIN]
    first_port = free_port()
    fleet.start("sqlite-first", [*argv, "--port", str(first_port)], healthz(first_port))
    second = subprocess.run(
        [*argv, "--port", str(free_port())],
        env=fleet.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode != 0
    assert "PostgreSQL" in second.stderr and "SQLite" in second.stderr
    fleet.kill("sqlite-first", signal.SIGTERM)
    # once the first has stopped, a gateway starts on the store again
    restarted_port = free_port()
    fleet.start("sqlite-again", [*argv, "--port", str(restarted_port)], healthz(restarted_port))


def healthz(port: int) -> str:
    return f"http://127.0.0.1:{port}/healthz"


class Forwarder:
    """A TCP forwarder to the PostgreSQL server that can be cut: the database out of reach."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.open = True
        self.writers: set[asyncio.StreamWriter] = set()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(10)

    async def _serve(self) -> None:
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers |= {writer, up_writer}

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def cut(self, open_: bool) -> None:
        """Refuses and drops every connection (`open_` False), or lets them through again."""

        def apply() -> None:
            self.open = open_
            if not open_:
                for writer in self.writers:
                    writer.close()
                self.writers.clear()

        self.loop.call_soon_threadsafe(apply)


def test_a_replica_that_cannot_reach_the_database_answers_503_and_says_why(fleet: Balanced):
    import sqlalchemy as sa

    url = sa.make_url(fleet.db)
    forwarder = Forwarder(url.host or "127.0.0.1", url.port or 5432)
    db = url.set(host="127.0.0.1", port=forwarder.port).render_as_string(hide_password=False)
    port = free_port()
    argv = [sys.executable, "-m", "agl.cli", "gateway", "--engine-url", fleet.engine]
    argv += ["--db", db, "--admin-key", ADMIN, "--port", str(port)]
    fleet.start("unreachable-db", argv, healthz(port))
    base = f"http://127.0.0.1:{port}"
    made = rollout(base)
    token = {"Authorization": f"Bearer {made['agent_token']}"}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    forwarder.cut(False)
    deadline = time.monotonic() + 15
    health = httpx.get(base + "/healthz")
    while health.status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
        health = httpx.get(base + "/healthz")
    assert health.status_code == 503 and "cannot be reached" in health.json()["store"]
    reply = httpx.post(base + "/v1/chat/completions", json=body, headers=token, timeout=60)
    assert reply.status_code == 503, reply.text
    forwarder.cut(True)
    deadline = time.monotonic() + 15
    while httpx.get(base + "/healthz").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.get(base + "/healthz").status_code == 200
    reply = httpx.post(base + "/v1/chat/completions", json=body, headers=token, timeout=60)
    assert reply.status_code == 200
