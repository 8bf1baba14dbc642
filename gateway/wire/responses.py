"""OpenAI Responses (`/v1/responses`): its request, its reply and its stream.

- `ResponsesRequest`: the request schema; its instructions and input items (messages, function
  calls and their outputs) mapped to chat messages, its function tools (those a `namespace` tool
  groups too) to the chat shape, and `reasoning` to the template's thinking switch; the set fields
  no template can show are named as not honoured (`parse`).
- `ResponsesRequest.reply`: the recorded completion as a `response`: a reasoning item, a message
  and a `function_call` item per tool call.
- `ResponsesStream`: the reply as Responses events: the response created, its reasoning summary
  and its message's text as they are sampled, then the rest as recorded, and `response.completed`
  (or `response.failed`).
It stores no response (`previous_response_id` is not honoured), and does not sample or record.
"""

import itertools
import time
from collections.abc import Iterator
from dataclasses import replace
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
    message_from_openai,
    new_id,
    sse_event,
    text_of,
    type_of,
    unsent,
    validate_tools,
)

# The output item of each kind of text, and back
_ITEMS = {REASONING: "reasoning", CONTENT: "message"}
_KINDS = {"reasoning": REASONING, "message": CONTENT, "function_call": CONTENT}


def _functions(tools: list[JSON], not_honoured: list[str]) -> list[JSON]:
    """Responses tools in the chat shape: function tools, and those a `namespace` tool groups
    (Codex's), each under its own name, as a call of it comes back; other types (built-in:
    `web_search`, ...) are not honoured."""
    out = []
    for t in tools:
        kind = type_of(t)
        if kind == "function":
            fn = {k: t[k] for k in ("name", "description", "parameters") if k in t}
            out.append({"type": "function", "function": fn})
        elif kind == "namespace" and isinstance(t.get("tools"), list):
            out += _functions(t["tools"], not_honoured)
        elif kind is None or kind == "namespace":
            raise RenderError(
                "each tool must be an object with a `type`; a namespace tool needs a list of `tools`"
            )
        else:
            not_honoured.append(f"tools.{str(kind)[:64]}")
    return out


def _add_function_call(messages: list[Message], item: JSON) -> None:
    """A `function_call` item, as a tool call of the assistant message it follows (else of a new one)."""
    call = ToolCall(
        name=str(item.get("name", "")),
        arguments=str(item.get("arguments", "")),
        id=str(item.get("call_id", "")),
    )
    last = Message(role="assistant")
    if messages and messages[-1].role == "assistant":
        last = messages.pop()
    messages.append(replace(last, tool_calls=(*last.tool_calls, call)))


class ResponsesRequest(BaseRequest):
    input: str | list[JSON]
    instructions: str | None = None
    tools: list[JSON] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    reasoning: JSON | None = None
    tool_choice: Any = None
    text: JSON | None = None
    previous_response_id: str | None = None

    def parse(self, thinking_switch: bool = False) -> tuple[list[Message], list[JSON], Params]:
        messages = self._messages()
        params = self._params(self.max_output_tokens)
        tools: list[JSON] = []
        if self.tool_choice != "none":
            tools = _functions(self.tools or [], params.not_honoured)
        if self.reasoning is not None:
            # Effort "none" or "minimal": thinking off, else on; no template switch sets a level.
            effort = self.reasoning.get("effort")
            self._thinking(params, "reasoning", effort not in ("none", "minimal"), thinking_switch)
            if effort not in (None, "none"):
                params.not_honoured.append("reasoning.effort")
        asked = {
            "tool_choice": self.tool_choice not in (None, "auto", "none"),
            "text.format": (self.text or {}).get("format") not in (None, {"type": "text"}),
            # no response is stored to continue
            "previous_response_id": self.previous_response_id is not None,
        }
        params.not_honoured += [name for name, unmet in asked.items() if unmet]
        return messages, validate_tools(tools), params

    def _messages(self) -> list[Message]:
        """The instructions and input items as chat messages (reasoning items are left out)."""
        messages = []
        if self.instructions:
            messages.append(Message(role="system", content=self.instructions))
        if isinstance(self.input, str):
            items: list[JSON] = [{"role": "user", "content": self.input}]
        else:
            items = self.input
        for item in items:
            kind = item.get("type", "message")
            if kind == "message":
                raw = {"role": item.get("role"), "content": item.get("content")}
                messages.append(message_from_openai(raw))
            elif kind == "function_call":
                _add_function_call(messages, item)
            elif kind == "function_call_output":
                output = text_of(item.get("output"))
                result_of = str(item.get("call_id", ""))
                messages.append(Message(role="tool", content=output, tool_call_id=result_of))
            elif kind != "reasoning":
                raise RenderError(f"unsupported input item type {kind!r}")
        return messages

    def reply(self, completions: list[Completion]) -> JSON:
        (c,) = completions
        output: list[JSON] = []
        if c.reply.reasoning:
            summary = [{"type": "summary_text", "text": c.reply.reasoning}]
            output.append({"type": "reasoning", "id": new_id("rs_"), "summary": summary})
        if c.reply.content or not c.reply.tool_calls:
            text = {"type": "output_text", "text": c.reply.content, "annotations": []}
            output.append(
                {
                    "type": "message",
                    "id": new_id("msg_"),
                    "status": "completed",
                    "role": "assistant",
                    "content": [text],
                }
            )
        for t in c.reply.tool_calls:
            call = {
                "call_id": t.id,
                "name": t.name,
                "arguments": t.arguments,
                "status": "completed",
            }
            output.append({"type": "function_call", "id": new_id("fc_")} | call)
        usage: JSON = {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens}
        usage["total_tokens"] = c.prompt_tokens + c.completion_tokens
        usage |= {
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        response = {
            "id": new_id("resp_"),
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "incomplete_details": None,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        }
        if c.finish_reason == "length":
            response["status"] = "incomplete"
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        return response

    def streamer(self) -> "ResponsesStream":
        return ResponsesStream(model=self.model)


class ResponsesStream(Stream):
    """A Responses stream: the response created; its reasoning item's summary and its message's
    text as they are sampled, each item opened when its first text comes; then what is left of
    them, the function calls, and the response completed, as recorded."""

    def __init__(self, *, model: str) -> None:
        self.response: JSON = {
            "id": new_id("resp_"),
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": model,
            "output": [],
        }
        self.seq = itertools.count()
        self.items: list[JSON] = []  # the items opened, in output order
        self.texts: list[list[str]] = []  # the text each has streamed
        self.done = 0  # how many of them are done

    def opening(self, prompt_tokens: int) -> Iterator[str]:
        yield self._event("response.created", response=self.response)
        yield self._event("response.in_progress", response=self.response)

    def delta(self, part: Part) -> Iterator[str]:
        kind = _ITEMS[part.kind]
        if not self.items or self.items[-1]["type"] != kind:
            yield from self._close_open()
            yield from self._open({"type": kind})
        yield self._text_delta(self.items[-1], part.text)

    def closing(self, response: JSON, shown: dict[str, str]) -> Iterator[str]:
        """The rest of `response` (as recorded) after the text `shown` (by kind); the response
        completed keeps the ids the stream gave."""
        output = []
        for i, item in enumerate(response["output"]):
            if i < len(self.items):
                opened = self.items[i]
                item = item | {"id": opened["id"]}
                sent = shown.get(_KINDS[item["type"]], "")
                rest = unsent(_item_text(item), sent)
                if rest and i >= self.done:
                    yield self._text_delta(opened, rest)
            else:
                yield from self._open(item)
                if item["type"] != "function_call":
                    yield self._text_delta(item, _item_text(item))
            if i >= self.done:
                yield from self._finish(i, item)
            output.append(item)
        completed = response | {key: self.response[key] for key in ("id", "created_at")}
        yield self._event("response.completed", response=completed | {"output": output})

    def error(self, message: str, kind: str, code: str | None) -> Iterator[str]:
        """The stream ended by an error: the response failed, saying why."""
        failed = self.response | {
            "status": "failed",
            "error": {"code": code or kind, "message": message},
        }
        yield self._event("response.failed", response=failed)

    def _event(self, kind: str, **data: Any) -> str:
        return sse_event(kind, sequence_number=next(self.seq), **data)

    def _open(self, item: JSON) -> Iterator[str]:
        """An output item added (empty), and its text part, if it has text."""
        index = len(self.items)
        kind = item["type"]
        prefixes = {"reasoning": "rs_", "message": "msg_", "function_call": "fc_"}
        opened = item | {"id": item.get("id") or new_id(prefixes[kind])}
        self.items.append(opened)
        self.texts.append([])
        if kind == "reasoning":
            empty = {"type": "reasoning", "id": opened["id"], "summary": []}
            yield self._event("response.output_item.added", output_index=index, item=empty)
            part: JSON = {"type": "summary_text", "text": ""}
            ids = {"item_id": opened["id"], "output_index": index, "summary_index": 0}
            yield self._event("response.reasoning_summary_part.added", **ids, part=part)
        elif kind == "message":
            empty = {
                "type": "message",
                "id": opened["id"],
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            yield self._event("response.output_item.added", output_index=index, item=empty)
            part = {"type": "output_text", "text": "", "annotations": []}
            ids = {"item_id": opened["id"], "output_index": index, "content_index": 0}
            yield self._event("response.content_part.added", **ids, part=part)
        else:
            yield self._event("response.output_item.added", output_index=index, item=opened)

    def _text_delta(self, item: JSON, text: str) -> str:
        index = self.items.index(item)
        self.texts[index].append(text)
        if item["type"] == "reasoning":
            ids = {"item_id": item["id"], "output_index": index, "summary_index": 0}
            return self._event("response.reasoning_summary_text.delta", **ids, delta=text)
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return self._event("response.output_text.delta", **ids, delta=text, logprobs=[])

    def _close_open(self) -> Iterator[str]:
        """The item being streamed, done with what it has shown (reasoning is followed by the
        message: it is whole by then)."""
        if self.done < len(self.items):
            index = self.done
            text = "".join(self.texts[index])
            item = self.items[index] | {"summary": [{"type": "summary_text", "text": text}]}
            yield from self._finish(index, item)

    def _finish(self, index: int, item: JSON) -> Iterator[str]:
        """An item's done events, with its whole text (`item` as recorded)."""
        self.done = index + 1
        if item["type"] == "reasoning":
            text = _item_text(item)
            ids = {"item_id": item["id"], "output_index": index, "summary_index": 0}
            yield self._event("response.reasoning_summary_text.done", **ids, text=text)
            part = {"type": "summary_text", "text": text}
            yield self._event("response.reasoning_summary_part.done", **ids, part=part)
        elif item["type"] == "message":
            part = item["content"][0]
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield self._event("response.output_text.done", **ids, text=part["text"], logprobs=[])
            yield self._event("response.content_part.done", **ids, part=part)
        else:
            ids = {"item_id": item["id"], "output_index": index}
            arguments = item["arguments"]
            yield self._event("response.function_call_arguments.delta", **ids, delta=arguments)
            yield self._event("response.function_call_arguments.done", **ids, arguments=arguments)
        yield self._event("response.output_item.done", output_index=index, item=item)


def _item_text(item: JSON) -> str:
    """A reasoning item's summary or a message's text, as recorded."""
    if item["type"] == "reasoning":
        return "".join(part["text"] for part in item["summary"])
    if item["type"] == "message":
        return str(item["content"][0]["text"])
    return ""
