"""Long conversations: the gateway's added latency and stored bytes per call, up to 200 messages.

- The stack (bench/stack.py): bench/gateway.py's engine stand-in, answering at once with 64
  tokens, so what is measured is the gateway's own cost, and a gateway on SQLite.
- Each rollout starts with a ~2,000-token system prompt and a task, then each turn adds the reply
  and a ~510-token tool output (as a user message, like bench/gateway.py's); the harness re-sends
  the whole conversation each call, so 200 messages reach about 60k tokens of the `tiny`
  tokenizer, as a coding agent's conversation does.
- Calls go one at a time, rollouts in turn, each followed by a direct call to the stand-in with
  as many prompt IDs (request bodies are encoded before either timer starts); added latency =
  gateway round trip - direct round trip, p50 over the rollouts' calls at a given length.
- Rollout i starts i * `--stagger` turns after the first, so calls at 20 and at 200 messages are
  taken in overlapping stretches of the run and a slow phase of the machine hits both.
- Then it sums each recorded call's row (token arrays, request and response JSON) in the
  gateway's SQLite file and compares it with the call's new tokens at 4 bytes each (prompt tokens
  no earlier call of the rollout recorded, plus the reply) and with its whole prompt (a chained
  call's `base` says how much of it the call it extends holds). It measures; it changes nothing.
- Last line: `gateway_p50_ms_20=A gateway_p50_ms_200=B gateway_bytes_per_call_200=C`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import time
from collections import defaultdict
from pathlib import Path

import aiohttp

from bench.gateway import post, words
from bench.quick import parse_args
from bench.stack import ADMIN_HEADERS, running, tiny_tokenizer

LENGTHS = (20, 50, 100, 150, 200)  # messages in the prompt, for the table
TARGET = 2.0  # at 200 messages over at 20, at most: added latency; stored bytes per new-token byte


def verdict(ratio: float) -> str:
    return "met" if ratio <= TARGET else "NOT met"


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def timed(
    client: aiohttp.ClientSession, url: str, data: bytes, headers: dict
) -> tuple[float, dict]:
    """One POST of an encoded JSON body: (seconds, the reply)."""
    headers = headers | {"Content-Type": "application/json"}
    t0 = time.perf_counter()
    async with client.post(url, data=data, headers=headers) as r:
        r.raise_for_status()
        reply = await r.json()
    return time.perf_counter() - t0, reply


async def grow(
    gateway: str, engine: str, tok: object, rollouts: int, turns: int, stagger: int
) -> dict:
    """Grow `rollouts` conversations to `turns` calls each; per prompt length, the measured round
    trips."""
    system = words(2_000, tok, "system")
    through: dict[int, list[float]] = defaultdict(list)
    direct: dict[int, list[float]] = defaultdict(list)
    tokens: dict[int, list[int]] = defaultdict(list)
    chat = gateway + "/v1/chat/completions"
    sampling = {"sampling_params": {"max_new_tokens": 64}, "return_logprob": True}
    async with aiohttp.ClientSession() as client:
        convos: list[tuple[dict, list[dict]]] = []
        for i in range(rollouts):
            r = await post(client, gateway + "/api/rollouts", {"group": "long"}, ADMIN_HEADERS)
            task = {"role": "user", "content": f"Task {i}: fix the failing test in the repository."}
            messages = [{"role": "system", "content": system}, task]
            convos.append(({"Authorization": f"Bearer {r['agent_token']}"}, messages))
        for step in range(turns + (rollouts - 1) * stagger):
            for i, (headers, messages) in enumerate(convos):
                turn = step - i * stagger
                if not 0 <= turn < turns:
                    continue
                body = json.dumps({"model": "bench", "messages": messages, "max_tokens": 64})
                elapsed, reply = await timed(client, chat, body.encode(), headers)
                n = reply["usage"]["prompt_tokens"]
                # 3 digits each, as the tiny vocabulary's
                prompt = {"input_ids": [100 + k % 500 for k in range(n)]}
                body = json.dumps(prompt | sampling)
                through[len(messages)].append(elapsed)
                direct_s, _ = await timed(client, engine + "/generate", body.encode(), {})
                direct[len(messages)].append(direct_s)
                tokens[len(messages)].append(n)
                messages.append(reply["choices"][0]["message"])
                tool_output = words(510, tok, f"tool output {i}.{turn}")
                messages.append({"role": "user", "content": tool_output})
        async with client.get(gateway + "/metrics") as got:
            metrics = await got.text()
    lines = [line for line in metrics.splitlines() if line.startswith("agl_prefix_total")]
    prefix = {line.split('"')[1]: int(float(line.split()[-1])) for line in lines}
    return {"through": through, "direct": direct, "tokens": tokens, "prefix": prefix}


def stored(db: Path) -> dict[int, list[dict[str, int]]]:
    """Per prompt length (messages), each recorded call's bytes: stored, its new tokens', its
    whole prompt's."""
    columns = ("prompt_ids", "response_ids", "logprobs", "request", "response")
    sizes = ", ".join(f"length(CAST({c} AS BLOB))" for c in columns)
    query = f"SELECT seq, base, {sizes} FROM calls ORDER BY rollout_id, seq"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(query).fetchall()
    out: dict[int, list[dict[str, int]]] = defaultdict(list)
    known = 0  # tokens of the rollout recorded by its earlier calls: the last prompt and its reply
    for seq, base, prompt, response, logprobs, request, reply in rows:
        # a chained call stores its tail
        whole = prompt + 4 * json.loads(base)["prompt_from"] if base else prompt
        new_prompt = whole // 4 - known if seq else whole // 4
        known = (whole + response) // 4
        out[2 + 2 * seq].append(
            {
                "stored": prompt + response + logprobs + request + reply,
                "prompt_ids": prompt,
                "request": request,
                "new": 4 * new_prompt + response,
                "whole": whole,
            }
        )
    return out


def table(args: argparse.Namespace, out: dict, rows: dict) -> tuple[dict, dict]:
    """Prints one line per prompt length; returns the added latency (ms) and the stored bytes per
    call, by length."""
    print(
        "messages  prompt tok  direct ms  gateway ms  added ms  stored B/call  prompt_ids B  request B"
        "  new-token B  stored/new  stored/whole"
    )
    added, per_call = {}, {}
    for n in sorted({m for m in LENGTHS if m <= args.messages} | {args.messages}):
        added[n] = (p50(out["through"][n]) - p50(out["direct"][n])) * 1e3
        calls = rows[n]
        per_call[n] = p50([c["stored"] for c in calls])
        new, whole = p50([c["new"] for c in calls]), p50([c["whole"] for c in calls])
        print(
            f"{n:8d}  {p50(out['tokens'][n]):10.0f}  {p50(out['direct'][n]) * 1e3:9.2f}  "
            f"{p50(out['through'][n]) * 1e3:10.2f}  {added[n]:8.2f}  {per_call[n]:13.0f}  "
            f"{p50([c['prompt_ids'] for c in calls]):12.0f}  "
            f"{p50([c['request'] for c in calls]):9.0f}  "
            f"{new:11.0f}  {per_call[n] / new:10.1f}  {per_call[n] / whole:12.2f}"
        )
    return added, per_call


def report(args: argparse.Namespace, out: dict, rows: dict, on_disk: int, elapsed: float) -> None:
    print(
        f"{args.rollouts} rollouts grown to {args.messages} messages, one call in flight, "
        f"instant stand-in (64-token replies), tiny tokenizer; prompts by how they extend the "
        f"rollout: {out['prefix']}"
    )
    added, per_call = table(args, out, rows)
    every = [c for calls in rows.values() for c in calls]
    total, new_total = sum(c["stored"] for c in every), sum(c["new"] for c in every)
    print(
        "(new-token B: 4 bytes per prompt token no earlier call of the rollout recorded, and per "
        "reply token; stored/whole: stored bytes over 4 bytes per prompt token.) "
        f"All {len(every)} calls: {total / 2**20:.0f} MiB in their rows for "
        f"{new_total / 2**20:.1f} MiB of new tokens, {on_disk / 2**20:.0f} MiB on disk "
        f"(the SQLite file and its WAL); run took {elapsed:.0f} s"
    )
    last = args.messages
    ratio = added[last] / added[20]
    per_new = {n: per_call[n] / p50([c["new"] for c in rows[n]]) for n in (20, last)}
    growth = per_new[last] / per_new[20]
    slope = (added[last] - added[20]) / (last - 20) * 1e3
    print(
        f"added latency grows by {slope:.1f} us per message of the prompt, from 20 to {last} messages"
    )
    print(
        f"targets: ratio_{last}_to_20={ratio:.2f} "
        f"(added latency; target <= {TARGET:.0f}: {verdict(ratio)}); "
        f"bytes per call / new-token bytes at {last}={per_new[last]:.1f}, {growth:.2f}x that at 20 "
        "(target: proportional to the new tokens, so the same at any length, "
        f"taken as <= {TARGET:.0f}x: {verdict(growth)})."
    )
    print(
        f"gateway_p50_ms_20={added[20]:.2f} gateway_p50_ms_{last}={added[last]:.2f} "
        f"gateway_bytes_per_call_{last}={per_call[last]:.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--rollouts", type=int, default=16, help="conversations, each grown to --messages"
    )
    parser.add_argument(
        "--messages", type=int, default=200, help="messages in each rollout's last prompt (even)"
    )
    parser.add_argument(
        "--stagger", type=int, default=6, help="turns between one rollout's start and the next's"
    )
    args = parse_args(parser, rollouts=2)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer())
    turns = args.messages // 2
    started = time.perf_counter()
    with running() as stack:
        out = asyncio.run(grow(stack.url, stack.engine, tok, args.rollouts, turns, args.stagger))
        db = Path(stack.db.removeprefix("sqlite:///"))
        rows = stored(db)
        on_disk = sum(p.stat().st_size for p in db.parent.glob(f"{db.name}*"))
    report(args, out, rows, on_disk, elapsed=time.perf_counter() - started)


if __name__ == "__main__":
    main()
