"""What the wire formats share: the request base class, the `Stream` protocol, error objects, and
the readers of OpenAI's messages and tools that every chat format maps its own to.

- `BaseRequest`: the fields every format's request has (the model's name, sampling, `stream`),
  mapped to `Params`; unknown fields are ignored, as the real APIs do.
- `Stream`: what a format's stream sends, in the order `gateway/routes.py` asks for it: its
  opening, a delta per part of the reply shown while it is sampled, and once the call is recorded,
  the rest (or an error in its place). A stream's last event is sent only once its call is recorded.
- `error`: an error object in Anthropic's shape, or else OpenAI's.
- `text_of`, `message_from_openai`, `validate_tools`: a message's text, an OpenAI chat message as
  a `Message`, and function tools checked for the chat template.
- The pieces two formats' replies share: server-sent events, ids, OpenAI's finish reason and reply
  envelope, and what a stream has yet to send of a recorded text (`unsent`).
It knows no one format's fields (`chat.py`, `completions.py`, `responses.py`, `messages.py`), and
does not sample, record or authenticate.
"""

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agl.types import JSON
from gateway.types import Completion, Message, Params, Part, RenderError, ToolCall

log = logging.getLogger(__name__)

ROLES = {"system", "developer", "user", "assistant", "tool"}


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def sse(data: Any) -> str:
    """A server-sent event's data line: text as it is, anything else as JSON."""
    if not isinstance(data, str):
        data = json.dumps(data, ensure_ascii=False)
    return f"data: {data}\n\n"


def sse_event(kind: str, **data: Any) -> str:
    """A server-sent event named by its `type` (Responses and Anthropic streams)."""
    return f"event: {kind}\n" + sse({"type": kind, **data})


def type_of(item: Any) -> Any:
    """An item's `type` (a tool, a content block), or None when the item is not an object."""
    if isinstance(item, dict):
        return item.get("type")
    return None


def error(message: str, kind: str, code: str | None = None, *, anthropic: bool) -> JSON:
    """An error object in Anthropic's shape, or else OpenAI's."""
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def unsent(whole: str, shown: str) -> str:
    """What a stream has yet to send of `whole` (a reply's text as recorded) after `shown`."""
    if not whole.startswith(shown):
        # What a stream shows is held back until it is certain (gateway/stream.py): a bug.
        log.error(
            "a stream showed %r, which the recorded text %r does not start with", shown, whole
        )
        return ""
    return whole[len(shown) :]


class BaseRequest(BaseModel):
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


class Stream(Protocol):
    """A reply as server-sent events in one wire format. Each method gives the events of one step;
    the last event of `closing` ends the stream, as does `error`'s."""

    def opening(self, prompt_tokens: int) -> Iterator[str]:
        """The events that open the stream, before any text of the reply."""
        ...

    def delta(self, part: Part) -> Iterator[str]:
        """The events that show `part` of the reply, as it is sampled."""
        ...

    def closing(self, response: JSON, shown: dict[str, str]) -> Iterator[str]:
        """The rest of `response` (the reply as recorded, in this format) after the text the
        stream has `shown` (by kind), then the stream's last event."""
        ...

    def error(self, message: str, kind: str, code: str | None) -> Iterator[str]:
        """The stream ended by an error, as the format tells one in a stream."""
        ...


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


# ---------------------------------------------------------------------------- OpenAI replies


def finish_reason(c: Completion) -> str:
    """OpenAI's finish reason of a completion (Chat Completions and Completions)."""
    if c.reply.tool_calls:
        return "tool_calls"
    if c.finish_reason == "length":
        return "length"
    return "stop"


def openai_reply(
    prefix: str, kind: str, model: str, choices: list[JSON], completions: list[Completion]
) -> JSON:
    """The envelope of a Chat Completions or Completions reply; its choices share one prompt."""
    prompt = completions[0].prompt_tokens
    out = sum(c.completion_tokens for c in completions)
    usage = {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}
    head = {"id": new_id(prefix), "object": kind, "created": int(time.time()), "model": model}
    return head | {"choices": choices, "usage": usage}
