"""The shapes the gateway's modules hand each other: a normalized chat message, a harness's
call as received, its sampling parameters, one sampled reply, the text of a reply shown
while it is sampled, and the count of the gateway's live peers. Standard library only; wire
schemas (pydantic) are in `gateway/wire/`, stored records in `agl/types.py`.
"""

import asyncio
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agl.types import JSON, Charge, Rollout


class RenderError(ValueError):
    """Messages, tools or a prompt the gateway cannot serve (the client's fault: a 400)."""


class TooLarge(Exception):
    """A request body over the size limit, or a rollout's bodies over its storage budget (a 413)."""


class ContextOverflow(RenderError):
    """The prompt plus the requested completion does not fit in the engine's context."""


@dataclass(frozen=True)
class ToolCall:
    """A tool call of an assistant message: the function's name, its arguments and the call's id."""

    name: str
    arguments: str  # JSON text, as OpenAI clients send and expect it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def parsed_arguments(self) -> Any:
        """The arguments as JSON values; text that is not JSON stays text."""
        if not self.arguments:
            return {}
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments

    def openai(self, arguments: Any) -> JSON:
        """The call in OpenAI's shape: `arguments` as text on the wire, parsed for a chat template."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        }


@dataclass(frozen=True)
class Message:
    """One chat message in the shape the templates take."""

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""
    tool_call_id: str = ""
    name: str = ""
    is_error: bool = False  # a tool result the harness marked as an error (Anthropic's `is_error`)

    def template_dict(self) -> JSON:
        """The message as a chat template takes it (OpenAI's shape; empty optional fields left out)."""
        role = self.role
        if role == "developer":  # OpenAI's newer name of the system role; templates know only that
            role = "system"
        out: JSON = {"role": role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.openai(c.parsed_arguments()) for c in self.tool_calls]
        extra = {
            "reasoning_content": self.reasoning,
            "tool_call_id": self.tool_call_id,
            "name": self.name,
        }
        return out | {k: v for k, v in extra.items() if v}

    def map_text(self, f: Callable[[str], str]) -> "Message":
        """The message with `f` applied to each of its texts (the role and `is_error` kept)."""
        calls = tuple(
            ToolCall(name=f(c.name), arguments=f(c.arguments), id=f(c.id)) for c in self.tool_calls
        )
        return Message(
            role=self.role,
            content=f(self.content),
            tool_calls=calls,
            reasoning=f(self.reasoning),
            tool_call_id=f(self.tool_call_id),
            name=f(self.name),
            is_error=self.is_error,
        )

    def key(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        """What identifies the message for prefix matching: tool arguments as the template gets
        them (parsed); reasoning and call ids are left out, since harnesses often drop the first
        and may rename the second."""
        calls = tuple(
            (c.name, json.dumps(c.parsed_arguments(), sort_keys=True)) for c in self.tool_calls
        )
        return self.role, self.content.strip(), calls


@dataclass(frozen=True)
class Ask:
    """A harness's call as received: its rollout, agent (`x-agl-agent` or `model`), API and body."""

    rollout: Rollout
    agent: str
    api: str  # "chat" | "completions" | "responses" | "messages"
    body: JSON  # recorded with each of its calls, and what a retry after a restart is matched on
    # Its body's bytes against the rollout's storage budget, counted when its first call is recorded.
    charge: Charge | None = None


@dataclass
class Params:
    """Sampling parameters after each wire format's names are mapped; what the chat template gets
    besides the messages and tools; and the request's fields that change what the model would see
    but cannot be honoured."""

    n: int = 1  # choices, each one recorded call
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    # the template's variables: `enable_thinking`, chat_template_kwargs
    template: JSON = field(default_factory=dict)
    # e.g. "thinking.budget_tokens", "tools.web_search"
    not_honoured: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Completion:
    """One sampled reply, as recorded."""

    reply: Message  # its content: the visible text, stop string excluded
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "stop_sequence"
    stop_sequence: str
    logprobs: Sequence[float]
    tokens: list[str]  # each sampled token's text, when the request asked for logprobs


REASONING = "reasoning"
CONTENT = "content"


@dataclass(frozen=True)
class Part:
    """Text of a reply being sampled that a harness may see (`gateway/stream.py`): reasoning or
    content."""

    kind: str  # REASONING | CONTENT
    text: str


@dataclass
class Live:
    """A streamed call's reply as it is sampled, from the proxy to the HTTP stream: the prompt's
    length (set before the first part) and the parts in order, then None once the call has
    ended."""

    prompt_tokens: int = 0
    parts: asyncio.Queue[Part | None] = field(default_factory=asyncio.Queue)


@dataclass
class Peers:
    """The other live gateways on the store: `gateway/fleet.py` counts them, the proxy reads the
    count (a gateway alone reads a rollout's recorded calls less often: no other one records
    them)."""

    count: int = 0
