"""Gateway replicas: 1 and 2 behind HAProxy over one PostgreSQL, one killed under load, a pause.

Everything is a real process on 127.0.0.1: the engine stand-in of bench/gateway.py (an instant
sglang `/generate`), N `agl gateway` processes on one PostgreSQL database, and HAProxy (Debian's
package) round-robining between them, as a cluster's Service would; it knows nothing of rollouts.
`--db` names the server (default: AGL_TEST_POSTGRES_URL); each run makes a database of its own
and drops it.

1. 1 replica, 2 round-robin, and 2 sticky by token (a consistent hash of the `Authorization`
   header), each with the same clients through the balancer: `--clients` conversations of
   `--calls` calls at once (each call sends the conversation so far, its replies included, as an
   agent does, so a round-robin replica continues conversations another recorded), for calls/s
   and CPU per call; then `--latency-calls` calls one at a time, for the p50 added over calling
   the stand-in directly. The three alternate, on fresh stacks, for `--rounds` rounds, so that a
   slow phase of the machine falls on each; a stack's first few calls are not counted.
2. Kill: `--kill-rollouts` harnesses calling through 2 replicas (retrying refused connections and
   the balancer's 502/503, as SDKs do); one replica is SIGKILLed under load and restarted.
   Counted as bench/soak.py counts: `lost` (answered, not recorded) and `duplicated` (one request
   recorded twice).
3. Pause: while harnesses call through 2 replicas, `POST /api/pause` through the balancer; once it
   returns, each replica is asked directly whether it is paused with nothing in flight.

Two cores limit what 2 replicas can show here (the stand-in, HAProxy, PostgreSQL and the clients
share them): the figure to compare is the CPU a call costs the gateways and PostgreSQL together
(their processes' user + system CPU over the phases, from /proc, divided by their calls). Last line:
`replicas_1_calls_per_s=A replicas_2_calls_per_s=B replica_kill_lost=L replica_kill_duplicated=D
pause_drained_all=P replicas_1_cpu_ms=C1 replicas_2_cpu_ms=C2 replicas_2_sticky_cpu_ms=S2
replicas_2_cpu_ratio=R` (C: one replica; C2: two, round-robin; S2: two, sticky by token; R:
C2 / C1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.gateway import cpu_s
from bench.quick import parse_args
from bench.soak import Tally, call, create, harness, reconcile, session
from bench.stack import ADMIN_HEADERS, Balanced, balanced

# the throughput phases' configurations: (replicas, sticky by token)
CONFIGS = ((1, False), (2, False), (2, True))
# a fresh stack's first calls, not counted: its processes' first requests import and warm caches
WARM_CLIENTS = 8
WARM_CALLS = 3


def postgres_cpu_s() -> float:
    """CPU seconds used so far by this machine's PostgreSQL processes (the server the bench uses,
    when it runs here)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if stat.read_text().strip() == "postgres":
                total += cpu_s(int(stat.parent.name))
    return total


async def conversation(
    client: aiohttp.ClientSession, url: str, rollout: dict, tally: Tally, calls: int
) -> None:
    """A harness that holds one conversation, as an agent does: each call sends the whole
    conversation so far, every reply included, and one new user turn."""
    headers = {"Authorization": f"Bearer {rollout['agent_token']}"}
    messages: list[dict] = []
    for j in range(calls):
        tag = f"{rollout['id']}.{j}"
        messages.append({"role": "user", "content": tag})
        body = {"model": "soak", "messages": messages, "max_tokens": 64}
        async with client.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status != 200:
                tally.errors.append(f"{tag}: {r.status} {(await r.text())[:200]}")
                return
            reply = (await r.json())["choices"][0]["message"]
        tally.answered.add(tag)
        messages.append({"role": "assistant", "content": reply["content"]})


@dataclass
class Phase:
    """One configuration's throughput phases, summed over the rounds."""

    calls: int = 0
    seconds: float = 0.0
    gateway_cpu_s: float = 0.0
    database_cpu_s: float = 0.0
    # each latency call through the balancer minus its direct call to the stand-in
    added_s: list[float] = field(default_factory=list)

    def calls_per_s(self) -> float:
        return self.calls / self.seconds

    def cpu_ms(self) -> float:
        """Gateways' and PostgreSQL's CPU per call."""
        return (self.gateway_cpu_s + self.database_cpu_s) * 1e3 / self.calls


async def throughput(stack: Balanced, clients: int, calls: int, phase: Phase) -> None:
    """`clients` conversations of `calls` calls at once, adding to `phase` the calls, the time
    and the CPU the gateways and the database spent on them."""
    async with session() as client:
        made = await create(client, stack.url, clients, "throughput")
        tally = Tally()
        gateways = [proc.pid for name, proc in stack.procs.items() if name.startswith("gateway")]
        gateway_cpu = sum(cpu_s(pid) for pid in gateways)
        database_cpu = postgres_cpu_s()
        started = time.perf_counter()
        await asyncio.gather(*(conversation(client, stack.url, r, tally, calls) for r in made))
        phase.seconds += time.perf_counter() - started
        assert not tally.errors, tally.errors[:3]
        phase.calls += len(tally.answered)
        phase.gateway_cpu_s += sum(cpu_s(pid) for pid in gateways) - gateway_cpu
        phase.database_cpu_s += postgres_cpu_s() - database_cpu


async def added_latency(stack: Balanced, calls: int, phase: Phase) -> None:
    """`calls` calls one at a time, each followed by one straight to the stand-in: what a call
    through the balancer and a gateway adds."""
    async with session() as client:
        (made,) = await create(client, stack.url, 1, "latency")
        for i in range(calls):
            t0 = time.perf_counter()
            status, _ = await call(client, stack.url, made["agent_token"], f"latency {i}")
            through = time.perf_counter() - t0
            assert status == 200
            body = {"input_ids": list(range(20)), "sampling_params": {"max_new_tokens": 64}}
            t0 = time.perf_counter()
            async with client.post(stack.engine + "/generate", json=body) as r:
                await r.read()
            phase.added_s.append(through - (time.perf_counter() - t0))


async def replica_kill(stack: Balanced, rollouts: int, calls: int) -> dict:
    """Harnesses through 2 replicas; replica 1 SIGKILLed halfway and restarted."""
    async with session() as client:
        made = await create(client, stack.url, rollouts, "kill")
        tally = Tally()
        work = asyncio.gather(
            *(harness(client, stack.url, r, tally, calls=calls, retry_s=120) for r in made)
        )
        while len(tally.answered) < rollouts * calls / 2 and not work.done():
            await asyncio.sleep(0.01)
        stack.kill(stack.name(1))
        await asyncio.to_thread(stack.start_replica, 1)
        await work
    out = reconcile(stack.db, [r["id"] for r in made], tally)
    return out | {"answered": len(tally.answered), "errors": len(tally.errors)}


async def pause_drains_all(stack: Balanced, harnesses: int) -> bool:
    """A pause through the balancer under load: afterwards every replica is paused and idle."""
    async with session() as client:
        made = await create(client, stack.url, harnesses, "pause")
        tally, stop = Tally(), asyncio.Event()
        work = asyncio.gather(
            *(harness(client, stack.url, r, tally, calls=None, stop=stop) for r in made)
        )
        while len(tally.answered) < harnesses:
            await asyncio.sleep(0.01)
        async with client.post(stack.url + "/api/pause", headers=ADMIN_HEADERS) as r:
            assert r.status == 200, await r.text()
        states = []
        for i in range(len(stack.ports)):
            async with client.get(stack.replica(i) + "/api/state", headers=ADMIN_HEADERS) as r:
                states.append(await r.json())
        async with client.post(stack.url + "/api/resume", headers=ADMIN_HEADERS) as r:
            assert r.status == 200, await r.text()
        stop.set()
        await work
        assert not tally.errors, tally.errors[:3]
    return all(s["paused"] and s["inflight"] == 0 for s in states)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--db",
        default=os.environ.get("AGL_TEST_POSTGRES_URL", ""),
        help="a PostgreSQL server's URL (default: AGL_TEST_POSTGRES_URL)",
    )
    parser.add_argument("--clients", type=int, default=64, help="harnesses at once")
    parser.add_argument("--calls", type=int, default=20, help="calls per harness")
    parser.add_argument("--latency-calls", type=int, default=200, help="calls one at a time")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three configurations")
    parser.add_argument("--kill-rollouts", type=int, default=200)
    parser.add_argument("--kill-calls", type=int, default=5)
    args = parse_args(
        parser, clients=8, calls=5, latency_calls=20, rounds=1, kill_rollouts=20, kill_calls=3
    )
    if not args.db:
        raise SystemExit("needs a PostgreSQL server: --db or AGL_TEST_POSTGRES_URL")
    figures = {config: Phase() for config in CONFIGS}
    for _ in range(args.rounds):
        for (replicas, sticky), phase in figures.items():
            with balanced(args.db, replicas, sticky=sticky) as stack:
                asyncio.run(throughput(stack, WARM_CLIENTS, WARM_CALLS, Phase()))
                asyncio.run(throughput(stack, args.clients, args.calls, phase))
                asyncio.run(added_latency(stack, args.latency_calls, phase))
    for (replicas, sticky), phase in figures.items():
        balance = "sticky by token" if sticky else "round-robin"
        if replicas == 1:
            balance = "alone"
        print(
            f"{replicas} replica(s), {balance}: {phase.calls_per_s():.0f} calls/s with "
            f"{args.clients} conversations, p50 added "
            f"{statistics.median(phase.added_s) * 1e3:.2f} ms; CPU per call: gateways "
            f"{phase.gateway_cpu_s * 1e3 / phase.calls:.2f} ms, PostgreSQL "
            f"{phase.database_cpu_s * 1e3 / phase.calls:.2f} ms",
            flush=True,
        )
    with balanced(args.db, 2) as stack:
        kill = asyncio.run(replica_kill(stack, args.kill_rollouts, args.kill_calls))
        print(f"replica SIGKILL under {args.kill_rollouts} harnesses: {kill}", flush=True)
        drained = asyncio.run(pause_drains_all(stack, args.clients))
        print(f"pause through the balancer: every replica paused and idle: {drained}", flush=True)
    one = figures[1, False].calls_per_s()
    round_robin = figures[2, False].calls_per_s()
    sticky = figures[2, True].calls_per_s()
    cpu = {config: phase.cpu_ms() for config, phase in figures.items()}
    print(
        f"2 replicas / 1: {round_robin / one:.2f}x calls/s round-robin, {sticky / one:.2f}x "
        "sticky (two cores shared by everything); CPU per call (gateways + PostgreSQL) "
        f"{cpu[2, False] / cpu[1, False]:.2f}x round-robin, {cpu[2, True] / cpu[1, False]:.2f}x "
        "sticky"
    )
    print(
        f"replicas_1_calls_per_s={one:.0f} "
        f"replicas_2_calls_per_s={round_robin:.0f} "
        f"replica_kill_lost={kill['lost']} replica_kill_duplicated={kill['duplicated']} "
        f"pause_drained_all={int(drained)} "
        f"replicas_1_cpu_ms={cpu[1, False]:.2f} replicas_2_cpu_ms={cpu[2, False]:.2f} "
        f"replicas_2_sticky_cpu_ms={cpu[2, True]:.2f} "
        f"replicas_2_cpu_ratio={cpu[2, False] / cpu[1, False]:.2f}"
    )


if __name__ == "__main__":
    main()
