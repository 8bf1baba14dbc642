"""Streaming: time to first token and to the end, directly and through the gateway, and its CPU cost.

- An engine stand-in of its own (this module with `--stand-in`) samples at a realistic pace:
  `--tokens-per-s` a reply, each reply `--reply-tokens` tokens of text, streamed as sglang 0.5.13
  streams `/generate` (a chunk per token, each carrying the whole output so far: sglang's
  defaults; `--incremental` for its `--incremental-streaming-output`, `--stream-interval N` for a
  chunk every N tokens, as its `--stream-interval`).
- The gateway, on a SQLite store, sits in front; both are processes started through
  bench/stack.py.
- `--calls` calls one at a time, alternately directly from the engine (streamed: time to its first
  chunk, and to its last) and through the gateway (Chat Completions streamed: time to the first
  content delta, and to `[DONE]`, sent once the call is recorded); medians.
- `--clients` concurrent calls through the gateway unstreamed, then as many streamed, the
  gateway's CPU time over each batch: `stream_cpu_ratio` is its CPU per streamed call over its CPU
  per unstreamed call.
- Last line: `ttft_ms_direct=A ttft_ms_gateway=B total_ms_gateway=C stream_cpu_ratio=R`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from bench.gateway import cpu_s
from bench.quick import parse_args
from bench.stack import ADMIN_HEADERS, processes, tiny_tokenizer

TEXT = "def area(radius):\n    return 3.14159 * radius ** 2  # the circle's area\n"


def stand_in(args: argparse.Namespace) -> None:
    import uvicorn

    app = stand_in_app(args)
    uvicorn.run(app, host="127.0.0.1", port=args.stand_in, log_level="warning")


def reply_ids(tokenizer: str, reply_tokens: int) -> list[int]:
    """`reply_tokens` token IDs of code-like text (no end-of-turn: the reply ends by length)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    ids: list[int] = []
    while len(ids) < reply_tokens:
        ids += tok.encode(TEXT, add_special_tokens=False)
    return ids[:reply_tokens]


def stand_in_app(args: argparse.Namespace) -> Any:
    """sglang's `/generate`, a token every 1/`tokens_per_s` seconds: streamed (a chunk every
    `stream_interval` tokens and at the end, cumulative unless `incremental`, then `data: [DONE]`)
    or answered whole once all are sampled."""
    app = FastAPI()
    tokenizer = args.tokenizer
    ids = reply_ids(tokenizer, args.reply_tokens)
    delay_s = 1 / args.tokens_per_s
    pairs = [[-0.25, t, None] for t in ids]

    def chunk(done: int, start: int) -> dict:
        finish = None
        if done == len(ids):
            finish = {"type": "length", "length": done}
        meta = {
            "finish_reason": finish,
            "completion_tokens": done,
            "prompt_tokens": 0,
            "weight_version": "default",
            "output_token_logprobs": pairs[start:done],
        }
        return {"output_ids": ids[start:done], "meta_info": meta}

    @app.post("/generate", response_model=None)
    async def generate(request: Request) -> Any:
        body = await request.json()
        if not body.get("stream"):
            await asyncio.sleep(len(ids) * delay_s)
            return chunk(len(ids), 0)

        async def events():
            sent = 0
            for done in range(1, len(ids) + 1):
                await asyncio.sleep(delay_s)
                if done % args.stream_interval and done < len(ids):
                    continue
                start = sent if args.incremental else 0
                sent = done
                yield f"data: {json.dumps(chunk(done, start))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/model_info")
    async def model_info() -> dict:
        return {"model_path": tokenizer, "tokenizer_path": tokenizer}

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": tokenizer, "object": "model", "owned_by": "sglang", "max_model_len": 65_536}
        return {"object": "list", "data": [card]}

    return app


async def sse(response: aiohttp.ClientResponse) -> Any:
    """Each server-sent event's data of a stream, as it arrives."""
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    yield line[len(b"data: ") :]


async def direct(
    client: aiohttp.ClientSession, engine: str, reply_tokens: int
) -> tuple[float, float]:
    """One streamed `/generate` straight from the engine: (seconds to its first chunk, to its end)."""
    body = {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": reply_tokens},
        "stream": True,
    }
    t0 = time.perf_counter()
    first = None
    async with client.post(engine + "/generate", json=body) as response:
        async for _ in sse(response):
            if first is None:
                first = time.perf_counter() - t0
    return first or float("nan"), time.perf_counter() - t0


async def through(
    client: aiohttp.ClientSession, gateway: str, reply_tokens: int, stream: bool
) -> tuple[float, float]:
    """One chat call through the gateway in a rollout of its own: (seconds to the first content
    delta, to the end); unstreamed, both are the reply's time."""
    made = await (
        await client.post(gateway + "/api/rollouts", json={"group": "bench"}, headers=ADMIN_HEADERS)
    ).json()
    headers = {"Authorization": f"Bearer {made['agent_token']}"}
    messages = [{"role": "user", "content": "Write a function for the area of a circle."}]
    body = {"model": "bench", "messages": messages, "max_tokens": reply_tokens, "stream": stream}
    t0 = time.perf_counter()
    first = None
    async with client.post(
        gateway + "/v1/chat/completions", json=body, headers=headers
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"the gateway answered {response.status}: {await response.text()}")
        if not stream:
            await response.read()
            elapsed = time.perf_counter() - t0
            return elapsed, elapsed
        async for data in sse(response):
            if data == b"[DONE]":
                break
            delta = json.loads(data)["choices"][0]["delta"]
            if first is None and delta.get("content"):
                first = time.perf_counter() - t0
    return first or float("nan"), time.perf_counter() - t0


async def measure(
    gateway: str, engine: str, pid: int, args: argparse.Namespace
) -> dict[str, float]:
    """Time to first token and to the end, one call at a time (directly and through the gateway,
    alternated); then the gateway's CPU per call over `clients` concurrent calls, unstreamed and
    streamed."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        await through(client, gateway, args.reply_tokens, True)  # warm up
        direct_runs = []
        gateway_runs = []
        for _ in range(args.calls):
            direct_runs.append(await direct(client, engine, args.reply_tokens))
            gateway_runs.append(await through(client, gateway, args.reply_tokens, True))
        cpu: dict[bool, float] = {}
        unstreamed: list[tuple[float, float]] = []
        for stream in (False, True):
            cpu0 = cpu_s(pid)
            calls = (
                through(client, gateway, args.reply_tokens, stream) for _ in range(args.clients)
            )
            done = await asyncio.gather(*calls)
            cpu[stream] = (cpu_s(pid) - cpu0) / args.clients
            if not stream:
                unstreamed = list(done)
    return {
        "ttft_ms_direct": statistics.median(t for t, _ in direct_runs) * 1e3,
        "total_ms_direct": statistics.median(t for _, t in direct_runs) * 1e3,
        "ttft_ms_gateway": statistics.median(t for t, _ in gateway_runs) * 1e3,
        "total_ms_gateway": statistics.median(t for _, t in gateway_runs) * 1e3,
        "total_ms_unstreamed": statistics.median(t for _, t in unstreamed) * 1e3,
        "cpu_ms_streamed": cpu[True] * 1e3,
        "cpu_ms_unstreamed": cpu[False] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reply-tokens", type=int, default=256)
    parser.add_argument("--tokens-per-s", type=float, default=50.0)
    parser.add_argument("--calls", type=int, default=5, help="calls one at a time, each path")
    parser.add_argument("--clients", type=int, default=16, help="concurrent calls for the CPU")
    parser.add_argument("--incremental", action="store_true", help="sglang's incremental chunks")
    parser.add_argument("--stream-interval", type=int, default=1, help="tokens per engine chunk")
    parser.add_argument("--stand-in", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = parse_args(parser, reply_tokens=32, calls=2, clients=4)
    if args.stand_in:
        return stand_in(args)

    with processes() as stack:
        argv = [sys.executable, "-m", "bench.streaming", "--tokenizer", tiny_tokenizer()]
        argv += ["--stand-in", str(stack.engine_port), "--reply-tokens", str(args.reply_tokens)]
        argv += ["--tokens-per-s", str(args.tokens_per_s)]
        argv += ["--stream-interval", str(args.stream_interval)]
        if args.incremental:
            argv.append("--incremental")
        stack.start("engine", argv, stack.engine + "/model_info")
        stack.start_gateway()
        out = asyncio.run(measure(stack.url, stack.engine, stack.pid("gateway"), args))
    mode = "incremental" if args.incremental else "cumulative"
    print(
        f"replies of {args.reply_tokens} tokens at {args.tokens_per_s:g} tokens/s ({mode} chunks "
        f"of {args.stream_interval} token(s)); medians of {args.calls} calls one at a time:"
    )
    print(
        f"direct from the engine: first token {out['ttft_ms_direct']:.1f} ms, "
        f"last {out['total_ms_direct']:.0f} ms"
    )
    print(
        f"through the gateway, streamed: first token {out['ttft_ms_gateway']:.1f} ms, "
        f"[DONE] {out['total_ms_gateway']:.0f} ms; unstreamed (concurrent) "
        f"{out['total_ms_unstreamed']:.0f} ms"
    )
    ratio = out["cpu_ms_streamed"] / out["cpu_ms_unstreamed"]
    print(
        f"gateway CPU per call over {args.clients} concurrent calls: streamed "
        f"{out['cpu_ms_streamed']:.1f} ms, unstreamed {out['cpu_ms_unstreamed']:.1f} ms"
    )
    print(
        f"ttft_ms_direct={out['ttft_ms_direct']:.1f} ttft_ms_gateway={out['ttft_ms_gateway']:.1f} "
        f"total_ms_gateway={out['total_ms_gateway']:.0f} stream_cpu_ratio={ratio:.2f}"
    )


if __name__ == "__main__":
    main()
