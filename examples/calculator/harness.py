"""A small agent written with the plain `openai` SDK: arithmetic with a calculator.

It knows nothing about agl. Like any harness it reads its endpoint and key from
OPENAI_BASE_URL / OPENAI_API_KEY and its task from AGL_TASK ({"question", "answer"}); at the end
it posts its own reward to AGL_GATEWAY_URL (agl allows that for rollouts without a grader): 1
for the right number (the one after "Answer:", else the last one in the final reply), else 0.

The calculator is a text protocol, `calc(<expression>)`, shown once in a worked example: the
demo's model (SmolLM2-135M) has a chat template without tool definitions. The numbers are too
big for the model to multiply in its head, so the reward mostly measures whether it uses the
calculator, and on the whole expression: the behaviour that training should reinforce. A reply
with neither a calculator call nor an "Answer:" line gets one reminder turn. Every rollout is
several calls. Exit code 0 means it ran to the end, whatever the answer.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import re
import sys

import httpx
import openai

SYSTEM = (
    "You are a math assistant. You can use a calculator: write calc(<expression>) and you will "
    "get the result. Finish with: Answer: <number>"
)
EXAMPLE = [
    {"role": "user", "content": "What is 12 * 34?"},
    {"role": "assistant", "content": "calc(12 * 34)"},
    {"role": "user", "content": "calc(12 * 34) = 408"},
    {"role": "assistant", "content": "Answer: 408"},
]
CALL = re.compile(r"calc\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers, + - * / and parentheses are allowed")

    try:
        return f"{ev(ast.parse(expression, mode='eval').body):g}"
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError, TypeError) as e:
        return f"error: {e}"


def final_number(text: str) -> float | None:
    """The number after the last "Answer:", else the last number in the text."""
    found = re.findall(r"Answer:\s*(-?\d+(?:\.\d+)?)", text) or re.findall(r"-?\d+(?:\.\d+)?", text)
    return float(found[-1]) if found else None


def main() -> int:
    task = json.loads(os.environ["AGL_TASK"])
    client = openai.OpenAI(max_retries=2)
    messages: list = [
        {"role": "system", "content": SYSTEM},
        *EXAMPLE,
        {"role": "user", "content": task["question"]},
    ]
    answer, reminded = None, False
    try:
        for _ in range(int(task.get("max_turns", 4))):
            reply = client.chat.completions.create(
                model="calculator-agent", messages=messages, max_tokens=40, temperature=0.7
            )
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            if call := CALL.search(text):
                expression = call.group(1)
                result = calculate(expression)
                messages.append({"role": "user", "content": f"calc({expression}) = {result}"})
            elif "Answer:" in text or reminded:
                answer = final_number(text)
                break
            else:
                reminded = True  # one more turn to state the result in the asked format
                reminder = "State the final result as: Answer: <number>"
                messages.append({"role": "user", "content": reminder})
    except openai.PermissionDeniedError:
        return 0  # the rollout was ended from outside (e.g. cancelled): stop at once
    report(task, answer)
    return 0


def report(task: dict, answer: float | None) -> None:
    """Post the reward (1 for the right number, else 0) with the rollout's own token, and print it."""
    reward = 1.0 if answer is not None and abs(answer - float(task["answer"])) < 1e-6 else 0.0
    rollout = os.environ["AGL_ROLLOUT_ID"]
    url = f"{os.environ['AGL_GATEWAY_URL']}/api/rollouts/{rollout}/reward"
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    httpx.post(url, json={"reward": reward}, headers=headers)
    print(json.dumps({"answer": answer, "expected": task["answer"], "reward": reward}))


if __name__ == "__main__":
    sys.exit(main())
