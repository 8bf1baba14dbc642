"""The calculator agent with one growing conversation that it compacts, as Claude Code does.

Written with the plain `openai` SDK and sharing the calculator agent's protocol, tasks and reward
(`examples/calculator/harness.py`: `calc(<expression>)`, then "Answer: <number>"; reward 1 for the
right number). What differs is its history. It keeps one conversation, so its calls form one
token chain, until the prompt of a reply passes a threshold (the reply's `usage.prompt_tokens`;
AGL_COMPACT_TOKENS, default 200: the system prompt, its worked example and the question are about
126, and each turn adds 20 to 50). Then it compacts: a summary call (the conversation plus
"summarize your progress"; recorded like any call, the last of its chain) and a fresh context of
the system prompt, its worked example and the question with that summary, from which the work goes
on: a new token chain. So a quick success stays one training sample and a long meandering attempt
splits into more: how many samples a rollout makes follows how it behaves, unlike
`examples/splitting/harness.py`, whose splits follow the number of calculator calls alone.

Like a coding agent that runs the tests before it reports done, it accepts only an answer that the
calculator backs (a number the calculator returned in this rollout); any other "Answer:" is sent
back with "check that with the calculator first", and a reply with neither a calculator call nor
an answer gets a reminder, every time. It stops at a backed answer or after AGL_MAX_TURNS working
calls (default 8; a task's `max_turns` wins; summary calls not counted); the reward is that of its
last "Answer:", none being 0. Without that rule the untrained SmolLM2-135M finished almost every
rollout in two calls, right or wrong, and never compacted (pilot, 48 rollouts: all one sample);
with it, rollouts that answer from memory go on and split (`bench/ablation.py --harness
compacting --pilot`: samples vs reward Pearson -0.56 and -0.71 in two runs; figures in
bench/figures/ablation2_pilot.json).

With AGL_SUBAGENT=1 the summary is delegated to a sub-agent: a fresh conversation of its own (the
transcript as text, asked for a summary) whose calls carry the agent name `calculator-summarizer`.
agl names a call's agent by its `x-agl-agent` header, else by the request's `model`
(docs/harnesses.md, gateway/routes.py); the sub-agent sets the header, so its calls are a chain
and a sample of their own, and `agl.trained_agents` can train or leave them out.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "calculator"))
from harness import CALL, EXAMPLE, SYSTEM, calculate, final_number, report  # the calculator agent's

AGENT = "calculator-agent"
SUMMARIZER = "calculator-summarizer"  # the sub-agent's name, with AGL_SUBAGENT=1
# The prompt length (tokens) past which the conversation is compacted; the bare context is ~126.
COMPACT_TOKENS = int(os.environ.get("AGL_COMPACT_TOKENS", "200"))
MAX_TURNS = int(os.environ.get("AGL_MAX_TURNS", "8"))  # working calls, summary calls not counted
SUBAGENT = os.environ.get("AGL_SUBAGENT") == "1"
SUMMARIZE = (
    "Summarize your progress so far in one or two sentences: the results you have and what is "
    "left to compute."
)
REMINDER = "State the final result as: Answer: <number>"
CHECK = "Check that with the calculator first: calc(<expression>)"
SUMMARIZER_SYSTEM = "You summarize a math assistant's work in one or two sentences."


def fresh(question: str, summary: str | None = None) -> list[dict[str, str]]:
    """A new context: the system prompt, its worked example and the question (with a summary)."""
    if summary:
        question += f"\nSummary of your earlier work: {summary.strip()}\nContinue."
    return [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": question}]


def summarize(client: openai.OpenAI, messages: list[dict[str, str]]) -> str:
    """A summary of the conversation: asked of the agent itself in the same conversation (the
    chain's last call), or with AGL_SUBAGENT=1 of the sub-agent in a conversation of its own."""
    if SUBAGENT:
        transcript = "\n".join(f"{m['role']}: {m['content']}" for m in messages[len(EXAMPLE) + 1 :])
        asked = [
            {"role": "system", "content": SUMMARIZER_SYSTEM},
            {"role": "user", "content": f"{transcript}\n\n{SUMMARIZE}"},
        ]
        headers = {"x-agl-agent": SUMMARIZER}
    else:
        asked = [*messages, {"role": "user", "content": SUMMARIZE}]
        headers = {}
    reply = client.chat.completions.create(
        model=AGENT, messages=asked, max_tokens=60, temperature=0.7, extra_headers=headers
    )
    return reply.choices[0].message.content or ""


def main() -> int:
    task = json.loads(os.environ["AGL_TASK"])
    client = openai.OpenAI(max_retries=2)
    messages = fresh(task["question"])
    results: set[float] = set()  # what the calculator returned in this rollout
    answer = None
    try:
        for _ in range(int(task.get("max_turns", MAX_TURNS))):
            reply = client.chat.completions.create(
                model=AGENT, messages=messages, max_tokens=40, temperature=0.7
            )
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            if call := CALL.search(text):
                expression = call.group(1)
                result = calculate(expression)
                results |= numbers(result)
                messages.append({"role": "user", "content": f"calc({expression}) = {result}"})
            elif "Answer:" in text:
                answer = final_number(text)
                if answer in results:
                    break  # an answer the calculator backs: done
                messages.append({"role": "user", "content": CHECK})
            else:
                messages.append({"role": "user", "content": REMINDER})
            prompt_tokens = reply.usage.prompt_tokens if reply.usage else 0
            if prompt_tokens > COMPACT_TOKENS:
                messages = fresh(task["question"], summarize(client, messages))
    except openai.PermissionDeniedError:
        return 0  # the rollout was ended from outside (e.g. cancelled): stop at once
    report(task, answer)
    return 0


def numbers(result: str) -> set[float]:
    """The calculator's result as a number (none for an error)."""
    try:
        return {float(result)}
    except ValueError:
        return set()


if __name__ == "__main__":
    sys.exit(main())
