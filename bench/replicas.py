"""Gateway replicas: 1 and 2 behind HAProxy over one PostgreSQL, one killed under load, a pause.

Everything is a real process on 127.0.0.1: the engine stand-in of bench/gateway.py (an instant
sglang `/generate`), N `agl gateway` processes on one PostgreSQL database, and HAProxy (Debian's
package) round-robining between them, as a cluster's Service would; it knows nothing of rollouts.
`--db` names the server (default: AGL_TEST_POSTGRES_URL); each run makes a database of its own
and drops it.

1. 1 replica, then 2 round-robin, then 2 sticky by token (a consistent hash of the `Authorization`
   header), each with the same clients through the balancer: `--clients` harnesses of
   `--calls` calls each, for calls/s; then `--latency-calls` calls one at a time, for the p50
   added over calling the stand-in directly.
2. Kill: `--kill-rollouts` harnesses calling through 2 replicas (retrying refused connections and
   the balancer's 502/503, as SDKs do); one replica is SIGKILLed under load and restarted.
   Counted as bench/soak.py counts: `lost` (answered, not recorded) and `duplicated` (one request
   recorded twice).
3. Pause: while harnesses call through 2 replicas, `POST /api/pause` through the balancer; once it
   returns, each replica is asked directly whether it is paused with nothing in flight.

Two cores limit what 2 replicas can show here (the stand-in, HAProxy, PostgreSQL and the clients
share them): the figure to compare is the CPU a call costs the gateways and PostgreSQL together
(their processes' user + system CPU over the phase, from /proc, divided by its calls). Last line:
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
from pathlib import Path

from bench.gateway import cpu_s
from bench.quick import parse_args
from bench.soak import Tally, call, create, harness, reconcile, session
from bench.stack import ADMIN_HEADERS, Balanced, balanced


def postgres_cpu_s() -> float:
    """CPU seconds used so far by this machine's PostgreSQL processes (the server the bench uses,
    when it runs here)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if stat.read_text().strip() == "postgres":
                total += cpu_s(int(stat.parent.name))
    return total


async def throughput(stack: Balanced, clients: int, calls: int, latency_calls: int) -> dict:
    """Calls/s with `clients` harnesses at once, and the CPU each call cost the gateways and the
    database; then the p50 a call through the balancer adds."""
    async with session() as client:
        made = await create(client, stack.url, clients, "throughput")
        tally = Tally()
        gateways = [proc.pid for name, proc in stack.procs.items() if name.startswith("gateway")]
        gateway_cpu = sum(cpu_s(pid) for pid in gateways)
        database_cpu = postgres_cpu_s()
        started = time.perf_counter()
        await asyncio.gather(*(harness(client, stack.url, r, tally, calls=calls) for r in made))
        calls_per_s = len(tally.answered) / (time.perf_counter() - started)
        assert not tally.errors, tally.errors[:3]
        answered = len(tally.answered)
        gateway_ms = (sum(cpu_s(pid) for pid in gateways) - gateway_cpu) * 1e3 / answered
        database_ms = (postgres_cpu_s() - database_cpu) * 1e3 / answered
        token = made[0]["agent_token"]
        through, direct = [], []
        for i in range(latency_calls):
            t0 = time.perf_counter()
            status, _ = await call(client, stack.url, token, f"latency {i}")
            through.append(time.perf_counter() - t0)
            assert status == 200
            body = {"input_ids": list(range(20)), "sampling_params": {"max_new_tokens": 64}}
            t0 = time.perf_counter()
            async with client.post(stack.engine + "/generate", json=body) as r:
                await r.read()
            direct.append(time.perf_counter() - t0)
    added_ms = (statistics.median(through) - statistics.median(direct)) * 1e3
    return {
        "calls_per_s": calls_per_s,
        "added_p50_ms": added_ms,
        "gateway_cpu_ms": gateway_ms,
        "database_cpu_ms": database_ms,
    }


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
    parser.add_argument("--kill-rollouts", type=int, default=200)
    parser.add_argument("--kill-calls", type=int, default=5)
    args = parse_args(parser, clients=8, calls=5, latency_calls=20, kill_rollouts=20, kill_calls=3)
    if not args.db:
        raise SystemExit("needs a PostgreSQL server: --db or AGL_TEST_POSTGRES_URL")
    figures = {}
    for replicas, sticky in ((1, False), (2, False), (2, True)):
        with balanced(args.db, replicas, sticky=sticky) as stack:
            out = asyncio.run(throughput(stack, args.clients, args.calls, args.latency_calls))
        figures[replicas, sticky] = out
        balance = "sticky by token" if sticky else "round-robin"
        print(
            f"{replicas} replica(s), {balance}: {out['calls_per_s']:.0f} calls/s with {args.clients} "
            f"harnesses, p50 added {out['added_p50_ms']:.2f} ms; CPU per call: gateways "
            f"{out['gateway_cpu_ms']:.2f} ms, PostgreSQL {out['database_cpu_ms']:.2f} ms",
            flush=True,
        )
    with balanced(args.db, 2) as stack:
        kill = asyncio.run(replica_kill(stack, args.kill_rollouts, args.kill_calls))
        print(f"replica SIGKILL under {args.kill_rollouts} harnesses: {kill}", flush=True)
        drained = asyncio.run(pause_drains_all(stack, args.clients))
        print(f"pause through the balancer: every replica paused and idle: {drained}", flush=True)
    one = figures[1, False]["calls_per_s"]
    ratio = figures[2, False]["calls_per_s"] / one
    sticky_ratio = figures[2, True]["calls_per_s"] / one
    cpu = {key: out["gateway_cpu_ms"] + out["database_cpu_ms"] for key, out in figures.items()}
    print(
        f"2 replicas / 1: {ratio:.2f}x calls/s round-robin, {sticky_ratio:.2f}x sticky "
        "(two cores shared by everything); CPU per call (gateways + PostgreSQL) "
        f"{cpu[2, False] / cpu[1, False]:.2f}x round-robin, {cpu[2, True] / cpu[1, False]:.2f}x "
        "sticky"
    )
    print(
        f"replicas_1_calls_per_s={one:.0f} "
        f"replicas_2_calls_per_s={figures[2, False]['calls_per_s']:.0f} "
        f"replica_kill_lost={kill['lost']} replica_kill_duplicated={kill['duplicated']} "
        f"pause_drained_all={int(drained)} "
        f"replicas_1_cpu_ms={cpu[1, False]:.2f} replicas_2_cpu_ms={cpu[2, False]:.2f} "
        f"replicas_2_sticky_cpu_ms={cpu[2, True]:.2f} "
        f"replicas_2_cpu_ratio={cpu[2, False] / cpu[1, False]:.2f}"
    )


if __name__ == "__main__":
    main()
