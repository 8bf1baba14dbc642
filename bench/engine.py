"""Generated tokens/s of the embedded engine on SmolLM2-135M: 1 request alone, then 8 at once.

Both figures come from the same run, through the real client over HTTP on 127.0.0.1 to an
`agl engine` in its own process (as deployed: no GIL shared with the client), with 64
new tokens per request (ignore_eos, so every request generates exactly 64). Target: batching
gives at least 3x the single-request throughput. Usage: `python bench/engine.py [--model M]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.quick import parse_args

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402  (after HF_HUB_OFFLINE is set)

from gateway.engines import EngineClient  # noqa: E402

NEW_TOKENS = 64
QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain what a unit test is in one paragraph.",
    "List three uses of the grep command.",
    "Why is the sky blue?",
    "How do I create a virtual environment in Python?",
    "What does git rebase do?",
    "Give me a haiku about compilers.",
]


async def measure(client: EngineClient, prompts: list[list[int]]) -> float:
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0.7, "ignore_eos": True}
    start = time.perf_counter()
    results = await asyncio.gather(*(client.generate(p, params) for p in prompts))
    elapsed = time.perf_counter() - start
    return sum(len(r.output_ids) for r in results) / elapsed


async def run(url: str, prompts: list[list[int]], rounds: int) -> tuple[float, float]:
    """Best of `rounds` interleaved measurements each, so that noise from neighbours hurts both alike."""
    async with EngineClient([url], timeout_s=300) as client:
        await measure(client, prompts[:2])  # warm-up
        single, batched = [], []
        for i in range(rounds):
            single.append(await measure(client, [prompts[i % len(prompts)]]))
            batched.append(await measure(client, prompts[:8]))
    return max(single), max(batched)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=3)
    args = parse_args(parser, model="tiny", rounds=1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    # No prefix cache: the rounds repeat their prompts, and what is measured here is batching.
    argv = ["--model", args.model, "--port", str(port)]
    argv += ["--max-batch", "8", "--prefix-cache-tokens", "0"]
    server = subprocess.Popen([sys.executable, "-m", "engine.server", *argv], cwd=ROOT)
    try:
        t0 = time.perf_counter()
        info = wait_for(url, server)
        print(f"engine with {args.model} up in {time.perf_counter() - t0:.1f}s", flush=True)
        tokenizer = AutoTokenizer.from_pretrained(info["tokenizer_path"])
        chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
        texts = [
            tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
            for c in chats
        ]
        ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        one, eight = asyncio.run(run(url, ids, args.rounds))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    print(
        f"engine_tok_per_s_1={one:.1f} engine_tok_per_s_8={eight:.1f} "
        f"batching_speedup={eight / one:.2f}"
    )
    return 0


def wait_for(url: str, server: subprocess.Popen[bytes]) -> dict[str, Any]:
    deadline = time.monotonic() + 600  # the first run converts SmolLM2's GGUF
    while True:
        if server.poll() is not None:
            raise SystemExit(f"the engine exited with {server.returncode}")
        try:
            return dict(httpx.get(url + "/model_info").json())
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
