"""Paired A/B of two source trees' gateways, for changes smaller than this machine's noise.

`python -m bench.gateway_ab OTHER_TREE` (e.g. a `git worktree` of the previous commit; without
it, this tree against itself, which shows the noise between two equal gateways) starts
one engine stand-in (bench/gateway.py's) and one `agl gateway` from each tree, and then
alternates sequential calls between them (in turn first), with a direct call to the stand-in after
each pair.
So a slow phase of the machine slows both, which back-to-back runs of bench.gateway cannot
promise (the same commit measured 1.5 and 4 ms of added p50 an hour apart). Then it measures
calls/s with 64 clients on each gateway alone, alternating twice. Each gateway process's CPU
(user + system, all its threads, from /proc) is counted over both phases and divided by the calls
it served: the CPU a call costs, at one call at a time (c1) and at 64 (c64), which a shared
machine's slow phases change far less than latency. `--engine-ms 50` makes the stand-in answer
after 50 ms, as a real engine does at the least (the figures then say what a user would notice).
Last line: `ab_p50_overhead_ms_this=A ab_p50_overhead_ms_other=B ab_calls_per_s_this=C
ab_calls_per_s_other=D ab_cpu_ms_c1_this=E ab_cpu_ms_c1_other=F ab_cpu_ms_c64_this=G
ab_cpu_ms_c64_other=H`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import httpx

from bench.gateway import Conversation, cpu_s, post
from bench.quick import parse_args
from bench.stack import ADMIN, ROOT, free_port, processes


async def measure(
    gateways: list[str], pids: list[int], engine: str, tok: object, calls: int, concurrent: int
) -> dict[str, list]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200)) as client:
        convos = [Conversation(client, g, tok, "latency") for g in gateways]
        for c in convos:
            for _ in range(12):  # warm up
                await c.call()
        cpu = [cpu_s(pid) for pid in pids]
        through: list[list[float]] = [[] for _ in gateways]
        direct = []
        for k in range(calls):
            # neither always goes first
            order = range(len(convos)) if k % 2 else reversed(range(len(convos)))
            for i in order:
                elapsed, prompt_tokens = await convos[i].call()
                through[i].append(elapsed)
            sampling = {"max_new_tokens": 64}
            body = {"input_ids": list(range(prompt_tokens)), "sampling_params": sampling}
            t0 = time.perf_counter()
            await post(client, engine + "/generate", body | {"return_logprob": True}, {})
            direct.append(time.perf_counter() - t0)
        base = statistics.median(direct)
        overhead_ms = [(statistics.median(t) - base) * 1e3 for t in through]
        out: dict[str, list] = {"overhead_ms": overhead_ms}
        out["cpu_ms_c1"] = [
            (cpu_s(pid) - c) * 1e3 / calls for pid, c in zip(pids, cpu, strict=True)
        ]
        out["calls_per_s"] = [0.0 for _ in gateways]
        out["cpu_ms_c64"] = [0.0 for _ in gateways]
        per_client = max(1, calls // 10)
        for _ in range(2):
            for i, g in enumerate(gateways):
                clients = [Conversation(client, g, tok, f"client {k}") for k in range(concurrent)]

                async def loop(c: Conversation) -> None:
                    for _ in range(per_client):
                        await c.call()

                t0 = time.perf_counter()
                c0 = cpu_s(pids[i])
                await asyncio.gather(*(loop(c) for c in clients))
                out["calls_per_s"][i] += concurrent * per_client / (time.perf_counter() - t0) / 2
                out["cpu_ms_c64"][i] += (cpu_s(pids[i]) - c0) * 1e3 / (concurrent * per_client) / 2
        out["direct_p50_ms"] = [base * 1e3]
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "other",
        nargs="?",
        type=Path,
        default=ROOT,
        help="the other source tree, a checkout of agl (default: this tree, against itself)",
    )
    parser.add_argument("--calls", type=int, default=500, help="sequential calls per gateway")
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument(
        "--engine-ms", type=float, default=0, help="the stand-in's latency (ms; default instant)"
    )
    args = parse_args(parser, calls=30, concurrent=8)
    from transformers import AutoTokenizer

    with processes() as stack:
        stack.start_engine()
        tok = AutoTokenizer.from_pretrained(stack.tokenizer)
        latency = {"fail": 0, "delay_s": args.engine_ms / 1000}
        httpx.post(stack.engine + "/stand_in/faults", json=latency).raise_for_status()
        gateways = []
        for i, tree in enumerate((ROOT, args.other.resolve())):
            port = free_port()
            argv = [sys.executable, "-m", "agl.cli", "gateway", "--engine-url", stack.engine]
            argv += ["--port", str(port), "--admin-key", ADMIN]
            argv += ["--db", f"sqlite:///{stack.tmp}/gateway{i}.db"]
            url = f"http://127.0.0.1:{port}"
            # its own tree's packages, whatever PYTHONPATH this one runs with
            stack.start(f"gateway{i}", argv, url + "/healthz", {"PYTHONPATH": str(tree)}, cwd=tree)
            gateways.append(url)
        pids = [stack.pid("gateway0"), stack.pid("gateway1")]
        out = asyncio.run(measure(gateways, pids, stack.engine, tok, args.calls, args.concurrent))
    (a, b), (c, d) = out["overhead_ms"], out["calls_per_s"]
    (e, f), (g, h) = out["cpu_ms_c1"], out["cpu_ms_c64"]
    print(f"direct to the stand-in: p50 {out['direct_p50_ms'][0]:.2f} ms")
    print(
        f"this tree ({ROOT}): p50 added {a:.2f} ms, {c:.0f} calls/s with {args.concurrent} clients; "
        f"CPU per call {e:.2f} ms one at a time, {g:.2f} ms with {args.concurrent}"
    )
    print(
        f"other tree ({args.other}): p50 added {b:.2f} ms, {d:.0f} calls/s; CPU per call "
        f"{f:.2f} ms, {h:.2f} ms (this / other: {e / f:.2f}x, {g / h:.2f}x)"
    )
    print(
        f"ab_p50_overhead_ms_this={a:.2f} ab_p50_overhead_ms_other={b:.2f} "
        f"ab_calls_per_s_this={c:.0f} ab_calls_per_s_other={d:.0f} "
        f"ab_cpu_ms_c1_this={e:.2f} ab_cpu_ms_c1_other={f:.2f} "
        f"ab_cpu_ms_c64_this={g:.2f} ab_cpu_ms_c64_other={h:.2f}"
    )


if __name__ == "__main__":
    main()
