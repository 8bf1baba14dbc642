"""A sampled reply's text as an assistant message: reasoning, content and tool calls.

- Owns the thinking block's markers and where the reasoning ends, and the registry of tool-call
  formats (`TOOL_PARSERS`, with the text that opens a call in each: `TOOL_MARKERS`).
- A tool call that is not well formed stays in the content, for the harness to see.
- Does not tokenize (`gateway/render.py` turns the sampled IDs into this text) or stream
  (`gateway/stream.py` shows the same split as it is sampled).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from gateway.types import Message, ToolCall

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """Qwen / Hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks."""
    calls = []

    def take(match: re.Match[str]) -> str:
        try:
            data = json.loads(match.group(1))
            name = data["name"]
            args = data.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            # not a well-formed call: left in the content for the harness to see
            return match.group(0)
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        calls.append(ToolCall(name=str(name), arguments=args))
        return ""

    rest = _HERMES.sub(take, text)
    if not calls:
        return text, calls
    return rest.strip(), calls


TOOL_PARSERS: dict[str, Callable[[str], tuple[str, list[ToolCall]]]] = {
    "hermes": parse_hermes,
    "none": lambda text: (text, []),
}
# The text that begins a tool call, by parser: a stream holds back what follows it.
TOOL_MARKERS = {"hermes": "<tool_call>", "none": ""}


def parse_reply(text: str, tool_parser: str = "hermes", *, thinking: bool = False) -> Message:
    """A sampled reply as an assistant message: reasoning split off, tool calls parsed by
    `tool_parser`. The reply starts with reasoning if the prompt opened a thinking block
    (`thinking`: `Renderer.opens_thinking`) or if it opens one itself; the reasoning runs to the
    first `</think>`, and a block never closed (the reply was cut while thinking) is all reasoning,
    as sglang's reasoning parsers read it."""
    reasoning = ""
    head = text.lstrip()
    if thinking or head.startswith(THINK_OPEN):
        if not thinking:
            text = head.removeprefix(THINK_OPEN)
        reasoning, _, text = text.partition(THINK_CLOSE)
        reasoning = reasoning.strip()
        text = text.lstrip()
    content, calls = TOOL_PARSERS[tool_parser](text)
    return Message(role="assistant", content=content, tool_calls=tuple(calls), reasoning=reasoning)
