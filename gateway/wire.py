"""Wire formats: OpenAI Chat Completions, Completions and Responses, and Anthropic Messages.

Owns a pydantic request schema per format (unknown fields ignored, as the real APIs do) that maps
a request to normalized messages, tools, sampling and chat template variables, and names the set
fields that would change what the model sees but cannot be honoured (`parse`); maps the recorded
completions to the format's reply and stream (`reply`, `events`); and the error objects. Streams
are made after the call is recorded: a harness never sees unstored text. It does not sample,
record or authenticate.
"""

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agl.types import JSON
from gateway.types import Completion, Message, Params, RenderError, ToolCall

ROLES = {"system", "developer", "user", "assistant", "tool"}


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def _sse(data: Any) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def _event(kind: str, **data: Any) -> str:
    """A server-sent event named by its `type` (Responses and Anthropic streams)."""
    return f"event: {kind}\n" + _sse({"type": kind, **data})


def error(message: str, kind: str, code: str | None = None, *, anthropic: bool) -> JSON:
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = ""
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, le=2**31 - 1)
    seed: int | None = Field(
        None, ge=-(2**63), le=2**63 - 1 - 16
    )  # plus the choice's index: still 64 bits
    stream: bool = False

    def _params(
        self, max_tokens: int | None, stop: str | list[str] | None = None, n: int = 1
    ) -> Params:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        return Params(n, max_tokens, self.temperature, self.top_p, self.top_k, stops, self.seed)

    @staticmethod
    def _thinking(params: Params, name: str, on: bool | None, switch: bool) -> None:
        """Thinking asked on or off (None: asked in a way not known) as the template's `enable_thinking`, where it
        has that `switch`; else the field `name` is not honoured."""
        if switch and on is not None:
            params.template["enable_thinking"] = on
        else:
            params.not_honoured.append(name)


# ---------------------------------------------------------------------------- OpenAI messages and tools


def text_of(content: Any) -> str:
    """The text of a message content: a string, or a list of text parts (other parts are refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RenderError(
            f"message content must be a string or a list of parts, not {type(content).__name__}"
        )
    return "".join(map(_part_text, content))


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and isinstance(part.get("text"), str):
        return part["text"]
    if isinstance(part, dict) and part.get("type") in ("tool_result", "output_text", "input_text"):
        return text_of(part.get("content", part.get("text")))
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    raise RenderError(f"unsupported content part of type {kind!r}: only text is supported")


def message_from_openai(raw: Any) -> Message:
    if not isinstance(raw, dict):
        raise RenderError("each message must be an object")
    role = raw.get("role")
    if role not in ROLES:
        raise RenderError(f"unknown message role {role!r}; expected one of {sorted(ROLES)}")
    calls = []
    for call in raw.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RenderError("a tool call needs function.name")
        args = fn.get("arguments", "")
        args = args if isinstance(args, str) else json.dumps(args)
        calls.append(ToolCall(fn["name"], args, call.get("id") or "call_0"))
    reasoning = raw.get("reasoning_content") or raw.get("reasoning")
    reasoning = reasoning if isinstance(reasoning, str) else ""
    tool_call_id, name = str(raw.get("tool_call_id") or ""), str(raw.get("name") or "")
    return Message(role, text_of(raw.get("content")), tuple(calls), reasoning, tool_call_id, name)


def validate_tools(tools: list[JSON] | None) -> list[JSON]:
    """OpenAI function tools (every format's tools are mapped to them), checked for the template."""
    for tool in tools or []:
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RenderError(
                "each tool must be {'type': 'function', 'function': {'name': ..., 'parameters': {...}}}"
            )
        if not isinstance(fn.get("parameters", {}), dict):
            raise RenderError(f"tool {fn['name']!r}: parameters must be a JSON schema object")
    return tools or []


def _finish(c: Completion) -> str:
    return (
        "tool_calls" if c.reply.tool_calls else "length" if c.finish_reason == "length" else "stop"
    )


def _openai_reply(
    prefix: str, kind: str, model: str, choices: list[JSON], completions: list[Completion]
) -> JSON:
    """The envelope of a Chat Completions or Completions reply; its choices share one prompt."""
    prompt, out = completions[0].prompt_tokens, sum(c.completion_tokens for c in completions)
    usage = {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}
    head = {"id": _id(prefix), "object": kind, "created": int(time.time()), "model": model}
    return head | {"choices": choices, "usage": usage}


# ---------------------------------------------------------------------------- OpenAI chat


def _logprobs(c: Completion) -> JSON:
    pairs: list[JSON] = [
        {"token": t, "logprob": lp} for t, lp in zip(c.tokens, c.logprobs, strict=False)
    ]
    return {
        "content": [p | {"bytes": list(p["token"].encode()), "top_logprobs": [p]} for p in pairs]
    }


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
    chat_template_kwargs: JSON | None = (
        None  # the template's variables, as vLLM and sglang take them
    )
    response_format: JSON | None = None
    reasoning_effort: Any = None

    def parse(self, thinking_switch: bool = False) -> tuple[list[Message], list[JSON], Params]:
        messages = [message_from_openai(m) for m in self.messages]
        tools = [] if self.tool_choice == "none" else validate_tools(self.tools)
        params = self._params(self.max_completion_tokens or self.max_tokens, self.stop, self.n)
        params.template = dict(self.chat_template_kwargs or {})
        asked = {  # no template shows these (thinking: `chat_template_kwargs`, e.g. {"enable_thinking": false})
            "tool_choice": self.tool_choice not in (None, "auto", "none"),
            "response_format": self.response_format not in (None, {"type": "text"}),
            "reasoning_effort": self.reasoning_effort is not None,
        }
        params.not_honoured += [name for name, unmet in asked.items() if unmet]
        return messages, tools, params

    def reply(self, completions: list[Completion]) -> JSON:
        choices = []
        for i, c in enumerate(completions):
            content = c.reply.content if c.reply.content or not c.reply.tool_calls else None
            message: JSON = {"role": "assistant", "content": content}
            if c.reply.tool_calls:
                message["tool_calls"] = [t.openai(t.arguments) for t in c.reply.tool_calls]
            if c.reply.reasoning:
                message["reasoning_content"] = c.reply.reasoning
            logprobs = _logprobs(c) if self.logprobs else None
            choices.append(
                {"index": i, "message": message, "finish_reason": _finish(c), "logprobs": logprobs}
            )
        return _openai_reply("chatcmpl-", "chat.completion", self.model, choices, completions)

    def events(self, response: JSON) -> Iterator[str]:
        base = {k: response[k] for k in ("id", "created", "model")} | {
            "object": "chat.completion.chunk"
        }
        for choice in response["choices"]:
            i, message = choice["index"], choice["message"]
            deltas: list[JSON] = [{"role": "assistant", "content": ""}]
            deltas += [
                {key: message[key]} for key in ("reasoning_content", "content") if message.get(key)
            ]
            deltas += [
                {"tool_calls": [{"index": k, **call}]}
                for k, call in enumerate(message.get("tool_calls", []))
            ]
            for n, delta in enumerate(
                [*deltas, {}]
            ):  # the last, empty delta carries the finish reason
                finish = choice["finish_reason"] if n == len(deltas) else None
                chunk = {"index": i, "delta": delta, "finish_reason": finish, "logprobs": None}
                yield _sse(base | {"choices": [chunk]})
        if (self.stream_options or {}).get("include_usage"):
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
        return self._params(self.max_tokens, self.stop, self.n)

    def reply(self, completions: list[Completion]) -> JSON:
        choices = [
            {"index": i, "text": c.reply.content, "finish_reason": _finish(c), "logprobs": None}
            for i, c in enumerate(completions)
        ]
        return _openai_reply("cmpl-", "text_completion", self.model, choices, completions)

    def events(self, response: JSON) -> Iterator[str]:
        for choice in response["choices"]:
            yield _sse(response | {"choices": [choice]})
        yield _sse("[DONE]")


# ---------------------------------------------------------------------------- OpenAI Responses


def _functions(tools: list[JSON], not_honoured: list[str]) -> list[JSON]:
    """Responses tools in the chat shape: function tools, and those a `namespace` tool groups (Codex's), each
    under its own name, as a call of it comes back; other types (built-in: `web_search`, ...) are not honoured."""
    out = []
    for t in tools:
        kind = t.get("type") if isinstance(t, dict) else None
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


class ResponsesRequest(_Request):
    input: str | list[JSON]
    instructions: str | None = None
    tools: list[JSON] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    reasoning: JSON | None = None
    tool_choice: Any = None
    text: JSON | None = None
    previous_response_id: str | None = None

    def parse(self, thinking_switch: bool = False) -> tuple[list[Message], list[JSON], Params]:
        messages = [Message("system", self.instructions)] if self.instructions else []
        items = (
            [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        )
        for item in items:
            kind = item.get("type", "message")
            if kind == "message":
                messages.append(
                    message_from_openai({"role": item.get("role"), "content": item.get("content")})
                )
            elif kind == "function_call":
                call = ToolCall(
                    str(item.get("name", "")),
                    str(item.get("arguments", "")),
                    str(item.get("call_id", "")),
                )
                last = (
                    messages.pop()
                    if messages and messages[-1].role == "assistant"
                    else Message("assistant")
                )
                messages.append(
                    Message("assistant", last.content, (*last.tool_calls, call), last.reasoning)
                )
            elif kind == "function_call_output":
                messages.append(
                    Message(
                        "tool",
                        text_of(item.get("output")),
                        tool_call_id=str(item.get("call_id", "")),
                    )
                )
            elif kind != "reasoning":
                raise RenderError(f"unsupported input item type {kind!r}")
        params = self._params(self.max_output_tokens)
        tools = (
            [] if self.tool_choice == "none" else _functions(self.tools or [], params.not_honoured)
        )
        if (
            self.reasoning is not None
        ):  # effort "none" or "minimal": off, else on; no template switch sets a level
            effort = self.reasoning.get("effort")
            self._thinking(params, "reasoning", effort not in ("none", "minimal"), thinking_switch)
            params.not_honoured += ["reasoning.effort"] if effort not in (None, "none") else []
        asked = {
            "tool_choice": self.tool_choice not in (None, "auto", "none"),
            "text.format": (self.text or {}).get("format") not in (None, {"type": "text"}),
            "previous_response_id": self.previous_response_id
            is not None,  # no response is stored to continue
        }
        params.not_honoured += [name for name, unmet in asked.items() if unmet]
        return messages, validate_tools(tools), params

    def reply(self, completions: list[Completion]) -> JSON:
        (c,) = completions
        output: list[JSON] = []
        if c.reply.reasoning:
            summary = [{"type": "summary_text", "text": c.reply.reasoning}]
            output.append({"type": "reasoning", "id": _id("rs_"), "summary": summary})
        if c.reply.content or not c.reply.tool_calls:
            message = {
                "type": "message",
                "id": _id("msg_"),
                "status": "completed",
                "role": "assistant",
            }
            output.append(
                message
                | {"content": [{"type": "output_text", "text": c.reply.content, "annotations": []}]}
            )
        for t in c.reply.tool_calls:
            call = {
                "call_id": t.id,
                "name": t.name,
                "arguments": t.arguments,
                "status": "completed",
            }
            output.append({"type": "function_call", "id": _id("fc_")} | call)
        cut = c.finish_reason == "length"
        usage: JSON = {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens}
        usage["total_tokens"] = c.prompt_tokens + c.completion_tokens
        usage |= {
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        return {
            "id": _id("resp_"),
            "object": "response",
            "created_at": int(time.time()),
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        }

    def events(self, response: JSON) -> Iterator[str]:
        seq = itertools.count()

        def event(kind: str, **data: Any) -> str:
            return _event(kind, sequence_number=next(seq), **data)

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
                yield event(
                    "response.function_call_arguments.delta", **ids, delta=item["arguments"]
                )
                yield event(
                    "response.function_call_arguments.done", **ids, arguments=item["arguments"]
                )
            yield event("response.output_item.done", output_index=i, item=item)
        yield event("response.completed", response=response)


# ---------------------------------------------------------------------------- Anthropic Messages


class AnthropicRequest(_Request):
    messages: list[JSON] = Field(min_length=1)
    system: str | list[JSON] | None = None
    tools: list[JSON] | None = None
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    thinking: JSON | None = None
    tool_choice: JSON | None = None

    def parse(self, thinking_switch: bool = False) -> tuple[list[Message], list[JSON], Params]:
        messages = [Message("system", text_of(self.system))] if self.system else []
        for raw in self.messages:
            role, content = raw.get("role"), raw.get("content")
            if role not in (
                "user",
                "assistant",
                "system",
            ):  # Claude Code sends system turns mid-conversation
                raise RenderError(
                    f"unknown message role {role!r}; expected 'user', 'assistant' or 'system'"
                )
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
                    calls.append(
                        ToolCall(str(block.get("name", "")), args, str(block.get("id", "")))
                    )
                elif kind == "tool_result":
                    output, result_of = (
                        text_of(block.get("content")),
                        str(block.get("tool_use_id", "")),
                    )
                    failed = block.get("is_error") is True
                    messages.append(
                        Message("tool", output, tool_call_id=result_of, is_error=failed)
                    )
                elif kind != "thinking":
                    raise RenderError(f"unsupported content block type {kind!r}")
            if text or calls or role == "assistant":
                messages.append(Message(role, "".join(text), tuple(calls)))
        params, tools = self._params(self.max_tokens, self.stop_sequences), []
        for t in self.tools or []:  # in the OpenAI shape the templates take
            if (
                t.get("type", "custom") != "custom"
            ):  # a server or schema-less tool: `web_search_20250305`, `bash_...`
                params.not_honoured.append(f"tools.{str(t['type'])[:64]}")
                continue
            fn = {"name": t.get("name"), "description": t.get("description", "")}
            tools.append(
                {"type": "function", "function": fn | {"parameters": t.get("input_schema", {})}}
            )
        if self.thinking is not None:  # no template switch sets a budget
            on = {"enabled": True, "adaptive": True, "disabled": False}.get(
                str(self.thinking.get("type"))
            )
            self._thinking(params, "thinking", on, thinking_switch)
            params.not_honoured += (
                ["thinking.budget_tokens"] if "budget_tokens" in self.thinking else []
            )
        choice = (self.tool_choice or {}).get("type")
        params.not_honoured += ["tool_choice"] if choice not in (None, "auto", "none") else []
        return messages, [] if choice == "none" else validate_tools(tools), params

    def reply(self, completions: list[Completion]) -> JSON:
        (c,) = completions
        content: list[JSON] = []
        if c.reply.reasoning:
            content.append({"type": "thinking", "thinking": c.reply.reasoning, "signature": ""})
        if c.reply.content or not c.reply.tool_calls:
            content.append({"type": "text", "text": c.reply.content})
        for call in c.reply.tool_calls:
            args = call.parsed_arguments()
            args = args if isinstance(args, dict) else {}
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": args})
        reasons = {"length": "max_tokens", "stop_sequence": "stop_sequence"}
        stop_reason = "tool_use" if c.reply.tool_calls else reasons.get(c.finish_reason, "end_turn")
        return {
            "id": _id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": c.stop_sequence or None,
            "usage": {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens},
        }

    def events(self, message: JSON) -> Iterator[str]:
        start = message | {"content": [], "stop_reason": None, "stop_sequence": None}
        start["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}
        yield _event("message_start", message=start)
        for i, block in enumerate(message["content"]):
            if block["type"] == "text":
                empty, delta = (
                    {"type": "text", "text": ""},
                    {"type": "text_delta", "text": block["text"]},
                )
            elif block["type"] == "thinking":
                empty = {"type": "thinking", "thinking": "", "signature": ""}
                delta = {"type": "thinking_delta", "thinking": block["thinking"]}
            else:
                empty = block | {"input": {}}
                delta = {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(block["input"], ensure_ascii=False),
                }
            yield _event("content_block_start", index=i, content_block=empty)
            yield _event("content_block_delta", index=i, delta=delta)
            yield _event("content_block_stop", index=i)
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
        yield _event(
            "message_delta", delta=delta, usage={"output_tokens": message["usage"]["output_tokens"]}
        )
        yield _event("message_stop")


Request = ChatRequest | CompletionRequest | ResponsesRequest | AnthropicRequest
