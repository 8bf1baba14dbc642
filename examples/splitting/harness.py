"""The calculator agent, managing its own context as coding agents do: its rollouts split.

Written with the plain `openai` SDK and sharing the calculator agent's protocol, tasks and reward
(`examples/calculator/harness.py`: `calc(<expression>)`, then "Answer: <number>"). What differs
is its history: after every calculator result it rewrites its context into a fresh prompt, the
question plus a summary of the results so far ("Results so far: 12 * 34 = 408"), and drops its
own earlier replies, as an agent that summarizes or prunes old tool output does. The summary
does not repeat the `calc(...)` syntax: a model that echoes it calls the calculator again (with
"Results so far: calc(12 * 34) = 408", two updates made the greedy agent echo it on every turn
and never answer: validation 0.80 -> 0.00). Each rewrite starts a new token chain, so a rollout
becomes one training sample per calculator call plus one: an attempt that works the answer out in
several calculator steps splits into more samples than one that calls it once on the whole
expression. How many samples a rollout makes is the harness's doing, not a measure of its
quality; `bench/ablation.py` trains on it with rollout- and sample-level handling side by side.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "calculator"))
from harness import CALL, SYSTEM, calculate, final_number, report  # the calculator agent's

# The worked example shows the rewritten context: the question with the results so far.
EXAMPLE = [
    {"role": "user", "content": "What is 12 * 34?"},
    {"role": "assistant", "content": "calc(12 * 34)"},
    {"role": "user", "content": "What is 12 * 34?\nResults so far: 12 * 34 = 408"},
    {"role": "assistant", "content": "Answer: 408"},
]


def main() -> int:
    task = json.loads(os.environ["AGL_TASK"])
    client = openai.OpenAI(max_retries=2)
    results: list[str] = []  # the summary that replaces the history
    turns: list[dict[str, str]] = []  # this context's own turns since the last rewrite
    answer, reminded = None, False
    try:
        for _ in range(int(task.get("max_turns", 4))):
            question = task["question"]
            if results:
                question += f"\nResults so far: {'; '.join(results)}"
            messages = [
                {"role": "system", "content": SYSTEM},
                *EXAMPLE,
                {"role": "user", "content": question},
            ]
            reply = client.chat.completions.create(
                model="calculator-agent", messages=messages + turns, max_tokens=40, temperature=0.7
            )
            text = reply.choices[0].message.content or ""
            if call := CALL.search(text):
                results.append(f"{call.group(1).strip()} = {calculate(call.group(1))}")
                turns = []  # the context is rewritten: the next call starts a new chain
            elif "Answer:" in text or reminded:
                answer = final_number(text)
                break
            else:
                reminded = True  # one more turn in the same context to state the result
                turns += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": "State the final result as: Answer: <number>"},
                ]
    except openai.PermissionDeniedError:
        return 0  # the rollout was ended from outside (e.g. cancelled): stop at once
    report(task, answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
