"""OpenAI Chat Completions (`/v1/chat/completions`): its request, its reply and its stream.

- `ChatRequest`: the request schema, mapped to messages, tools, sampling and the chat template's
  variables (`chat_template_kwargs`, passed as given, as vLLM and sglang take them); the set fields
  no template can show are named as not honoured (`parse`).
- `ChatRequest.reply`: the recorded completions as a `chat.completion`, one choice each, with
  token logprobs when asked.
- `ChatStream`: the reply as `chat.completion.chunk` events: deltas of the first choice while it
  is sampled, then the rest of every choice, the usage when asked, and `[DONE]`.
It does not sample, record or authenticate.
"""

import time
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from agl.types import JSON
from gateway.types import CONTENT, REASONING, Completion, Message, Params, Part
from gateway.wire.base import (
    BaseRequest,
    Stream,
    error,
    finish_reason,
    message_from_openai,
    new_id,
    openai_reply,
    sse,
    unsent,
    validate_tools,
)

# A Chat Completions delta's key for each kind of text
_KEYS = {REASONING: "reasoning_content", CONTENT: "content"}


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


class ChatRequest(BaseRequest):
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
                "finish_reason": finish_reason(c),
                "logprobs": None,
            }
            if self.logprobs:
                choice["logprobs"] = _logprobs(c)
            choices.append(choice)
        return openai_reply("chatcmpl-", "chat.completion", self.model, choices, completions)

    def streamer(self) -> "ChatStream":
        include_usage = bool((self.stream_options or {}).get("include_usage"))
        return ChatStream(model=self.model, include_usage=include_usage)


class ChatStream(Stream):
    """A Chat Completions stream: chunks of deltas of one choice while it is sampled, then what
    is left of each choice, its tool calls and finish reason, the usage if asked, and `[DONE]`."""

    def __init__(self, *, model: str, include_usage: bool) -> None:
        self.head = {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        self.include_usage = include_usage

    def opening(self, prompt_tokens: int) -> Iterator[str]:
        yield self._chunk(0, {"role": "assistant", "content": ""})

    def delta(self, part: Part) -> Iterator[str]:
        yield self._chunk(0, {_KEYS[part.kind]: part.text})

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
            for kind, key in _KEYS.items():
                rest = unsent(message.get(key) or "", sent.get(kind, ""))
                if rest:
                    yield self._chunk(index, {key: rest})
            for k, call in enumerate(message.get("tool_calls", [])):
                yield self._chunk(index, {"tool_calls": [{"index": k, **call}]})
            # the last, empty delta carries the finish reason
            yield self._chunk(index, {}, choice["finish_reason"])
        if self.include_usage:
            yield sse(self.head | {"choices": [], "usage": response["usage"]})
        yield sse("[DONE]")

    def error(self, message: str, kind: str, code: str | None) -> Iterator[str]:
        """The stream ended by an error: its object, as the SDKs read it in a stream."""
        yield sse(error(message, kind, code, anthropic=False))

    def _chunk(self, index: int, delta: JSON, finish: str | None = None) -> str:
        """One chunk: a choice's delta."""
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        return sse(self.head | {"choices": [choice]})
