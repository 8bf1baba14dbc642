"""Generated tokens/s of the embedded engine on SmolLM2-135M: 1 request alone, then 8 at once.

- Both figures come from the same run, through the real client over HTTP on 127.0.0.1 to an
  `agl engine` in its own process (as deployed: no GIL shared with the client; started through
  bench/stack.py), with 64 new tokens per request (ignore_eos, so every request generates exactly
  64) and no prefix cache.
- Each figure is the best of `--rounds`, the two interleaved, so that noise from neighbours hurts
  both alike.
- Target: batching gives at least 3x the single-request throughput.
- Usage: `python -m bench.engine [--model M]`. Last line: `engine_tok_per_s_1=A
  engine_tok_per_s_8=B batching_speedup=C`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import httpx

from bench.quick import parse_args
from bench.stack import processes

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from transformers import AutoTokenizer

from gateway.engines import EngineClient

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
    with processes() as stack:
        t0 = time.perf_counter()
        # No prefix cache: the rounds repeat their prompts, and what is measured here is batching.
        stack.start_model_engine(args.model, "--max-batch", "8", "--prefix-cache-tokens", "0")
        print(f"engine with {args.model} up in {time.perf_counter() - t0:.1f}s", flush=True)
        info = httpx.get(stack.engine + "/model_info").json()
        tokenizer = AutoTokenizer.from_pretrained(info["tokenizer_path"])
        chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
        texts = [
            tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
            for c in chats
        ]
        ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        one, eight = asyncio.run(run(stack.engine, ids, args.rounds))
    print(
        f"engine_tok_per_s_1={one:.1f} engine_tok_per_s_8={eight:.1f} "
        f"batching_speedup={eight / one:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
