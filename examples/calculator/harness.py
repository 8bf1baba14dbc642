"""A small agent written with the plain `openai` SDK: math questions with a calculator tool.

It knows nothing about agl. Like any harness it reads its endpoint and key from
OPENAI_BASE_URL / OPENAI_API_KEY and its task from AGL_TASK ({"question", "answer"}); at the end
it posts its own reward to AGL_GATEWAY_URL (agl allows that for rollouts without a grader): 1
for the right number (the one after "Answer:", else the last one in the reply), else 0. A reply
with neither a tool call nor an "Answer:" line gets one reminder turn, so most rollouts are
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
    "You are a careful math assistant. You may call the calculator tool. "
    "When you know the result, answer with: Answer: <number>"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
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
        raise ValueError("only numbers and + - * / ** are allowed")

    try:
        return f"{ev(ast.parse(expression, mode='eval').body):g}"
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError, TypeError) as e:
        return f"error: {e}"


def final_number(text: str) -> float | None:
    """The number after the last "Answer:", else the last number in the text."""
    found = re.findall(r"Answer:\s*(-?\d+(?:\.\d+)?)", text) or re.findall(r"-?\d+(?:\.\d+)?", text)
    try:
        return float(found[-1]) if found else None
    except ValueError:
        return None


def main() -> int:
    task = json.loads(os.environ["AGL_TASK"])
    client = openai.OpenAI(max_retries=2)
    messages: list = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    answer, reminded = None, False
    try:
        for _ in range(int(task.get("max_turns", 4))):
            reply = (
                client.chat.completions.create(
                    model="calculator-agent", messages=messages, tools=TOOLS, max_tokens=40, temperature=0.7
                )
                .choices[0]
                .message
            )
            messages.append(reply.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
            if not reply.tool_calls:
                if "Answer:" in (reply.content or "") or reminded:
                    answer = final_number(reply.content or "")
                    break
                reminded = True  # one more turn to state the result in the asked format
                messages.append({"role": "user", "content": "State the final result as: Answer: <number>"})
                continue
            for call in reply.tool_calls:
                expression = json.loads(call.function.arguments or "{}").get("expression", "")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(expression))})
    except openai.PermissionDeniedError:
        return 0  # the rollout was ended from outside (e.g. cancelled): stop at once
    reward = 1.0 if answer is not None and abs(answer - float(task["answer"])) < 1e-6 else 0.0
    rollout = os.environ["AGL_ROLLOUT_ID"]
    url = f"{os.environ['AGL_GATEWAY_URL']}/api/rollouts/{rollout}/reward"
    httpx.post(url, json={"reward": reward}, headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
    print(json.dumps({"answer": answer, "expected": task["answer"], "reward": reward}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
