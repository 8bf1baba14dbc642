"""Anthropic Messages (`/v1/messages`): its request, its reply and its stream.

- `AnthropicRequest`: the request schema; its system prompt and content blocks (text, `tool_use`,
  `tool_result`) mapped to chat messages, its custom tools to the OpenAI shape the templates take,
  and `thinking` to the template's thinking switch; the set fields no template can show (a server
  tool, a thinking budget) are named as not honoured (`parse`).
- `AnthropicRequest.reply`: the recorded completion as a `message`: a thinking block, a text block
  and a `tool_use` block per tool call, with the stop reason.
- `MessagesStream`: the reply as Messages events: the message started, its thinking and text
  blocks as they are sampled, then the rest as recorded, and `message_stop` (or an `error` event).
Thinking blocks sent back are left out of the prompt (no signature is checked); it does not sample
or record.
"""

import json
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from agl.types import JSON
from gateway.types import (
    CONTENT,
    REASONING,
    Completion,
    Message,
    Params,
    Part,
    RenderError,
    ToolCall,
)
from gateway.wire.base import (
    BaseRequest,
    Stream,
    new_id,
    sse_event,
    text_of,
    type_of,
    unsent,
    validate_tools,
)

# `thinking.type`: whether it asks for thinking (an unknown type: asked in a way not known)
THINKING_TYPES = {"enabled": True, "adaptive": True, "disabled": False}
# The stop reason of each finish reason but a tool call's ("tool_use"); else "end_turn"
STOP_REASONS = {"length": "max_tokens", "stop_sequence": "stop_sequence"}
# The content block of each kind of text, and back
_BLOCKS = {REASONING: "thinking", CONTENT: "text"}
_KINDS = {"thinking": REASONING, "text": CONTENT}


def _tool_use(block: JSON) -> ToolCall:
    """A `tool_use` block as a tool call; its input object becomes JSON text."""
    return ToolCall(
        name=str(block.get("name", "")),
        arguments=json.dumps(block.get("input", {}), ensure_ascii=False),
        id=str(block.get("id", "")),
    )


def _tool_result(block: JSON) -> Message:
    """A `tool_result` block as a tool message; `is_error` marks a failed call."""
    return Message(
        role="tool",
        content=text_of(block.get("content")),
        tool_call_id=str(block.get("tool_use_id", "")),
        is_error=block.get("is_error") is True,
    )


def _add_turn(messages: list[Message], role: str, content: Any) -> None:
    """One Anthropic message's content blocks, added to `messages`: each tool result as a tool
    message of its own, then its text and tool calls as one message of `role` (an assistant's
    even when empty). Thinking blocks are left out."""
    blocks = content
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content}]
    if not isinstance(blocks, list):
        raise RenderError("message content must be a string or a list of content blocks")
    text = []
    calls = []
    for block in blocks:
        kind = type_of(block)
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(_tool_use(block))
        elif kind == "tool_result":
            messages.append(_tool_result(block))
        elif kind != "thinking":
            raise RenderError(f"unsupported content block type {kind!r}")
    if text or calls or role == "assistant":
        messages.append(Message(role=role, content="".join(text), tool_calls=tuple(calls)))


class AnthropicRequest(BaseRequest):
    messages: list[JSON] = Field(min_length=1)
    system: str | list[JSON] | None = None
    tools: list[JSON] | None = None
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    thinking: JSON | None = None
    tool_choice: JSON | None = None

    def parse(self, thinking_switch: bool = False) -> tuple[list[Message], list[JSON], Params]:
        messages = self._messages()
        params = self._params(self.max_tokens, self.stop_sequences)
        tools = self._tools(params.not_honoured)
        if self.thinking is not None:
            # no template switch sets a budget
            on = THINKING_TYPES.get(str(self.thinking.get("type")))
            self._thinking(params, "thinking", on, thinking_switch)
            if "budget_tokens" in self.thinking:
                params.not_honoured.append("thinking.budget_tokens")
        choice = (self.tool_choice or {}).get("type")
        if choice not in (None, "auto", "none"):
            params.not_honoured.append("tool_choice")
        if choice == "none":
            return messages, [], params
        return messages, validate_tools(tools), params

    def _messages(self) -> list[Message]:
        """The system prompt and the messages as chat messages."""
        messages = []
        if self.system:
            messages.append(Message(role="system", content=text_of(self.system)))
        for raw in self.messages:
            role = raw.get("role")
            # Claude Code sends system turns mid-conversation.
            if role not in ("user", "assistant", "system"):
                raise RenderError(
                    f"unknown message role {role!r}; expected 'user', 'assistant' or 'system'"
                )
            _add_turn(messages, role, raw.get("content"))
        return messages

    def _tools(self, not_honoured: list[str]) -> list[JSON]:
        """The custom tools, in the OpenAI shape the templates take; a server or schema-less tool
        (`web_search_20250305`, `bash_...`) is not honoured."""
        tools = []
        for t in self.tools or []:
            if t.get("type", "custom") != "custom":
                not_honoured.append(f"tools.{str(t['type'])[:64]}")
                continue
            fn = {
                "name": t.get("name"),
                "description": t.get("description", ""),
                "parameters": t.get("input_schema", {}),
            }
            tools.append({"type": "function", "function": fn})
        return tools

    def reply(self, completions: list[Completion]) -> JSON:
        (c,) = completions
        content: list[JSON] = []
        if c.reply.reasoning:
            content.append({"type": "thinking", "thinking": c.reply.reasoning, "signature": ""})
        if c.reply.content or not c.reply.tool_calls:
            content.append({"type": "text", "text": c.reply.content})
        for call in c.reply.tool_calls:
            args = call.parsed_arguments()
            if not isinstance(args, dict):  # an input is an object
                args = {}
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": args})
        stop_reason = STOP_REASONS.get(c.finish_reason, "end_turn")
        if c.reply.tool_calls:
            stop_reason = "tool_use"
        return {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": c.stop_sequence or None,
            "usage": {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens},
        }

    def streamer(self) -> "MessagesStream":
        return MessagesStream(model=self.model)


class MessagesStream(Stream):
    """An Anthropic Messages stream: the message started; a thinking block and a text block as
    they are sampled, each started when its first text comes; then what is left of them, the
    tool_use blocks, the stop reason and usage, and the message stopped, as recorded."""

    def __init__(self, *, model: str) -> None:
        self.id = new_id("msg_")
        self.model = model
        self.blocks: list[str] = []  # the types of the blocks started, in order
        self.stopped = 0  # how many of them are stopped

    def opening(self, prompt_tokens: int) -> Iterator[str]:
        start: JSON = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        }
        yield sse_event("message_start", message=start)

    def delta(self, part: Part) -> Iterator[str]:
        kind = _BLOCKS[part.kind]
        if not self.blocks or self.blocks[-1] != kind:
            if self.stopped < len(self.blocks):
                yield from self._stop()
            yield from self._start({"type": kind, kind: ""})
        yield sse_event(
            "content_block_delta", index=len(self.blocks) - 1, delta=_delta(kind, part.text)
        )

    def closing(self, message: JSON, shown: dict[str, str]) -> Iterator[str]:
        """The rest of `message` (as recorded) after the text `shown` (by kind)."""
        for i, block in enumerate(message["content"]):
            if i < len(self.blocks):
                if i >= self.stopped:
                    kind = block["type"]
                    rest = unsent(block[kind], shown.get(_KINDS[kind], ""))
                    if rest:
                        yield sse_event("content_block_delta", index=i, delta=_delta(kind, rest))
                    yield from self._stop()
                continue
            yield from self._start(block)
            if block["type"] == "tool_use":
                arguments = json.dumps(block["input"], ensure_ascii=False)
                delta = {"type": "input_json_delta", "partial_json": arguments}
            else:
                delta = _delta(block["type"], block[block["type"]])
            yield sse_event("content_block_delta", index=i, delta=delta)
            yield from self._stop()
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
        usage = {"output_tokens": message["usage"]["output_tokens"]}
        yield sse_event("message_delta", delta=delta, usage=usage)
        yield sse_event("message_stop")

    def error(self, message: str, kind: str, code: str | None) -> Iterator[str]:
        """The stream ended by an error event."""
        yield sse_event("error", error={"type": kind, "message": message})

    def _start(self, block: JSON) -> Iterator[str]:
        """A block started, empty."""
        kind = block["type"]
        empty: JSON = {"type": "text", "text": ""}
        if kind == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "tool_use":
            empty = block | {"input": {}}
        self.blocks.append(kind)
        yield sse_event("content_block_start", index=len(self.blocks) - 1, content_block=empty)

    def _stop(self) -> Iterator[str]:
        """The block being streamed, stopped."""
        yield sse_event("content_block_stop", index=self.stopped)
        self.stopped += 1


def _delta(kind: str, text: str) -> JSON:
    """A thinking or text block's delta."""
    if kind == "thinking":
        return {"type": "thinking_delta", "thinking": text}
    return {"type": "text_delta", "text": text}
