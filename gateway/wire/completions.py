"""OpenAI Completions (`/v1/completions`): its request, its reply and its stream.

- `CompletionRequest`: a prompt as text or token IDs, sent as it is (no chat template), and the
  sampling asked (`params`).
- `CompletionRequest.reply`: the recorded completions as a `text_completion`, one choice each.
- `CompletionStream`: text deltas of the first choice while it is sampled, then the rest of every
  choice with its finish reason, and `[DONE]`.
It does not tokenize the prompt (`gateway/routes.py` asks the renderer), sample or record.
"""

import time
from collections.abc import Iterator

from pydantic import Field

from agl.types import JSON
from gateway.types import CONTENT, Completion, Params, Part
from gateway.wire.base import (
    BaseRequest,
    Stream,
    error,
    finish_reason,
    new_id,
    openai_reply,
    sse,
    unsent,
)


class CompletionRequest(BaseRequest):
    prompt: str | list[int]
    max_tokens: int | None = Field(16, ge=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=16)
    logprobs: int | None = Field(None, ge=0, le=5)

    def params(self) -> Params:
        return self._params(self.max_tokens, self.stop, self.n)

    def reply(self, completions: list[Completion]) -> JSON:
        choices = [
            {
                "index": i,
                "text": c.reply.content,
                "finish_reason": finish_reason(c),
                "logprobs": None,
            }
            for i, c in enumerate(completions)
        ]
        return openai_reply("cmpl-", "text_completion", self.model, choices, completions)

    def streamer(self) -> "CompletionStream":
        return CompletionStream(model=self.model)


class CompletionStream(Stream):
    """A Completions stream: text deltas of one choice while it is sampled, then what is left of
    each choice with its finish reason, and `[DONE]`."""

    def __init__(self, *, model: str) -> None:
        self.head = {
            "id": new_id("cmpl-"),
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
            rest = unsent(choice["text"], sent)
            yield self._chunk(choice["index"], rest, choice["finish_reason"])
        yield sse("[DONE]")

    def error(self, message: str, kind: str, code: str | None) -> Iterator[str]:
        yield sse(error(message, kind, code, anthropic=False))

    def _chunk(self, index: int, text: str, finish: str | None = None) -> str:
        choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": None}
        return sse(self.head | {"choices": [choice]})
