"""Wire formats: OpenAI Chat Completions, Completions and Responses, and Anthropic Messages.

Owns the pydantic request schemas (unknown fields are ignored, as the real APIs do), the
mapping of each request onto normalized messages, tools and sampling parameters, and the
replies and streaming events in each format. Streams are produced after the call has been
sampled and recorded, so a harness never sees text that is not in the store.

It does not sample, record or authenticate; `gateway/proxy.py` and `gateway/app.py` do.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.proxy import Completion, Params
from gateway.render import Message, RenderError, ToolCall, message_from_openai, text_of, validate_tools

JSON = dict[str, Any]


def _sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def _stops(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = ""
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, le=2**31 - 1)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1 - 16)  # plus the choice's index: still 64 bits
    stream: bool = False


# ---------------------------------------------------------------------------- OpenAI chat


class ChatRequest(_Request):
    messages: list[JSON] = Field(min_length=1)
    tools: list[JSON] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=16)
    stream_options: JSON | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def parse(self) -> tuple[list[Message], list[JSON], Params]:
        messages = [message_from_openai(m) for m in self.messages]
        tools = [] if self.tool_choice == "none" else validate_tools(self.tools)
        params = Params(
            self.max_completion_tokens or self.max_tokens,
            self.temperature,
            self.top_p,
            self.top_k,
            _stops(self.stop),
            self.seed,
        )
        return messages, tools, params


def _openai_tool_calls(calls: tuple[ToolCall, ...]) -> list[JSON]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def _finish(c: Completion) -> str:
    if c.reply.tool_calls:
        return "tool_calls"
    return "length" if c.finish_reason == "length" else "stop"


def _openai_logprobs(c: Completion) -> JSON:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": [{"token": t, "logprob": lp}]}
            for t, lp in zip(c.tokens, c.logprobs, strict=False)
        ]
    }


def _usage(completions: list[Completion]) -> JSON:
    prompt = completions[0].prompt_tokens
    out = sum(c.completion_tokens for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}


def chat_response(completions: list[Completion], model: str, logprobs: bool) -> JSON:
    choices = []
    for i, c in enumerate(completions):
        message: JSON = {
            "role": "assistant",
            "content": c.reply.content if c.reply.content or not c.reply.tool_calls else None,
        }
        if c.reply.tool_calls:
            message["tool_calls"] = _openai_tool_calls(c.reply.tool_calls)
        if c.reply.reasoning:
            message["reasoning_content"] = c.reply.reasoning
        choice: JSON = {"index": i, "message": message, "finish_reason": _finish(c), "logprobs": None}
        if logprobs:
            choice["logprobs"] = _openai_logprobs(c)
        choices.append(choice)
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(completions),
    }


def chat_stream(response: JSON, include_usage: bool) -> Iterator[str]:
    """The recorded reply as OpenAI chat chunks: role, content, tool calls, finish, usage."""
    base = {k: response[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    for choice in response["choices"]:
        i, message = choice["index"], choice["message"]

        def chunk(delta: JSON, finish: str | None = None, _i: int = i) -> str:
            return _sse(base | {"choices": [{"index": _i, "delta": delta, "finish_reason": finish, "logprobs": None}]})

        yield chunk({"role": "assistant", "content": ""})
        if message.get("reasoning_content"):
            yield chunk({"reasoning_content": message["reasoning_content"]})
        if message.get("content"):
            yield chunk({"content": message["content"]})
        for k, call in enumerate(message.get("tool_calls", [])):
            yield chunk({"tool_calls": [{"index": k, **call}]})
        yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield _sse(base | {"choices": [], "usage": response["usage"]})
    yield _sse("[DONE]")


# ---------------------------------------------------------------------------- OpenAI completions


class CompletionRequest(_Request):
    prompt: str | list[int]
    max_tokens: int | None = Field(16, ge=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=16)
    logprobs: int | None = Field(None, ge=0, le=5)

    def params(self) -> Params:
        return Params(self.max_tokens, self.temperature, self.top_p, self.top_k, _stops(self.stop), self.seed)


def completion_response(completions: list[Completion], model: str) -> JSON:
    return {
        "id": "cmpl-" + uuid.uuid4().hex,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "text": c.text, "finish_reason": _finish(c), "logprobs": None}
            for i, c in enumerate(completions)
        ],
        "usage": _usage(completions),
    }


def completion_stream(response: JSON) -> Iterator[str]:
    for choice in response["choices"]:
        yield _sse(response | {"choices": [choice]})
    yield _sse("[DONE]")


# ---------------------------------------------------------------------------- OpenAI Responses


class ResponsesRequest(_Request):
    input: str | list[JSON]
    instructions: str | None = None
    tools: list[JSON] | None = None
    max_output_tokens: int | None = Field(None, ge=1)

    def parse(self) -> tuple[list[Message], list[JSON], Params]:
        messages = [Message("system", self.instructions)] if self.instructions else []
        items = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        for item in items:
            kind = item.get("type", "message")
            if kind == "message":
                messages.append(message_from_openai({"role": item.get("role"), "content": item.get("content")}))
            elif kind == "function_call":
                call = ToolCall(str(item.get("name", "")), str(item.get("arguments", "")), str(item.get("call_id", "")))
                if messages and messages[-1].role == "assistant":
                    last = messages.pop()
                    messages.append(Message("assistant", last.content, (*last.tool_calls, call), last.reasoning))
                else:
                    messages.append(Message("assistant", "", (call,)))
            elif kind == "function_call_output":
                messages.append(Message("tool", text_of(item.get("output")), tool_call_id=str(item.get("call_id", ""))))
            elif kind != "reasoning":
                raise RenderError(f"unsupported input item type {kind!r}")
        tools = [
            {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
            for t in self.tools or []
            if t.get("type") == "function"
        ]
        return messages, validate_tools(tools), Params(self.max_output_tokens, self.temperature, self.top_p, self.top_k)


def responses_response(c: Completion, model: str) -> JSON:
    output: list[JSON] = []
    if c.reply.reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": "rs_" + uuid.uuid4().hex,
                "summary": [{"type": "summary_text", "text": c.reply.reasoning}],
            }
        )
    if c.reply.content or not c.reply.tool_calls:
        output.append(
            {
                "type": "message",
                "id": "msg_" + uuid.uuid4().hex,
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": c.reply.content, "annotations": []}],
            }
        )
    for call in c.reply.tool_calls:
        output.append(
            {
                "type": "function_call",
                "id": "fc_" + uuid.uuid4().hex,
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return {
        "id": "resp_" + uuid.uuid4().hex,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed" if c.finish_reason != "length" else "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"} if c.finish_reason == "length" else None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": c.prompt_tokens,
            "output_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def responses_stream(response: JSON) -> Iterator[str]:
    seq = iter(range(10**9))

    def event(kind: str, **data: Any) -> str:
        return _sse({"type": kind, "sequence_number": next(seq), **data}, kind)

    yield event("response.created", response=response | {"status": "in_progress", "output": []})
    for i, item in enumerate(response["output"]):
        yield event("response.output_item.added", output_index=i, item=item)
        if item["type"] == "message":
            part = item["content"][0]
            ids = {"item_id": item["id"], "output_index": i, "content_index": 0}
            yield event("response.content_part.added", **ids, part=part | {"text": ""})
            yield event("response.output_text.delta", **ids, delta=part["text"], logprobs=[])
            yield event("response.output_text.done", **ids, text=part["text"], logprobs=[])
            yield event("response.content_part.done", **ids, part=part)
        elif item["type"] == "function_call":
            ids = {"item_id": item["id"], "output_index": i}
            yield event("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **ids, arguments=item["arguments"])
        yield event("response.output_item.done", output_index=i, item=item)
    yield event("response.completed", response=response)


# ---------------------------------------------------------------------------- Anthropic Messages


class AnthropicRequest(_Request):
    messages: list[JSON] = Field(min_length=1)
    system: str | list[JSON] | None = None
    tools: list[JSON] | None = None
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None

    def parse(self) -> tuple[list[Message], list[JSON], Params]:
        messages = [Message("system", text_of(self.system))] if self.system else []
        for raw in self.messages:
            role, content = raw.get("role"), raw.get("content")
            if role not in ("user", "assistant"):
                raise RenderError(f"unknown message role {role!r}; expected 'user' or 'assistant'")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            if not isinstance(blocks, list):
                raise RenderError("message content must be a string or a list of content blocks")
            text, calls = [], []
            for block in blocks:
                kind = block.get("type") if isinstance(block, dict) else None
                if kind == "text":
                    text.append(str(block.get("text", "")))
                elif kind == "tool_use":
                    args = json.dumps(block.get("input", {}), ensure_ascii=False)
                    calls.append(ToolCall(str(block.get("name", "")), args, str(block.get("id", ""))))
                elif kind == "tool_result":
                    messages.append(
                        Message("tool", text_of(block.get("content")), tool_call_id=str(block.get("tool_use_id", "")))
                    )
                elif kind != "thinking":
                    raise RenderError(f"unsupported content block type {kind!r}")
            if text or calls or role == "assistant":
                messages.append(Message(role, "".join(text), tuple(calls)))
        tools = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema", {}),
                },
            }
            for t in self.tools or []
        ]
        params = Params(self.max_tokens, self.temperature, self.top_p, self.top_k, self.stop_sequences or [], self.seed)
        return messages, validate_tools(tools), params


def anthropic_response(c: Completion, model: str) -> JSON:
    content: list[JSON] = []
    if c.reply.reasoning:
        content.append({"type": "thinking", "thinking": c.reply.reasoning, "signature": ""})
    if c.reply.content or not c.reply.tool_calls:
        content.append({"type": "text", "text": c.reply.content})
    for call in c.reply.tool_calls:
        args = call.parsed_arguments()
        content.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": args if isinstance(args, dict) else {}}
        )
    stop_reason: Literal["tool_use", "max_tokens", "stop_sequence", "end_turn"]
    if c.reply.tool_calls:
        stop_reason = "tool_use"
    elif c.finish_reason == "length":
        stop_reason = "max_tokens"
    elif c.finish_reason == "stop_sequence":
        stop_reason = "stop_sequence"
    else:
        stop_reason = "end_turn"
    return {
        "id": "msg_" + uuid.uuid4().hex,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": c.stop_sequence or None,
        "usage": {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens},
    }


def anthropic_stream(message: JSON) -> Iterator[str]:
    start = message | {"content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}
    yield _sse({"type": "message_start", "message": start}, "message_start")
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            empty, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        elif block["type"] == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            empty = block | {"input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        yield _sse({"type": "content_block_start", "index": i, "content_block": empty}, "content_block_start")
        yield _sse({"type": "content_block_delta", "index": i, "delta": delta}, "content_block_delta")
        yield _sse({"type": "content_block_stop", "index": i}, "content_block_stop")
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    usage = {"output_tokens": message["usage"]["output_tokens"]}
    yield _sse({"type": "message_delta", "delta": delta, "usage": usage}, "message_delta")
    yield _sse({"type": "message_stop"}, "message_stop")


# ---------------------------------------------------------------------------- errors


def openai_error(
    message: str, kind: str = "invalid_request_error", code: str | None = None, param: str | None = None
) -> JSON:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def anthropic_error(message: str, kind: str = "invalid_request_error") -> JSON:
    return {"type": "error", "error": {"type": kind, "message": message}}
