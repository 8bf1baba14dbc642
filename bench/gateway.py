"""Gateway overhead: added latency per call, sustained recorded calls/s, and memory.

An engine stand-in (its own process) answers `/generate` at once with a fixed 64-token reply,
so what is measured is the gateway's own cost: auth, template rendering and tokenization of a
2,048-token prompt, the engine round trip, recording the call (committed before the reply) and
formatting the reply. The baseline, in the same run, is calling the stand-in directly with the
same token IDs. Then 64 concurrent clients for sustained calls/s, then 1,000 open rollouts with
32k-token contexts for the gateway's RSS. Last line:
`gateway_p50_overhead_ms=A gateway_calls_per_s=B gateway_rss_mb=C`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
from fastapi import Request  # a module name: the stand-in's route is annotated with it

from bench.quick import parse_args
from bench.stack import ADMIN_HEADERS, running

REPLY = list(range(100, 164))


def stand_in(port: int, tokenizer: str) -> None:
    import uvicorn

    uvicorn.run(stand_in_app(tokenizer), host="127.0.0.1", port=port, log_level="warning")


def stand_in_app(tokenizer: str) -> Any:
    """The engine stand-in: sglang's /generate shape, answered instantly.

    Its first output token is `100 + weight_version`, so a recorded call shows which weights
    sampled it; `/update_weights_from_disk` sets the version, as on sglang. For fault drills
    (bench/soak.py), `POST /stand_in/faults {"fail": N, "delay_s": S}` makes the next N
    `/generate` requests answer 503 and each one wait S seconds first.
    """
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response

    app = FastAPI()
    state = {"version": 0, "fail": 0, "delay_s": 0.0}

    def reply(version: int) -> dict:
        ids = [100 + version, *REPLY[1:]]
        return {
            "output_ids": ids,
            "meta_info": {
                "output_token_logprobs": [[-0.5, t, None] for t in ids],
                "finish_reason": {"type": "length"},
                "weight_version": str(version),
                "prompt_tokens": 0,
                "completion_tokens": len(ids),
            },
        }

    replies = {0: reply(0)}

    @app.post("/generate", response_model=None)
    async def generate(request: Request) -> dict | Response:
        if state["delay_s"]:
            await asyncio.sleep(state["delay_s"])
        if state["fail"] > 0:
            state["fail"] -= 1
            return JSONResponse({"error": {"message": "injected failure"}}, 503)
        version = state["version"]
        if version not in replies:
            replies[version] = reply(version)
        return answer(replies[version], streamed=(await request.json()).get("stream", False))

    @app.post("/update_weights_from_disk")
    async def update_weights(body: dict) -> dict:
        state["version"] = int(body["weight_version"])
        return {"success": True}

    @app.post("/stand_in/faults")
    async def faults(body: dict) -> dict:
        state.update(fail=int(body.get("fail", 0)), delay_s=float(body.get("delay_s", 0)))
        return state

    @app.get("/model_info")
    async def model_info() -> dict:
        # max_context_length: what gateways before #43 read (bench/gateway_ab.py runs one); sglang has none
        return {"model_path": tokenizer, "tokenizer_path": tokenizer, "max_context_length": 65_536}

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": tokenizer, "object": "model", "owned_by": "sglang", "max_model_len": 65_536}
        return {"object": "list", "data": [card]}

    return app


def answer(reply: dict, *, streamed: bool) -> dict | Any:
    """`/generate`'s answer of a reply sampled at once: its JSON, or streamed as sglang streams
    (one chunk holding it all, then `[DONE]`)."""
    from fastapi.responses import StreamingResponse

    if not streamed:
        return reply
    events = [f"data: {json.dumps(reply)}\n\n", "data: [DONE]\n\n"]
    return StreamingResponse(iter(events), media_type="text/event-stream")


def words(n_tokens: int, tok: object, salt: str) -> str:
    """Text that the tokenizer turns into about `n_tokens` tokens."""
    base = f"{salt} the quick brown fox jumps over the lazy dog; print(x + 1) # comment\n"
    per = len(tok.encode(base, add_special_tokens=False))  # type: ignore[attr-defined]
    return base * max(1, n_tokens // per)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, field: str = "VmHWM") -> float:
    """The process's peak resident memory (MB), or with `field="VmRSS"` its current one."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def post(client: aiohttp.ClientSession, url: str, body: dict, headers: dict) -> dict:
    async with client.post(url, json=body, headers=headers) as r:
        r.raise_for_status()
        return await r.json()


class Conversation:
    """An agent-like harness: a ~1,700-token system prompt and task, then turns of (reply, tool
    output), re-sending the whole conversation each call as harnesses do; after six turns
    (~2,400 tokens) it starts over in a new rollout. Prompts average about 2,048 tokens."""

    def __init__(self, client: aiohttp.ClientSession, gateway: str, tok: object, salt: str) -> None:
        self.client, self.gateway, self.tok, self.salt = client, gateway, tok, salt
        self.turns = 0
        self.messages: list[dict] = []
        self.headers: dict[str, str] = {}

    async def call(self) -> tuple[float, int]:
        if not self.messages or self.turns == 6:
            url = self.gateway + "/api/rollouts"
            r = await post(self.client, url, {"group": "bench"}, ADMIN_HEADERS)
            self.headers = {"Authorization": f"Bearer {r['agent_token']}"}
            self.messages = [
                {"role": "system", "content": words(1_650, self.tok, self.salt)},
                {"role": "user", "content": "Fix the failing test in the repository."},
            ]
            self.turns = 0
        body = {"model": "bench", "messages": self.messages, "max_tokens": 64}
        t0 = time.perf_counter()
        reply = await post(self.client, self.gateway + "/v1/chat/completions", body, self.headers)
        elapsed = time.perf_counter() - t0
        self.messages.append(reply["choices"][0]["message"])
        tool_output = words(50, self.tok, f"output {self.turns}")
        self.messages.append({"role": "user", "content": tool_output})
        self.turns += 1
        return elapsed, reply["usage"]["prompt_tokens"]


async def run(
    gateway: str, engine: str, tok: object, calls: int, concurrent: int, rollouts: int, pid: int
) -> dict:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200)) as client:
        convo = Conversation(client, gateway, tok, "latency")
        for _ in range(12):  # warm up
            await convo.call()
        direct, through, sizes = [], [], []
        for _ in range(calls):
            elapsed, prompt_tokens = await convo.call()
            through.append(elapsed)
            sizes.append(prompt_tokens)
            sampling = {"max_new_tokens": 64}
            body = {"input_ids": list(range(prompt_tokens)), "sampling_params": sampling}
            t0 = time.perf_counter()
            await post(client, engine + "/generate", body | {"return_logprob": True}, {})
            direct.append(time.perf_counter() - t0)
        q = statistics.quantiles
        out = {
            "prompt_tokens": statistics.mean(sizes),
            "direct_p50_ms": statistics.median(direct) * 1e3,
            "gateway_p50_ms": statistics.median(through) * 1e3,
            "direct_p99_ms": q(direct, n=100)[98] * 1e3,
            "gateway_p99_ms": q(through, n=100)[98] * 1e3,
        }

        convos = [Conversation(client, gateway, tok, f"client {i}") for i in range(concurrent)]
        per_client = max(1, calls // 4)

        async def client_loop(c: Conversation) -> None:
            for _ in range(per_client):
                await c.call()

        t0, cpu0 = time.perf_counter(), cpu_s(pid)
        await asyncio.gather(*(client_loop(c) for c in convos))
        out["calls_per_s"] = concurrent * per_client / (time.perf_counter() - t0)
        out["cpu_ms_per_call"] = (cpu_s(pid) - cpu0) * 1e3 / (concurrent * per_client)

        big = words(32_000, tok, "memory")
        sem = asyncio.Semaphore(4)

        async def open_rollout(i: int) -> None:
            async with sem:
                r = await post(
                    client, gateway + "/api/rollouts", {"group": "memory"}, ADMIN_HEADERS
                )
                messages = [{"role": "user", "content": f"{i} {big}"}]
                body = {"model": "bench", "messages": messages, "max_tokens": 64}
                headers = {"Authorization": f"Bearer {r['agent_token']}"}
                await post(client, gateway + "/v1/chat/completions", body, headers)

        t0 = time.perf_counter()
        await asyncio.gather(*(open_rollout(i) for i in range(rollouts)))
        out["open_rollouts_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--calls", type=int, default=300, help="sequential calls per path for latency"
    )
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument(
        "--rollouts", type=int, default=1000, help="open rollouts of 32k tokens for RSS"
    )
    parser.add_argument("--stand-in", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = parse_args(parser, calls=30, concurrent=8, rollouts=20)
    if args.stand_in:
        return stand_in(args.stand_in, args.tokenizer)

    from transformers import AutoTokenizer

    with running() as stack:
        tok = AutoTokenizer.from_pretrained(stack.tokenizer)
        pid = stack.pid("gateway")
        load = run(stack.url, stack.engine, tok, args.calls, args.concurrent, args.rollouts, pid)
        out = asyncio.run(load)
        out["gateway_rss_mb"] = rss_mb(pid)
    overhead = out["gateway_p50_ms"] - out["direct_p50_ms"]
    print(
        f"prompts: {out['prompt_tokens']:.0f} tokens on average (multi-turn, prefix-preserving); "
        "reply: 64 tokens"
    )
    print(
        f"direct to the stand-in: p50 {out['direct_p50_ms']:.2f} ms, "
        f"p99 {out['direct_p99_ms']:.2f} ms"
    )
    print(
        f"through the gateway:    p50 {out['gateway_p50_ms']:.2f} ms, "
        f"p99 {out['gateway_p99_ms']:.2f} ms"
    )
    added_p99 = out["gateway_p99_ms"] - out["direct_p99_ms"]
    print(f"added latency: p50 {overhead:.2f} ms, p99 {added_p99:.2f} ms")
    print(
        f"sustained with {args.concurrent} clients: {out['calls_per_s']:.0f} recorded calls/s, "
        f"{out['cpu_ms_per_call']:.2f} ms of gateway CPU per call"
    )
    opened, rss = out["open_rollouts_s"], out["gateway_rss_mb"]
    print(
        f"{args.rollouts} open rollouts of 32k tokens opened in {opened:.1f} s; peak RSS {rss:.0f} MiB"
    )
    print(
        f"gateway_p50_overhead_ms={overhead:.2f} gateway_calls_per_s={out['calls_per_s']:.0f} "
        f"gateway_rss_mb={rss:.0f}"
    )


if __name__ == "__main__":
    main()
