"""Soak: faults, load and hostile input against real processes, counting what was lost.

- Everything runs as its own process on 127.0.0.1, started through bench/stack.py: the engine
  stand-in of bench/gateway.py (an instant sglang `/generate`; no GPU engine runs here), `agl
  gateway` over a SQLite store, and `agl controller` with the local launcher. Each phase stops by
  itself; the tests in tests/gateway/test_faults.py and tests/controller/test_faults.py run the
  same phases, smaller.
- With `--replicas N` (`make soak SOAK="--replicas 2"`) the gateway is N replicas on a fresh
  PostgreSQL database behind HAProxy: every phase goes through the balancer, the kills hit one
  replica while the others serve, and the engine faults are drilled on that replica.
- Phase 1, load: R rollouts x C calls, all rollouts at once; calls answered vs recorded, peak RSS.
- Phase 2, cross-rollout: every rollout-scoped admin route tried with another rollout's agent and
  grader tokens (header and path); each attempt must be rejected.
- Phase 3, gateway SIGKILL: 200 rollouts calling (retrying refused connections, as SDKs do), the
  gateway killed mid-load and restarted on the same store; every answered call must be in the
  store exactly once. Calls committed in the instant before the kill whose reply never left are
  counted as `orphaned` (each harness retried them; they are recorded, unanswered).
- Phase 4, pause/resume: 200 harnesses calling without retries while the "trainer" pauses,
  updates the engine's weights (the stand-in's first output token is its weight version) and
  resumes on the new version, N times; every recorded call's version must equal the weights that
  sampled it, and the harnesses must see no error.
- Phase 5, engine faults: 5xx fewer than the gateway's attempts (retried, harness sees success),
  an engine answering 5xx, hung (SIGSTOP) and stopped (SIGKILL): a 503 with a message each,
  `/healthz` answering throughout, calls succeeding again once the engine is back.
- Phase 6, controller SIGKILL: rollouts whose harnesses succeed, crash, hang, or fork a child that
  outlives them, run by `agl controller`, which is killed mid-launch and restarted; each attempt
  must have been started once, every rollout must end as its harness dictates, and no child may
  outlive its run. Then the gateway is killed under two runs, which fail: they must be retried as
  infra failures (not trained on as task failures) and succeed.
- Last line: `soak_calls=N lost=0 errors_seen_by_harness=0 ...` (see `main`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import sqlalchemy as sa

from agl.store import Store
from bench.gateway import rss_mb
from bench.quick import parse_args
from bench.stack import ADMIN_HEADERS, Stack, balanced, running
from controller.launcher import process_start

# the gateway's engine timeout in the engine-fault phase: a hung engine fails fast
ENGINE_TIMEOUT_S = 2.0
RETRYABLE = (aiohttp.ClientError,)  # refused, reset, cut short: what SDKs retry
BALANCER_RETRIES = (502, 503)  # a load balancer's: the replica it chose died (SDKs retry 5xx)


# --------------------------------------------------------------------------- harnesses


@dataclass
class Tally:
    """What harnesses saw: the tags of answered calls, errors, and retries after refused connections."""

    answered: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    retries: int = 0


async def create(
    client: aiohttp.ClientSession,
    url: str,
    n: int,
    group: str,
    admin: dict[str, str] = ADMIN_HEADERS,
    **body: Any,
) -> list[dict]:
    sem = asyncio.Semaphore(32)

    async def one() -> dict:
        async with (
            sem,
            client.post(url + "/api/rollouts", json={"group": group, **body}, headers=admin) as r,
        ):
            r.raise_for_status()
            return dict(await r.json())

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def call(client: aiohttp.ClientSession, url: str, token: str, tag: str) -> tuple[int, str]:
    body = {"model": "soak", "messages": [{"role": "user", "content": tag}], "max_tokens": 64}
    headers = {"Authorization": f"Bearer {token}"}
    async with client.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        return r.status, await r.text()


async def harness(
    client: aiohttp.ClientSession,
    url: str,
    rollout: dict,
    tally: Tally,
    *,
    calls: int | None,
    stop: asyncio.Event | None = None,
    retry_s: float = 0.0,
) -> None:
    """Make `calls` calls (or call until `stop`), each tagged `<rollout>.<call>`. With `retry_s`,
    a refused or dropped connection, and a load balancer's 502 or 503 (its replica died), is
    retried for that long with the same request, as SDKs do; any other failure is an error the
    harness saw."""
    j = 0
    while (calls is None or j < calls) and not (stop and stop.is_set()):
        deadline = time.monotonic() + retry_s
        tag = f"{rollout['id']}.{j}"
        while True:
            try:
                status, text = await call(client, url, rollout["agent_token"], tag)
            except RETRYABLE as e:
                if time.monotonic() > deadline:
                    tally.errors.append(f"{tag}: {e!r}")
                    return
                tally.retries += 1
                await asyncio.sleep(0.2)
                continue
            if status in BALANCER_RETRIES and retry_s and time.monotonic() < deadline:
                tally.retries += 1
                await asyncio.sleep(0.2)
                continue
            if status == 200:
                tally.answered.add(tag)
            else:
                tally.errors.append(f"{tag}: {status} {text[:200]}")
                return
            break
        j += 1


def recorded(db: str, rollout_ids: list[str]) -> list[Any]:
    """Every recorded call of these rollouts, all attempts, straight from the store."""
    with Store(db) as store:
        found = store.calls_for(rollout_ids, all_attempts=True)
    return [c for rid in rollout_ids for c in found[rid]]


def reconcile(db: str, rollout_ids: list[str], tally: Tally) -> dict[str, int]:
    """Answered calls against recorded ones: lost (answered, not recorded), duplicated (one
    request recorded twice), orphaned (recorded, never answered), and seq gaps."""
    calls = recorded(db, rollout_ids)
    tags = Counter(c.request["messages"][0]["content"] for c in calls)
    gaps = 0
    for rid in rollout_ids:
        seqs = sorted(c.seq for c in calls if c.rollout_id == rid)
        gaps += seqs != list(range(len(seqs)))
    return {
        "recorded": len(calls),
        "lost": len(tally.answered - tags.keys()),
        "duplicated": sum(1 for n in tags.values() if n > 1),
        "orphaned": len(tags.keys() - tally.answered),
        "seq_gaps": gaps,
    }


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=300)
    )


# --------------------------------------------------------------------------- phases


async def load(stack: Stack, rollouts: int, calls: int) -> dict[str, Any]:
    """`rollouts` harnesses at once, `calls` each, no retries."""
    async with session() as client:
        made = await create(client, stack.url, rollouts, "load")
        tally = Tally()
        t0 = time.perf_counter()
        await asyncio.gather(*(harness(client, stack.url, r, tally, calls=calls) for r in made))
        elapsed = time.perf_counter() - t0
    out = reconcile(stack.db, [r["id"] for r in made], tally)
    out |= {
        "answered": len(tally.answered),
        "errors": len(tally.errors),
        "calls_per_s": len(tally.answered) / elapsed,
    }
    return out | {"peak_rss_mb": rss_mb(stack.pid("gateway")), "first_errors": tally.errors[:3]}


ROLLOUT_ROUTES = [
    ("GET", ""),
    ("GET", "/calls"),
    ("GET", "/events"),
    ("POST", "/events"),
    ("POST", "/reward"),
    ("POST", "/status"),
    ("POST", "/tokens"),
]
ADMIN_ROUTES = [
    ("GET", "/api/rollouts"),
    ("POST", "/api/rollouts"),
    ("POST", "/api/pause"),
    ("GET", "/api/state"),
    ("POST", "/api/models"),
]


async def cross_rollout(
    url: str, pairs: int, admin: dict[str, str] = ADMIN_HEADERS
) -> dict[str, int]:
    """Each rollout's tokens against every rollout-scoped route of another rollout (and the
    admin-only routes), as a header and as a `/r/{token}` path prefix. Accepted must be 0."""
    attempts = rejected = 0
    body = {"reward": 1.0, "kind": "x", "status": "succeeded", "group": "g", "version": 99}
    async with session() as client:
        victims = await create(client, url, pairs, "victims", admin, grader=True)
        thieves = await create(client, url, pairs, "thieves", admin, grader=True)
        for victim, thief in zip(victims, thieves, strict=True):
            for token in (thief["agent_token"], thief["grader_token"]):
                targets = [(m, f"/api/rollouts/{victim['id']}{p}") for m, p in ROLLOUT_ROUTES]
                targets += ADMIN_ROUTES
                for method, path in targets:
                    for target, headers in (
                        (url + path, {"Authorization": f"Bearer {token}"}),
                        (f"{url}/r/{token}{path}", {}),
                    ):
                        async with client.request(method, target, json=body, headers=headers) as r:
                            attempts += 1
                            rejected += r.status in (401, 403)
        for victim in victims:  # nothing of the victims changed
            async with client.get(f"{url}/api/rollouts/{victim['id']}", headers=admin) as r:
                got = await r.json()
            async with client.get(f"{url}/api/rollouts/{victim['id']}/events", headers=admin) as r:
                kinds = [e["kind"] for e in await r.json()]
            seen = (got["reward"], got["status"], got["attempt"], kinds)
            assert seen == (None, "queued", 1, ["lifecycle"]), got
    return {"attempts": attempts, "rejected": rejected, "accepted": attempts - rejected}


async def gateway_kill(stack: Stack, rollouts: int, calls: int, kills: int) -> dict[str, Any]:
    """`rollouts` harnesses making `calls` calls each; the gateway is SIGKILLed `kills` times
    under load and restarted on the same store."""
    async with session() as client:
        made = await create(client, stack.url, rollouts, "kill")
        tally = Tally()
        work = asyncio.gather(
            *(harness(client, stack.url, r, tally, calls=calls, retry_s=120) for r in made)
        )
        total = rollouts * calls
        for k in range(kills):
            # kill at even points of the load
            while len(tally.answered) < total * (k + 1) / (kills + 1):
                await asyncio.sleep(0.01)
            stack.kill("gateway")
            await asyncio.to_thread(stack.start_gateway)
        await work
    out = reconcile(stack.db, [r["id"] for r in made], tally)
    return out | {
        "answered": len(tally.answered),
        "errors": len(tally.errors),
        "retries": tally.retries,
    }


async def pause_cycles(
    stack: Stack, harnesses: int, cycles: int, per_cycle: int = 50
) -> dict[str, Any]:
    """Harnesses call without retries while the gateway is paused, the engine gets new weights
    and the gateway resumes on them, `cycles` times. A call counts as crossing a version when
    its recorded version differs from the weights that sampled it (the stand-in's first token).
    Each cycle starts once `per_cycle` calls were answered since the last one."""
    async with session() as client:
        made = await create(client, stack.url, harnesses, "pause")
        tally, stop = Tally(), asyncio.Event()
        work = asyncio.gather(
            *(harness(client, stack.url, r, tally, calls=None, stop=stop) for r in made)
        )
        async with client.get(stack.url + "/api/state", headers=ADMIN_HEADERS) as r:
            first = int((await r.json())["version"]) + 1
        max_drain_s = 0.0
        for version in range(first, first + cycles):
            seen = len(tally.answered)
            # under load each cycle
            while len(tally.answered) < seen + per_cycle and not tally.errors:
                await asyncio.sleep(0.005)
            async with client.post(stack.url + "/api/pause", headers=ADMIN_HEADERS) as r:
                drained = await r.json()
                assert r.status == 200 and drained["inflight"] == 0, drained
                max_drain_s = max(max_drain_s, drained["drained_s"])
            async with client.post(
                stack.engine + "/update_weights_from_disk", json={"weight_version": version}
            ) as r:
                r.raise_for_status()
            async with client.post(
                stack.url + "/api/models", json={"version": version}, headers=ADMIN_HEADERS
            ) as r:
                r.raise_for_status()
            async with client.post(
                stack.url + "/api/resume", json={"version": version}, headers=ADMIN_HEADERS
            ) as r:
                r.raise_for_status()
        stop.set()
        await work
    ids = [r["id"] for r in made]
    crossed = sum(1 for c in recorded(stack.db, ids) if c.response_ids[0] - 100 != c.model_version)
    out = reconcile(stack.db, ids, tally)
    return out | {
        "answered": len(tally.answered),
        "errors": len(tally.errors),
        "first_errors": tally.errors[:3],
        "crossed_version": crossed,
        "max_drain_s": max_drain_s,
    }


async def engine_faults(stack: Stack, slow: bool = True) -> dict[str, Any]:
    """A harness's view of a failing engine, and the gateway's health meanwhile. `slow`: also an
    engine slower than the gateway's timeout, and a hung one (each takes 3 timeouts)."""
    out: dict[str, Any] = {}
    if slow:  # a gateway that gives up on the engine sooner, so that the drill stays short
        stack.kill("gateway", signal.SIGTERM)
        stack.engine_timeout_s = ENGINE_TIMEOUT_S
        await asyncio.to_thread(stack.start_gateway)
    url = stack.gateway_url()  # with replicas, the one restarted with the short timeout
    async with session() as client:
        (r,) = await create(client, url, 1, "engine")

        async def attempt(tag: str) -> tuple[int, str]:
            async def health() -> int:
                async with client.get(url + "/healthz") as h:
                    return h.status

            (status, text), healthy = await asyncio.gather(
                call(client, url, r["agent_token"], tag), health()
            )
            out["healthz_failed"] = out.get("healthz_failed", 0) + (healthy != 200)
            return status, text

        async def faults(**body: float) -> None:
            async with client.post(stack.engine + "/stand_in/faults", json=body) as f:
                f.raise_for_status()

        await faults(fail=2)  # the gateway tries 3 times: the third answers
        out["5xx_retried"] = (await attempt("5xx-2"))[0]
        await faults(fail=3)
        out["5xx_persistent"] = await attempt("5xx-3")
        if slow:
            await faults(delay_s=ENGINE_TIMEOUT_S + 1)
            out["slow"] = await attempt("slow")
            await faults()
            os.kill(stack.pid("engine"), signal.SIGSTOP)
            out["hung"] = await attempt("hung")
            os.kill(stack.pid("engine"), signal.SIGCONT)
        stack.kill("engine")
        out["stopped"] = await attempt("stopped")
        await asyncio.to_thread(stack.start_engine)
        out["back"] = (await attempt("back"))[0]
    return out


HARNESS = """
import json, os, subprocess, sys, time, urllib.request
kind, marks = sys.argv[1], sys.argv[2]
rollout, attempt = os.environ["AGL_ROLLOUT_ID"], os.environ["AGL_ATTEMPT"]
open(os.path.join(marks, f"{rollout}.{attempt}.{os.getpid()}"), "w").close()
def post(url, body, token):
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    return json.load(urllib.request.urlopen(req, timeout=60))
token = os.environ["OPENAI_API_KEY"]
chat = {"messages": [{"role": "user", "content": "hi"}]}
post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", chat, token)
if kind == "outage" and attempt == "1":  # a second call once the gateway was killed
    open(os.path.join(marks, "..", "waiting", rollout), "w").close()
    while not os.path.exists(os.path.join(marks, "..", "go")):
        time.sleep(0.05)
    post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", chat, token)  # refused: this run fails
if kind == "fork":
    child = subprocess.Popen(["sleep", "300"])
    open(os.path.join(marks, f"child.{child.pid}"), "w").close()
if kind == "hang":
    time.sleep(300)
if kind == "crash":
    os.abort()
time.sleep(float(os.environ.get("SOAK_SLEEP", "0")))
post(f"{os.environ['AGL_GATEWAY_URL']}/api/rollouts/{rollout}/reward", {"reward": 1}, token)
"""
EXPECTED = {"ok": ("succeeded", None), "fork": ("succeeded", None), "crash": ("failed", "task")}
EXPECTED |= {"hang": ("timed_out", "task"), "outage": ("succeeded", None)}


def wrong_outcomes(made: list[tuple[str, str]], ended: dict[str, dict]) -> list[tuple]:
    """(kind, status) of each rollout that did not end as its kind dictates (`EXPECTED`)."""
    wrong = []
    for rid, kind in made:
        got = ended.get(rid, {})
        if (got.get("status"), got.get("failure_kind")) != EXPECTED[kind]:
            wrong.append((kind, got.get("status")))
    return wrong


async def controller_kill(
    stack: Stack, rollouts: int, kills: int, timeout_s: float = 8
) -> dict[str, Any]:
    """Rollouts run by `agl controller`, which is killed with SIGKILL while launching and
    restarted `kills` times; then the gateway is killed while two harnesses wait to make their
    second call, the controller is restarted while it is down, and the gateway restarted: those
    two runs fail, and must be retried as infra failures."""
    marks, state, waiting = stack.tmp / "marks", stack.tmp / "controller", stack.tmp / "waiting"
    marks.mkdir(exist_ok=True)
    waiting.mkdir(exist_ok=True)
    (stack.tmp / "harness.py").write_text(HARNESS)
    kinds = ["hang", "crash", "fork", "outage", "outage"] + ["ok"] * max(0, rollouts - 5)
    made = []
    async with session() as client:
        for i, kind in enumerate(kinds):
            command = [sys.executable, str(stack.tmp / "harness.py"), kind, str(marks)]
            env = {"SOAK_SLEEP": str(0.5 + (i % 5) / 5)}
            limit = 120 if kind == "outage" else timeout_s  # it waits for the gateway kill
            spec = {
                "harness": {"command": command, "env": env, "timeout_s": limit},
                "retry_backoff_s": 0.1,
            }
            (r,) = await create(client, stack.url, 1, "controller", metadata={"spec": spec})
            made.append((r["id"], kind))
        flags = ["--max-running", str(max(4, rollouts // 2)), "--poll-s", "0.1"]
        stack.start_controller(state, *flags)
        peak_rss, deadline = 0.0, time.monotonic() + 120
        for k in range(kills):
            while len(list(marks.glob("*.*.*"))) < len(kinds) * (k + 1) / (kills + 1):
                assert time.monotonic() < deadline, (
                    f"harnesses did not start; see {stack.tmp / 'controller.log'}"
                )
                await asyncio.sleep(0.01)
            peak_rss = max(peak_rss, rss_mb(stack.pid("controller")))
            stack.kill("controller")
            stack.start_controller(state, *flags)
        while len(list(waiting.iterdir())) < kinds.count("outage"):
            assert time.monotonic() < deadline, (
                f"harnesses did not start; see {stack.tmp / 'controller.log'}"
            )
            await asyncio.sleep(0.01)
        stack.kill_gateways()
        (stack.tmp / "go").touch()
        stack.kill("controller")  # and a controller that starts while the gateway is down
        stack.start_controller(state, *flags)
        await asyncio.sleep(1)
        await asyncio.to_thread(stack.start_gateways)
        ended: dict[str, dict] = {}
        while len(ended) < len(made) and time.monotonic() < deadline:
            for rid, _ in made:
                async with client.get(
                    f"{stack.url}/api/rollouts/{rid}", headers=ADMIN_HEADERS
                ) as r:
                    got = await r.json()
                if got["status"] in ("succeeded", "failed", "timed_out", "cancelled"):
                    ended[rid] = got
            await asyncio.sleep(0.2)
        peak_rss = max(peak_rss, rss_mb(stack.pid("controller")))
        stack.kill("controller", signal.SIGTERM)
    launches = Counter(
        p.name.rsplit(".", 1)[0] for p in marks.glob("*.*.*") if not p.name.startswith("child.")
    )
    wrong = wrong_outcomes(made, ended)
    children = [int(p.name.split(".")[1]) for p in marks.glob("child.*")]
    deadline = time.monotonic() + 10
    while any(process_start(pid) is not None for pid in children) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return {
        "rollouts": len(made),
        "ended": len(ended),
        "wrong_outcome": len(wrong),
        "first_wrong": wrong[:3],
        "launched_twice": sum(1 for n in launches.values() if n > 1),
        "retried": sum(1 for r in ended.values() if r["attempt"] > 1),
        "outage_retried": sum(
            1 for rid, kind in made if kind == "outage" and ended.get(rid, {}).get("attempt", 0) > 1
        ),
        "children_left": sum(1 for pid in children if process_start(pid) is not None),
        "peak_rss_mb": peak_rss,
    }


# --------------------------------------------------------------------------- the soak


@contextlib.contextmanager
def stack_of(replicas: int, db: str) -> Iterator[Stack]:
    """One gateway on SQLite, or `replicas` on a fresh PostgreSQL database behind HAProxy (every
    phase then goes through the balancer, and kills the replica named "gateway")."""
    if replicas == 1:
        with running() as stack:
            yield stack
        return
    if not db:
        raise SystemExit("--replicas needs a PostgreSQL server: --db or AGL_TEST_POSTGRES_URL")
    with balanced(db, replicas) as stack:
        yield stack


def main() -> None:
    # clean up the processes on a plain kill too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000, help="load: concurrent rollouts")
    parser.add_argument("--calls", type=int, default=10, help="load: calls per rollout")
    parser.add_argument(
        "--kill-rollouts", type=int, default=200, help="gateway SIGKILL: concurrent rollouts"
    )
    parser.add_argument(
        "--kill-calls", type=int, default=5, help="gateway SIGKILL: calls per rollout"
    )
    parser.add_argument(
        "--kills", type=int, default=3, help="gateway SIGKILLs (and controller SIGKILLs)"
    )
    parser.add_argument(
        "--harnesses", type=int, default=200, help="pause/resume: concurrent harnesses"
    )
    parser.add_argument("--cycles", type=int, default=100, help="pause/resume cycles")
    parser.add_argument("--pairs", type=int, default=50, help="cross-rollout: victim/thief pairs")
    parser.add_argument(
        "--controller-rollouts", type=int, default=24, help="controller SIGKILL: rollouts"
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="gateways: 1 on SQLite, or N on PostgreSQL behind HAProxy (bench/replicas.py)",
    )
    parser.add_argument(
        "--db",
        default=os.environ.get("AGL_TEST_POSTGRES_URL", ""),
        help="with --replicas N: a PostgreSQL server's URL (default: AGL_TEST_POSTGRES_URL)",
    )
    args = parse_args(
        parser,
        rollouts=20,
        calls=3,
        kill_rollouts=10,
        kill_calls=3,
        kills=1,
        harnesses=10,
        cycles=3,
        pairs=3,
        controller_rollouts=6,
    )
    t0 = time.monotonic()
    with stack_of(args.replicas, args.db) as stack:
        store = sa.make_url(stack.db).render_as_string(hide_password=True)
        print(f"gateway {stack.url}, engine stand-in {stack.engine}, store {store}", flush=True)
        ld = asyncio.run(load(stack, args.rollouts, args.calls))
        print(f"load: {args.rollouts} rollouts x {args.calls} calls: {ld}", flush=True)
        cross = asyncio.run(cross_rollout(stack.url, args.pairs))
        print(f"cross-rollout: {cross}", flush=True)
        kill = asyncio.run(gateway_kill(stack, args.kill_rollouts, args.kill_calls, args.kills))
        print(
            f"gateway SIGKILL x{args.kills} under {args.kill_rollouts} rollouts: {kill}", flush=True
        )
        pause = asyncio.run(pause_cycles(stack, args.harnesses, args.cycles, per_cycle=10))
        print(f"pause/resume x{args.cycles} under {args.harnesses} harnesses: {pause}", flush=True)
        engine = asyncio.run(engine_faults(stack))
        print(f"engine faults: {engine}", flush=True)
        ctl = asyncio.run(controller_kill(stack, args.controller_rollouts, args.kills))
        print(f"controller SIGKILL x{args.kills}: {ctl}", flush=True)
    errors = ld["errors"] + kill["errors"] + pause["errors"]
    engine_503 = sum(
        1 for k in ("5xx_persistent", "slow", "hung", "stopped") if engine[k][0] == 503
    )
    figures = {
        "soak_calls": ld["recorded"] + kill["recorded"] + pause["recorded"],
        "lost": ld["lost"] + kill["lost"] + pause["lost"],
        "errors_seen_by_harness": errors,
        "duplicated": ld["duplicated"] + kill["duplicated"] + pause["duplicated"],
        "orphaned_at_kill": kill["orphaned"],
        "gateway_kills": args.kills,
        "gateway_peak_rss_mb": round(ld["peak_rss_mb"]),
        "load_calls_per_s": round(ld["calls_per_s"]),
        "pause_cycles": args.cycles,
        "calls_across_versions": pause["crossed_version"],
        "cross_rollout_attempts": cross["attempts"],
        "cross_rollout_accepted": cross["accepted"],
        "engine_fault_503s": f"{engine_503}/4",
        "engine_5xx_retried_ok": int(engine["5xx_retried"] == 200 and engine["back"] == 200),
        "healthz_failures": engine["healthz_failed"],
        "controller_kills": args.kills,
        "launched_twice": ctl["launched_twice"],
        "wrong_outcomes": ctl["wrong_outcome"] + ctl["rollouts"] - ctl["ended"],
        "children_left": ctl["children_left"],
        "gateway_restart_runs_retried": f"{ctl['outage_retried']}/2",
        "controller_peak_rss_mb": round(ctl["peak_rss_mb"]),
        "soak_s": round(time.monotonic() - t0),
    }
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
