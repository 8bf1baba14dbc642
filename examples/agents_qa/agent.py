"""A question-answering agent written with the OpenAI Agents SDK: one `search` tool over a small corpus.

It knows nothing about agl. Like any deployment it reads its endpoint and key from
OPENAI_BASE_URL / OPENAI_API_KEY (the SDK's `AsyncOpenAI()` does) and its task from AGL_TASK
({"question", "answer"}); the agent and its model are both named `qa`. It talks Chat Completions
(`OpenAIChatCompletionsModel`), so its tool calls are Chat Completions tool calls, and the SDK's
tracing is off (its exporter would post to api.openai.com).

`search(query)` scores the passages of `corpus.jsonl` (an invented valley: `data.py`) with BM25
and returns the best three; an empty query, one of stop words only, or one that matches nothing
gets a text starting with `Error:` (so does a tool call the SDK cannot parse), which is what the
gateway's AIR option looks for.

At the end it posts its own reward to AGL_GATEWAY_URL: 0.9 x correct + 0.1 x format. `correct`:
the normalized exact match (lower case, no punctuation or articles, single spaces, as SQuAD's) of
the text after the last `Answer:` (else of the whole final reply) with the task's answer.
`format`: the reply's last line is `Answer: <something>`. A run that ends without a final reply
(too many turns, a tool call it cannot parse) gets 0. Exit code 0 means it ran to the end,
whatever the answer.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import string
import sys
from collections import Counter
from pathlib import Path

import httpx
import openai
from agents import (
    Agent,
    AgentsException,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    Runner,
    function_tool,
    set_tracing_disabled,
)

CORPUS = Path(__file__).resolve().parent / "corpus.jsonl"
INSTRUCTIONS = (
    "You answer questions about the towns and rivers of the Veldmark valley. Look facts up with "
    "the search tool (keywords, such as a town's or a river's name); search again if a passage "
    "names something you need. Finish with one line: Answer: <short answer>"
)
STOP = {"a", "an", "and", "the", "of", "in", "on", "is", "was", "to"}
STOP |= {"what", "which", "who", "when", "how", "does"}


def words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOP]


class Index:
    """BM25 (k1 1.5, b 0.75) over the passages' titles and texts."""

    def __init__(self, passages: list[dict]) -> None:
        self.passages = passages
        self.docs = [Counter(words(f"{p['title']} {p['text']}")) for p in passages]
        self.df = Counter(w for d in self.docs for w in d)
        self.avg = sum(sum(d.values()) for d in self.docs) / len(self.docs)

    def score(self, terms: list[str], doc: Counter[str]) -> float:
        n, length = len(self.docs), sum(doc.values())
        idf = {w: math.log(1 + (n - self.df[w] + 0.5) / (self.df[w] + 0.5)) for w in terms}
        return sum(
            idf[w] * doc[w] * 2.5 / (doc[w] + 1.5 * (0.25 + 0.75 * length / self.avg))
            for w in terms
        )

    def search(self, query: str, k: int = 3) -> str:
        """The best `k` passages, one a line (`[id] title: text`), or a text starting with `Error:`."""
        if not query.strip():
            return "Error: the query is empty; give keywords, such as a town's name."
        if not (terms := words(query)):
            return f"Error: the query {query!r} has no keywords."
        scored = sorted(
            ((self.score(terms, d), i) for i, d in enumerate(self.docs)),
            key=lambda s: (-s[0], s[1]),
        )
        found = [self.passages[i] for s, i in scored[:k] if s > 0]
        if not found:
            return f"Error: no passage matches {query!r}; try other keywords."
        return "\n".join(f"[{p['id']}] {p['title']}: {p['text']}" for p in found)


INDEX = Index([json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()])


def tool_error(ctx: RunContextWrapper, error: Exception) -> str:
    """What the model sees when a tool call fails (arguments the SDK cannot parse): an `Error:` text."""
    return f"Error: {str(error).splitlines()[0] if str(error) else type(error).__name__}"


@function_tool(failure_error_function=tool_error)
def search(query: str) -> str:
    """Search the Veldmark gazetteer; returns up to three passages, best first.

    Args:
        query: keywords, such as a town's or a river's name.
    """
    return INDEX.search(query)


def normalize(text: str) -> str:
    """Lower case, without punctuation, articles and extra spaces (SQuAD's normalization)."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    return " ".join(w for w in text.split() if w not in {"a", "an", "the"})


def reward(final: str | None, answer: str) -> float:
    """0.9 x normalized exact match + 0.1 x `Answer:` format; 0 without a final reply."""
    if final is None:
        return 0.0
    lines = [line.strip() for line in final.strip().splitlines() if line.strip()]
    formatted = bool(lines) and re.fullmatch(r"Answer:\s*\S.*", lines[-1]) is not None
    given = final
    if "Answer:" in final:
        given = (final.rsplit("Answer:", 1)[1].strip().splitlines() or [""])[0]
    return 0.9 * (normalize(given) == normalize(answer)) + 0.1 * formatted


def make_agent(client: openai.AsyncOpenAI) -> Agent:
    model = OpenAIChatCompletionsModel(model="qa", openai_client=client)
    # agl.temperature is 0.7: log-probs are computed there
    settings = ModelSettings(temperature=0.7, max_tokens=96)
    return Agent(
        name="qa", instructions=INSTRUCTIONS, tools=[search], model=model, model_settings=settings
    )


async def run(task: dict) -> str | None:
    """The agent's final reply, or None when it did not give one."""
    set_tracing_disabled(True)
    agent = make_agent(openai.AsyncOpenAI(max_retries=2))
    try:
        result = await Runner.run(agent, task["question"], max_turns=int(task.get("max_turns", 5)))
    except AgentsException as e:  # too many turns, a reply the SDK cannot use: no answer
        print(f"no answer: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    return str(result.final_output)


def main() -> int:
    task = json.loads(os.environ["AGL_TASK"])
    try:
        final = asyncio.run(run(task))
    except openai.PermissionDeniedError:
        return 0  # the rollout was ended from outside (e.g. cancelled): stop at once
    value = reward(final, str(task["answer"]))
    rollout = os.environ["AGL_ROLLOUT_ID"]
    url = f"{os.environ['AGL_GATEWAY_URL']}/api/rollouts/{rollout}/reward"
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    httpx.post(url, json={"reward": value}, headers=headers)
    print(json.dumps({"final": final, "expected": task["answer"], "reward": value}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
