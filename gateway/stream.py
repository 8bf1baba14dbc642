"""A reply shown while it is sampled: its token IDs decoded a few at a time, and the part of its
text a harness may already see.

What a stream shows must be what the recorded reply says (`reply_parsing.parse_reply` of the text
recorded), so text is held back while it could still turn out to be something else:
- a suffix that could begin a stop string (the reply is cut before it), a tool-call marker, or
  the end of a thinking block;
- whitespace at the end of the text so far (parsing strips it before a tool call and around
  reasoning);
- everything from a tool-call marker on: a tool call is sent whole, once it is recorded and parsed;
- content that begins with whitespace when tool calls are parsed (parsing strips it only if a call
  follows).
What was held back is sent once the call is recorded: the recorded reply, less what was shown.
It does not sample, record or know wire formats.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.reply_parsing import THINK_CLOSE, THINK_OPEN
from gateway.types import CONTENT, REASONING, Part


class Detokenizer:
    """Sampled IDs to text as they come. Each step decodes a window of the last few IDs, not the
    whole reply (as vLLM's incremental detokenizer does): a character that spans tokens is given
    once all its tokens are in."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # the window starts here; ids[prefix:read] were given as text
        self._read = 0

    def add(self, ids: Sequence[int]) -> str:
        """The text the reply's next `ids` add."""
        self._ids += ids
        given = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(given) or text.endswith("\ufffd"):
            return ""  # an incomplete character: wait for its other tokens
        self._prefix = self._read
        self._read = len(self._ids)
        return text[len(given) :]


def _held(text: str, marks: Sequence[str]) -> int:
    """How many characters at the end of `text` could be the start of one of `marks`."""
    longest = 0
    for mark in marks:
        for size in range(min(len(mark) - 1, len(text)), longest, -1):
            if text.endswith(mark[:size]):
                longest = size
                break
    return longest


class Shown:
    """Which text of a reply being sampled may be shown now (the module docstring says what is
    held back). Feed it the decoded text (`add`); it gives the parts to send, and says when a stop
    string was sampled (`stopped`: the reply ends there)."""

    def __init__(self, *, stops: Sequence[str], tool_marker: str, thinking: bool) -> None:
        """`tool_marker`: the text that begins a tool call, "" when none is parsed; `thinking`:
        the prompt opened a thinking block, so the reply starts inside it."""
        self.stops = [s for s in stops if s]
        self.tool_marker = tool_marker
        self.stopped = False
        self.shown: dict[str, list[str]] = {REASONING: [], CONTENT: []}  # what was sent
        # "start" (a thinking block may open), REASONING, CONTENT, or "held" (nothing more is
        # shown before the end)
        self.mode = REASONING if thinking else "start"
        self._pending = ""  # text not shown yet, in the current mode
        # Nothing of the current kind shown yet, and whether parsing strips its leading whitespace
        # (reasoning's, and content's after a thinking block).
        self._lead = True
        self._strip_lead = thinking
        self._tail = ""  # the last characters, where a stop string may begin (in "held" mode)

    def add(self, text: str) -> list[Part]:
        """The parts `text` (the reply's next text) lets through."""
        if self.stopped or not text:
            return []
        if self._stop_in(text):
            self.stopped = True
            return []
        if self.mode == "held":
            return []
        self._pending += text
        parts: list[Part] = []
        self._decide_start()
        if self.mode == REASONING:
            parts += self._reasoning()
        if self.mode == CONTENT:
            parts += self._content()
        for part in parts:
            self.shown[part.kind].append(part.text)
        return parts

    def sent(self, kind: str) -> str:
        """The text of `kind` shown so far."""
        return "".join(self.shown[kind])

    def _stop_in(self, text: str) -> bool:
        """Whether a stop string ends within the text so far, once `text` is added."""
        if not self.stops:
            return False
        window = self._tail + text
        longest = max(map(len, self.stops))
        self._tail = window[-(longest - 1) :] if longest > 1 else ""
        return any(stop in window for stop in self.stops)

    def _decide_start(self) -> None:
        """In "start" mode: reasoning once the reply opens a thinking block, content once it
        cannot."""
        if self.mode != "start":
            return
        head = self._pending.lstrip()
        if head.startswith(THINK_OPEN):
            self.mode = REASONING
            self._pending = head[len(THINK_OPEN) :]
            self._strip_lead = True
        elif not THINK_OPEN.startswith(head):
            self.mode = CONTENT

    def _reasoning(self) -> list[Part]:
        """Reasoning through the block's end, which switches to content."""
        end = self._pending.find(THINK_CLOSE)
        if end == -1:
            return self._release(REASONING, [THINK_CLOSE, *self.stops])
        reasoning = self._pending[:end].rstrip()
        if self._lead:
            reasoning = reasoning.lstrip()
        self._pending = self._pending[end + len(THINK_CLOSE) :]
        self.mode = CONTENT
        self._lead = True
        self._strip_lead = True
        if not reasoning:
            return []
        return [Part(REASONING, reasoning)]

    def _content(self) -> list[Part]:
        """Content up to a tool-call marker, which holds the rest."""
        if self._lead and self._strip_lead:
            self._pending = self._pending.lstrip()
        elif self.tool_marker and self._lead and self._pending[:1].isspace():
            if self._pending.strip():
                self.mode = "held"  # stripped only if a tool call follows: wait for the end
            return []
        marker = -1
        if self.tool_marker:
            marker = self._pending.find(self.tool_marker)
        if marker == -1:
            return self._release(CONTENT, [self.tool_marker, *self.stops])
        content = self._pending[:marker].rstrip()
        self.mode = "held"
        self._pending = ""
        if not content:
            return []
        return [Part(CONTENT, content)]

    def _release(self, kind: str, marks: Sequence[str]) -> list[Part]:
        """The pending text of `kind` but its end that may begin one of `marks` and its trailing
        whitespace."""
        text = self._pending
        if self._lead and self._strip_lead:
            text = text.lstrip()
        keep = len(text) - _held(text, [m for m in marks if m])
        shown = text[:keep].rstrip()
        self._pending = text[len(shown) :]
        if not shown:
            return []
        self._lead = False
        return [Part(kind, shown)]
