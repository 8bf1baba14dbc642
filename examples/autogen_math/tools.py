"""The AutoGen math agent's calculator tool and its reward: standard library only, so that agl's tests import
them without AutoGen (agent.py imports them from here; it runs in a venv of its own)."""

from __future__ import annotations

import ast
import operator
import re

OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
NUMBER = r"-?\d[\d,]*(?:\.\d+)?"  # 1234, -5, 2.5 or 1,234


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / ** and parentheses), e.g. "37 * 24 - 158"."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers, + - * / ** and parentheses are allowed")

    try:
        value = ev(ast.parse(expression.strip(), mode="eval").body)
        return str(int(value)) if float(value).is_integer() else f"{value:.10g}"
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError, TypeError) as e:
        return f"error: {e}"


def final_number(text: str) -> float | None:
    """The number after the last "Answer:", else the last number in the text; None if there is none."""
    found = re.findall(rf"Answer:\s*\$?({NUMBER})", text) or re.findall(NUMBER, text)
    try:
        return float(found[-1].replace(",", "")) if found else None
    except ValueError:  # "1,,2" and the like
        return None


def reward(reply: str, expected: float) -> float:
    """1 when the reply's final number is `expected`, else 0."""
    answer = final_number(reply)
    return 1.0 if answer is not None and abs(answer - expected) < 1e-6 else 0.0
