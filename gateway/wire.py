"""Wire formats: OpenAI Chat Completions, Completions and Responses, and Anthropic Messages.

Owns a pydantic request schema per format (unknown fields ignored, as the real APIs do) that maps
a request to normalized messages, tools, sampling and chat template variables, and names the set
fields that would change what the model sees but cannot be honoured (`parse`); maps the recorded
completions to the format's reply, and to its stream (`streamer`: events opening it, a delta per
part of the reply shown while it is sampled, and once the call is recorded, the rest); and the
error objects. A stream's last event is sent only once its call is recorded. It does not sample,
record or authenticate.
"""

import itertools
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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

log = logging.getLogger(__name__)

ROLES = {"system", "developer", "user", "assistant", "tool"}
# Anthropic's `thinking.type`: whether it asks for thinking (an unknown type: asked in a way not known)
THINKING_TYPES = {"enabled": True, "adaptive": True, "disabled": False}
# Anthropic's stop reason of each finish reason but a tool call's ("tool_use"); else "end_turn"
STOP_REASONS = {"length": "max_tokens", "stop_sequence": "stop_sequence"}


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def _sse(data: Any) -> str:
    """A server-sent event's data line: text as it is, anything else as JSON."""
    if not isinstance(data, str):
        data = json.dumps(data, ensure_ascii=False)
    return f"data: {data}\n\n"


def _event(kind: str, **data: Any) -> str:
    """A server-sent event named by its `type` (Responses and Anthropic streams)."""
    return f"event: {kind}\n" + _sse({"type": kind, **data})


def _type_of(item: Any) -> Any:
    """An item's `type` (a tool, a content block), or None when the item is not an object."""
    if isinstance(item, dict):
        return item.get("type")
    return None


def error(message: str, kind: str, code: str | None = None, *, anthropic: bool) -> JSON:
    """An error object in Anthropic's shape, or else OpenAI's."""
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class _Request(BaseModel):
    """What every format's request has: the model's name, sampling and whether to stream."""

    model_config = ConfigDict(extra="ignore")

    model: str = ""
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, le=2**31 - 1)
    # plus the choice's index: still 64 bits
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1 - 16)
    stream: bool = False

    def _params(
        self, max_tokens: int | None, stop: str | list[str] | None = None, n: int = 1
    ) -> Params:
        """The sampling parameters; `stop`: one stop string or several."""
        if isinstance(stop, str):
            stops = [stop]
        else:
            stops = list(stop or [])
        return Params(
            n=n,
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=stops,
            seed=self.seed,
        )

    @staticmethod
    def _thinking(params: Params, name: str, on: bool | None, switch: bool) -> None:
        """Thinking asked on or off (None: asked in a way not known) as the template's
        `enable_thinking`, where it has that `switch`; else the field `name` is not honoured."""
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
    kind: Any = type(part).__name__
    if isinstance(part, dict):
        kind = part.get("type")
    raise RenderError(f"unsupported content part of type {kind!r}: only text is supported")


def _openai_tool_call(call: Any) -> ToolCall:
    """A tool call of an OpenAI message; arguments sent as an object are kept as JSON text."""
    fn = None
    if isinstance(call, dict):
        fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RenderError("a tool call needs function.name")
    args = fn.get("arguments", "")
    if not isinstance(args, str):
        args = json.dumps(args)
    return ToolCall(name=fn["name"], arguments=args, id=call.get("id") or "call_0")


def message_from_openai(raw: Any) -> Message:
    """An OpenAI chat message as a Message (reasoning from `reasoning_content` or `reasoning`)."""
    if not isinstance(raw, dict):
        raise RenderError("each message must be an object")
    role = raw.get("role")
    if role not in ROLES:
        raise RenderError(f"unknown message role {role!r}; expected one of {sorted(ROLES)}")
    calls = tuple(_openai_tool_call(call) for call in raw.get("tool_calls") or [])
    reasoning = raw.get("reasoning_content") or raw.get("reasoning")
    if not isinstance(reasoning, str):
        reasoning = ""
    return Message(
        role=role,
        content=text_of(raw.get("content")),
        tool_calls=calls,
        reasoning=reasoning,
        tool_call_id=str(raw.get("tool_call_id") or ""),
        name=str(raw.get("name") or ""),
    )


def validate_tools(tools: list[JSON] | None) -> list[JSON]:
    """OpenAI function tools (every format's tools are mapped to them), checked for the template."""
    for tool in tools or []:
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RenderError(
                "each tool must be "
                "{'type': 'function', 'function': {'name': ..., 'parameters': {...}}}"
            )
        if not isinstance(fn.get("parameters", {}), dict):
            raise RenderError(f"tool {fn['name']!r}: parameters must be a JSON schema object")
    return tools or []


def _finish(c: Completion) -> str:
    """OpenAI's finish reason of a completion."""
    if c.reply.tool_calls:
        return "tool_calls"
    if c.finish_reason == "length":
        return "length"
    return "stop"


def _openai_reply(
    prefix: str, kind: str, model: str, choices: list[JSON], completions: list[Completion]
) -> JSON:
    """The envelope of a Chat Completions or Completions reply; its choices share one prompt."""
    prompt = completions[0].prompt_tokens
    out = sum(c.completion_tokens for c in completions)
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


def _chat_message(reply: Message) -> JSON:
    """A reply as a Chat Completions message: its content is null when it only calls tools."""
    message: JSON = {"role": "assistant", "content": reply.content}
    if reply.tool_calls and not reply.content:
        message["content"] = None
    if reply.tool_calls:
        message["tool_calls"] = [t.openai(t.arguments) for t in reply.tool_calls]
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    return message


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
    # the template's variables, as vLLM and sglang take them
    chat_template_kwargs: JSON | None = None
    response_format: JSON | None = None
    reasoning_effort: Any = None

    def parse(self, thinking_switch: bool = False) -> tuple[list[Message], list[JSON], Params]:
        messages = [message_from_openai(m) for m in self.messages]
        tools: list[JSON] = []
        if self.tool_choice != "none":
            tools = validate_tools(self.tools)
        params = self._params(self.max_completion_tokens or self.max_tokens, self.stop, self.n)
        params.template = dict(self.chat_template_kwargs or {})
        # No template shows these (thinking is asked through `chat_template_kwargs`, e.g.
        # {"enable_thinking": false}).
        asked = {
            "tool_choice": self.tool_choice not in (None, "auto", "none"),
            "response_format": self.response_format not in (None, {"type": "text"}),
            "reasoning_effort": self.reasoning_effort is not None,
        }
        params.not_honoured += [name for name, unmet in asked.items() if unmet]
        # a stream's form: its usage chunk is sent when asked, nothing else is
        others = sorted(set(self.stream_options or {}) - {"include_usage"})
        params.not_honoured += [f"stream_options.{key[:64]}" for key in others]
        return messages, tools, params

    def reply(self, completions: list[Completion]) -> JSON:
        choices = []
        for i, c in enumerate(completions):
            choice = {
                "index": i,
                "message": _chat_message(c.reply),
                "finish_reason": _finish(c),
                "logprobs": None,
            }
            if self.logprobs:
                choice["logprobs"] = _logprobs(c)
            choices.append(choice)
        return _openai_reply("chatcmpl-", "chat.completion", self.model, choices, completions)

    def streamer(self) -> "ChatStream":
        include_usage = bool((self.stream_options or {}).get("include_usage"))
        return ChatStream(model=self.model, include_usage=include_usage)


class ChatStream:
    """A Chat Completions stream: chunks of deltas of one choice while it is sampled, then what
    is left of each choice, its tool calls and finish reason, the usage if asked, and `[DONE]`."""

    def __init__(self, *, model: str, include_usage: bool) -> None:
        self.head = {
            "id": _id("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        self.include_usage = include_usage

    def opening(self, prompt_tokens: int) -> Iterator[str]:
        yield self._chunk(0, {"role": "assistant", "content": ""})

    def delta(self, part: Part) -> Iterator[str]:
        yield self._chunk(0, {_CHAT_KEYS[part.kind]: part.text})

    def closing(self, response: JSON, shown: dict[str, str]) -> Iterator[str]:
        """The rest of `response` (the reply as recorded) after what the stream `shown` of its
        first choice (by kind)."""
        for choice in response["choices"]:
            index = choice["index"]
            message = choice["message"]
            sent = shown
            if index:
                sent = {}
                yield self._chunk(index, {"role": "assistant", "content": ""})
            for kind, key in _CHAT_KEYS.items():
                rest = _rest(message.get(key) or "", sent.get(kind, ""))
                if rest:
                    yield self._chunk(index, {key: rest})
            for k, call in enumerate(message.get("tool_calls", [])):
                yield self._chunk(index, {"tool_calls": [{"index": k, **call}]})
            # the last, empty delta carries the finish reason
            yield self._chunk(index, {}, choice["finish_reason"])
        if self.include_usage:
            yield _sse(self.head | {"choices": [], "usage": response["usage"]})
        yield _sse("[DONE]")

    def error(self, message: str, kind: str, code: str | None) -> Iterator[str]:
        """The stream ended by an error: its object, as the SDKs read it in a stream."""
        yield _sse(error(message, kind, code, anthropic=False))

    def _chunk(self, index: int, delta: JSON, finish: str | None = None) -> str:
        """One chunk: a choice's delta."""
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        return _sse(self.head | {"choices": [choice]})


# A Chat Completions delta's key for each kind of text
_CHAT_KEYS = {REASONING: "reasoning_content", CONTENT: "content"}


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

    def streamer(self) -> "CompletionStream":
        return CompletionStream(model=self.model)


class CompletionStream:
    """A Completions stream: text deltas of one choice while it is sampled, then what is left of
    each choice with its finish reason, and `[DONE]`."""

    def __init__(self, *, model: str) -> None:
        self.head = {
            "id": _id("cmpl-"),
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
        }

    def opening(self, prompt_tokens: int) -> Iterator[str]:
        yield from ()

    def delta(self, part: Part) -> Iterator[str]:
        yield self._chunk(0, part.text)

    def closing(self, response: JSON, shown: dict[str, str]) -> Iterator[str]:
        for choice in response["choices"]:
            sent = ""
            if choice["index"] == 0:
                sent = shown.get(CONTENT, "")
            rest = _rest(choice["text"], sent)
            yield self._chunk(choice["index"], rest, choice["finish_reason"])
        yield _sse("[DONE]")

    def error(self, message: str, kind: str, code: str | None) -> Iterator[str]:
        yield _sse(error(message, kind, code, anthropic=False))

    def _chunk(self, index: int, text: str, finish: str | None = None) -> str:
        choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": None}
        return _sse(self.head | {"choices": [choice]})


# ---------------------------------------------------------------------------- OpenAI Responses


def _functions(tools: list[JSON], not_honoured: list[str]) -> list[JSON]:
    """Responses tools in the chat shape: function tools, and those a `namespace` tool groups
    (Codex's), each under its own name, as a call of it comes back; other types (built-in:
    `web_search`, ...) are not honoured."""
    out = []
    for t in tools:
        kind = _type_of(t)
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
            output.append({"type": "reasoning", "id": _id("rs_"), "summary": summary})
        if c.reply.content or not c.reply.tool_calls:
            text = {"type": "output_text", "text": c.reply.content, "annotations": []}
            output.append(
                {
                    "type": "message",
                    "id": _id("msg_"),
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
            output.append({"type": "function_call", "id": _id("fc_")} | call)
        usage: JSON = {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens}
        usage["total_tokens"] = c.prompt_tokens + c.completion_tokens
        usage |= {
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        response = {
            "id": _id("resp_"),
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


class ResponsesStream:
    """A Responses stream: the response created; its reasoning item's summary and its message's
    text as they are sampled, each item opened when its first text comes; then what is left of
    them, the function calls, and the response completed, as recorded."""

    def __init__(self, *, model: str) -> None:
        self.response: JSON = {
            "id": _id("resp_"),
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
        kind = _RESPONSES_ITEMS[part.kind]
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
                sent = shown.get(_RESPONSES_KINDS[item["type"]], "")
                rest = _rest(_item_text(item), sent)
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
        return _event(kind, sequence_number=next(self.seq), **data)

    def _open(self, item: JSON) -> Iterator[str]:
        """An output item added (empty), and its text part, if it has text."""
        index = len(self.items)
        kind = item["type"]
        prefixes = {"reasoning": "rs_", "message": "msg_", "function_call": "fc_"}
        opened = item | {"id": item.get("id") or _id(prefixes[kind])}
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


# The Responses output item of each kind of text, and back
_RESPONSES_ITEMS = {REASONING: "reasoning", CONTENT: "message"}
_RESPONSES_KINDS = {"reasoning": REASONING, "message": CONTENT, "function_call": CONTENT}


def _item_text(item: JSON) -> str:
    """A reasoning item's summary or a message's text, as recorded."""
    if item["type"] == "reasoning":
        return "".join(part["text"] for part in item["summary"])
    if item["type"] == "message":
        return str(item["content"][0]["text"])
    return ""


# ---------------------------------------------------------------------------- Anthropic Messages


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
        kind = _type_of(block)
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


class AnthropicRequest(_Request):
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
            "id": _id("msg_"),
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


class MessagesStream:
    """An Anthropic Messages stream: the message started; a thinking block and a text block as
    they are sampled, each started when its first text comes; then what is left of them, the
    tool_use blocks, the stop reason and usage, and the message stopped, as recorded."""

    def __init__(self, *, model: str) -> None:
        self.id = _id("msg_")
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
        yield _event("message_start", message=start)

    def delta(self, part: Part) -> Iterator[str]:
        kind = _BLOCKS[part.kind]
        if not self.blocks or self.blocks[-1] != kind:
            if self.stopped < len(self.blocks):
                yield from self._stop()
            yield from self._start({"type": kind, kind: ""})
        yield _event(
            "content_block_delta", index=len(self.blocks) - 1, delta=_delta(kind, part.text)
        )

    def closing(self, message: JSON, shown: dict[str, str]) -> Iterator[str]:
        """The rest of `message` (as recorded) after the text `shown` (by kind)."""
        for i, block in enumerate(message["content"]):
            if i < len(self.blocks):
                if i >= self.stopped:
                    kind = block["type"]
                    rest = _rest(block[kind], shown.get(_KINDS[kind], ""))
                    if rest:
                        yield _event("content_block_delta", index=i, delta=_delta(kind, rest))
                    yield from self._stop()
                continue
            yield from self._start(block)
            if block["type"] == "tool_use":
                arguments = json.dumps(block["input"], ensure_ascii=False)
                delta = {"type": "input_json_delta", "partial_json": arguments}
            else:
                delta = _delta(block["type"], block[block["type"]])
            yield _event("content_block_delta", index=i, delta=delta)
            yield from self._stop()
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
        usage = {"output_tokens": message["usage"]["output_tokens"]}
        yield _event("message_delta", delta=delta, usage=usage)
        yield _event("message_stop")

    def error(self, message: str, kind: str, code: str | None) -> Iterator[str]:
        """The stream ended by an error event."""
        yield _event("error", error={"type": kind, "message": message})

    def _start(self, block: JSON) -> Iterator[str]:
        """A block started, empty."""
        kind = block["type"]
        empty: JSON = {"type": "text", "text": ""}
        if kind == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "tool_use":
            empty = block | {"input": {}}
        self.blocks.append(kind)
        yield _event("content_block_start", index=len(self.blocks) - 1, content_block=empty)

    def _stop(self) -> Iterator[str]:
        """The block being streamed, stopped."""
        yield _event("content_block_stop", index=self.stopped)
        self.stopped += 1


# The Anthropic content block of each kind of text, and back
_BLOCKS = {REASONING: "thinking", CONTENT: "text"}
_KINDS = {"thinking": REASONING, "text": CONTENT}


def _delta(kind: str, text: str) -> JSON:
    """A thinking or text block's delta."""
    if kind == "thinking":
        return {"type": "thinking_delta", "thinking": text}
    return {"type": "text_delta", "text": text}


def _rest(whole: str, shown: str) -> str:
    """What a stream has yet to send of `whole` (a reply's text as recorded) after `shown`."""
    if not whole.startswith(shown):
        # What a stream shows is held back until it is certain (gateway/stream.py): a bug.
        log.error(
            "a stream showed %r, which the recorded text %r does not start with", shown, whole
        )
        return ""
    return whole[len(shown) :]


Request = ChatRequest | CompletionRequest | ResponsesRequest | AnthropicRequest
Stream = ChatStream | CompletionStream | ResponsesStream | MessagesStream

# The chat wire formats by the name a recorded call's `response["api"]` gives them.
CHAT_REQUESTS: dict[str, type[ChatRequest | ResponsesRequest | AnthropicRequest]] = {
    "chat": ChatRequest,
    "responses": ResponsesRequest,
    "messages": AnthropicRequest,
}


def parse_recorded(
    api: str, body: JSON, *, thinking_switch: bool
) -> tuple[list[Message], list[JSON], Params]:
    """A recorded chat call's request, parsed as it was when it came in."""
    return CHAT_REQUESTS[api].model_validate(body).parse(thinking_switch)
