"""The wire formats a harness calls the gateway in: OpenAI Chat Completions, Completions and
Responses, and Anthropic Messages, one module each.

- Each format's module (`chat.py`, `completions.py`, `responses.py`, `messages.py`) owns its
  pydantic request schema, which maps a request to normalized messages, tools, sampling and chat
  template variables and names the set fields that would change what the model sees but cannot be
  honoured (`parse`); its reply built from the recorded completions (`reply`); and its stream
  (`streamer`), a `Stream` (`base.py`, with what the formats share).
- This module names the formats: `Request`, any format's request, and `parse_recorded`, a recorded
  call's request parsed again by the name its call gives the format.
It does not sample, record or authenticate.
"""

from agl.types import JSON
from gateway.types import Message, Params
from gateway.wire.base import Stream, error
from gateway.wire.chat import ChatRequest
from gateway.wire.completions import CompletionRequest
from gateway.wire.messages import AnthropicRequest
from gateway.wire.responses import ResponsesRequest

__all__ = [
    "CHAT_REQUESTS",
    "AnthropicRequest",
    "ChatRequest",
    "CompletionRequest",
    "Request",
    "ResponsesRequest",
    "Stream",
    "error",
    "parse_recorded",
]

Request = ChatRequest | CompletionRequest | ResponsesRequest | AnthropicRequest

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
