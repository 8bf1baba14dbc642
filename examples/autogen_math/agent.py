"""A math word-problem agent written with AutoGen (autogen-agentchat 0.7): one `AssistantAgent`
with a calculator.

It knows nothing about agl. Like any deployment it reads its endpoint and key from
OPENAI_BASE_URL / OPENAI_API_KEY and its task from AGL_TASK ({"question", "answer"}); at the end it
posts its own reward to AGL_GATEWAY_URL (agl allows that for rollouts without a grader): 1 for the
right final number, else 0.

The agent, `solver` (its name and the model name it asks for, which is how agl tells agents apart), has
one function tool, `calculator(expression)` (tools.py: evaluated with `ast`, never `eval`). AutoGen runs
the tool loop: up to three rounds of tool calls, each followed by another model call, until the model
replies in text; if it is still calling tools after the third round, one more call without tools
(AutoGen's reflection) makes it reply. So a rollout is one to four calls. The reward reads that reply:
the number after its last "Answer:", else its last number (thousands separators allowed).

Nothing here counts tokens: AutoGen's default model context keeps the whole conversation, so
tiktoken (which would download its encodings) is imported by autogen-ext but never asked for one.
Runs in a venv of its own (README.md): AutoGen 0.7 pins protobuf 5, which agl's own environment
cannot have. Exit code 0 means it ran to the end, whatever the answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request

import openai
from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

from tools import calculator, final_number, reward  # this folder's tools.py (first on sys.path)

AGENT = "solver"
SYSTEM = (
    "You solve math word problems. Use the calculator tool for the arithmetic: give it one expression "
    "written from the problem's numbers. When you have the result, reply with: Answer: <number>"
)
# The model is not an OpenAI one, so AutoGen cannot look up what it supports: it calls functions,
# nothing else.
MODEL_INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family=ModelFamily.UNKNOWN,
    structured_output=False,
)


async def solve(question: str) -> str:
    """The agent's final reply to `question`."""
    client = OpenAIChatCompletionClient(
        model=AGENT,
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        model_info=MODEL_INFO,
        temperature=0.7,
        max_tokens=256,
        max_retries=2,
    )
    agent = AssistantAgent(
        AGENT,
        model_client=client,
        tools=[calculator],
        system_message=SYSTEM,
        max_tool_iterations=3,
        reflect_on_tool_use=True,
    )
    try:
        result = await agent.run(task=question)
    finally:
        await client.close()
    return result.messages[-1].to_model_text()


def post_reward(value: float) -> None:
    """Post the rollout's reward with its own token."""
    url = f"{os.environ['AGL_GATEWAY_URL']}/api/rollouts/{os.environ['AGL_ROLLOUT_ID']}/reward"
    headers = {
        "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
        "Content-Type": "application/json",
    }
    body = json.dumps({"reward": value}).encode()
    request = urllib.request.Request(url, body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=30):
        pass


def main() -> int:
    task = json.loads(os.environ["AGL_TASK"])
    try:
        reply = asyncio.run(solve(task["question"]))
    except openai.PermissionDeniedError:
        return 0  # the rollout was ended from outside (e.g. cancelled): stop at once
    value = reward(reply, float(task["answer"]))
    post_reward(value)
    answer = final_number(reply)
    print(
        json.dumps({"reply": reply, "answer": answer, "expected": task["answer"], "reward": value})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
