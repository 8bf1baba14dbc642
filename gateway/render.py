"""Messages to token IDs and sampled IDs back to messages, with the model's own chat template.

Owns: normalizing chat messages from every wire format into one shape (role, content text,
tool calls, reasoning), rendering them with the tokenizer's chat template, decoding a sampled
reply into content, reasoning and tool calls (a small registry of tool-call formats), and the
per-rollout token chains of prefix-preserving mode (DESIGN.md section 4): when a prompt
re-sends an earlier call's conversation plus the reply the gateway returned, the prompt is
built from the sampled IDs of that reply plus the tokens of what was added since, and every
prompt that does not extend an earlier one is classified.

It does not talk to engines, store anything, or know any wire format's field names beyond
the normalized message shape; the gateway's routes map wire formats onto it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


class RenderError(ValueError):
    """Messages or tools the chat template cannot render (the client's fault: a 400)."""


# ---------------------------------------------------------------------------- messages

ROLES = {"system", "developer", "user", "assistant", "tool"}


def text_of(content: Any) -> str:
    """The text of a message content: a string, or a list of text parts (other parts are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") in ("tool_result", "output_text", "input_text"):
                parts.append(text_of(part.get("content", part.get("text"))))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RenderError(f"unsupported content part of type {kind!r}: only text is supported")
        return "".join(parts)
    raise RenderError(f"message content must be a string or a list of parts, not {type(content).__name__}")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI clients send and expect it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def parsed_arguments(self) -> Any:
        try:
            return json.loads(self.arguments) if self.arguments else {}
        except ValueError:
            return self.arguments


@dataclass(frozen=True)
class Message:
    """One chat message in the shape the templates take."""

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""
    tool_call_id: str = ""
    name: str = ""

    def template_dict(self) -> JSON:
        out: JSON = {"role": "system" if self.role == "developer" else self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.parsed_arguments()}}
                for c in self.tool_calls
            ]
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        return out

    def key(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        """What identifies the message for prefix matching: reasoning and call ids are left out,
        since harnesses often drop the first and may rename the second."""
        return self.role, self.content.strip(), tuple((c.name, _canonical_json(c.arguments)) for c in self.tool_calls)


def _canonical_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except ValueError:
        return text


def message_from_openai(raw: Any) -> Message:
    """An OpenAI chat message (as the SDK sends it) in normalized form."""
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
        calls.append(
            ToolCall(fn["name"], args if isinstance(args, str) else json.dumps(args), call.get("id") or "call_0")
        )
    reasoning = raw.get("reasoning_content") or raw.get("reasoning") or ""
    return Message(
        role=role,
        content=text_of(raw.get("content")),
        tool_calls=tuple(calls),
        reasoning=reasoning if isinstance(reasoning, str) else "",
        tool_call_id=str(raw.get("tool_call_id") or ""),
        name=str(raw.get("name") or ""),
    )


def validate_tools(tools: Any) -> list[JSON]:
    """OpenAI function tools, checked enough that the template cannot choke on them."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RenderError("tools must be a list")
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RenderError("each tool must be {'type': 'function', 'function': {'name': ..., 'parameters': {...}}}")
        if not isinstance(fn.get("parameters", {}), dict):
            raise RenderError(f"tool {fn['name']!r}: parameters must be a JSON schema object")
    return tools


# ---------------------------------------------------------------------------- reply parsing

_THINK = re.compile(r"<think>(.*?)</think>\s*", re.S)
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """Qwen / Hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks."""
    calls = []

    def take(match: re.Match[str]) -> str:
        try:
            data = json.loads(match.group(1))
            name, args = data["name"], data.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            return match.group(0)  # not a well-formed call: leave it in the content for the harness to see
        calls.append(ToolCall(str(name), args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
        return ""

    rest = _HERMES.sub(take, text)
    return (rest.strip(), calls) if calls else (text, calls)


TOOL_PARSERS: dict[str, Callable[[str], tuple[str, list[ToolCall]]]] = {
    "hermes": parse_hermes,
    "none": lambda text: (text, []),
}


def parse_reply(text: str, tool_parser: str = "hermes") -> Message:
    """A sampled reply as an assistant message: reasoning split off, tool calls parsed."""
    reasoning = ""
    match = _THINK.search(text)
    if match and not text[: match.start()].strip():
        reasoning, text = match.group(1).strip(), text[match.end() :]
    elif "</think>" in text and "<think>" not in text:  # templates that open the block themselves
        reasoning, _, text = text.partition("</think>")
        reasoning, text = reasoning.strip(), text.lstrip()
    content, calls = TOOL_PARSERS[tool_parser](text)
    return Message("assistant", content, tuple(calls), reasoning)


# ---------------------------------------------------------------------------- rendering and chains


def _digest(previous: int, message: Message) -> int:
    # Python's own 64-bit string hash: in-process only (chains are never stored), and unlike
    # hashlib it never releases the GIL mid-call, which let other threads stall the event loop.
    return hash((previous, message.key()))


def prefix_digests(messages: Sequence[Message]) -> list[int]:
    """digests[i] identifies messages[:i + 1]."""
    out, previous = [], 0
    for m in messages:
        previous = _digest(previous, m)
        out.append(previous)
    return out


@dataclass
class Chain:
    """The token sequence of one conversation of a rollout, through the last reply returned."""

    digest: int  # of the messages it covers, the returned reply included
    first: int  # of its first message, to tell a rewritten context from a new conversation
    ids: array[int]
    tools_key: str
    verbatim: tuple[int, int]  # (length, hash) of the prompt text + the reply as sampled + turn end


@dataclass(frozen=True)
class Prompt:
    ids: array[int]
    extended: bool  # built on an earlier call's sampled tokens
    mismatch: str  # "" when extended or first; else the class of the break
    digests: list[int] = field(default_factory=list)  # prefix_digests of the messages
    tools_key: str = ""  # the tools, canonical
    text: str = ""  # as rendered


class Renderer:
    """Chat template rendering for one tokenizer, with per-rollout chains (bounded LRU)."""

    def __init__(self, tokenizer: Any, *, tool_parser: str = "hermes", max_rollouts: int = 10_000) -> None:
        if tool_parser not in TOOL_PARSERS:
            raise ValueError(f"unknown tool parser {tool_parser!r}; known: {sorted(TOOL_PARSERS)}")
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser
        self.max_rollouts = max_rollouts
        self.chains: OrderedDict[str, list[Chain]] = OrderedDict()
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if not isinstance(im_end, int) or im_end == tokenizer.unk_token_id:
            im_end = tokenizer.eos_token_id
        self.turn_end: int = im_end
        self.turn_end_text = str(tokenizer.convert_ids_to_tokens(im_end))
        self.end_ids = {im_end, tokenizer.eos_token_id} - {None}
        self._backend: Any = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer: no wrapper cost
        # Decoding is the Rust tokenizer's, unless the wrapper would add its clean-up pass.
        fast = self._backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
        self._decoder: Any = self._backend if fast else tokenizer

    def render_text(self, messages: Sequence[Message], tools: list[JSON], *, generation_prompt: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                [m.template_dict() for m in messages],
                tools=tools or None,
                add_generation_prompt=generation_prompt,
                tokenize=False,
            )
        except Exception as e:
            raise RenderError(f"the chat template could not render these messages: {e}") from e
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token IDs of `text`, no special tokens added."""
        if self._backend is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        return list(self._backend.encode_batch_fast([text], add_special_tokens=False)[0].ids)  # no offsets

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._decoder.decode(list(ids), skip_special_tokens=False))

    def reply_text(self, ids: Sequence[int]) -> str:
        """The visible text of a reply: without the end-of-turn token that closed it."""
        if ids and ids[-1] in self.end_ids:
            ids = ids[:-1]
        return self.decode(ids)

    def prompt(
        self, rollout_id: str, messages: Sequence[Message], tools: list[JSON], *, preserve: bool = True
    ) -> Prompt:
        """Input IDs for `messages`; extends the rollout's matching chain when there is one."""
        if not messages:
            raise RenderError("messages must not be empty")
        full = self.render_text(messages, tools, generation_prompt=True)
        digests = prefix_digests(messages)
        tools_key = json.dumps(tools, sort_keys=True)
        chains = self.chains.get(rollout_id, [])
        for chain in reversed(chains):
            if chain.tools_key != tools_key or chain.digest not in digests[:-1]:
                continue
            length, digest = chain.verbatim
            if preserve and hash(full[:length]) == digest:  # the reply came back as sampled: no second render
                ids = chain.ids + array("i", self.encode(full[length:]))
                return Prompt(ids, True, "", digests, tools_key, full)
            head = self._head(full, messages[: digests.index(chain.digest) + 1], tools)
            if head is None:
                return Prompt(array("i", self.encode(full)), False, "template_edit", digests, tools_key, full)
            if not preserve:
                ids = array("i", self.encode(full))
                same = ids[: len(chain.ids)] == chain.ids
                return Prompt(ids, same, "" if same else "retokenized_boundary", digests, tools_key, full)
            ids = chain.ids + array("i", self.encode(full[len(head) :]))
            return Prompt(ids, True, "", digests, tools_key, full)
        kind = "" if not chains else "context_rewritten" if any(c.first == digests[0] for c in chains) else "new_chain"
        return Prompt(array("i", self.encode(full)), False, kind, digests, tools_key, full)

    def _head(self, full: str, history: Sequence[Message], tools: list[JSON]) -> str | None:
        """The text of `full` that renders `history`, through its last reply's turn end; tried as
        sent and with reasoning stripped (templates that drop earlier turns' reasoning)."""
        stripped = [dataclasses.replace(m, reasoning="") for m in history]
        for variant in (history, stripped):
            head = self.render_text(variant, tools, generation_prompt=False)
            head = head[: head.rfind(self.turn_end_text) + len(self.turn_end_text)]
            if full.startswith(head):
                return head
        return None

    def remember(
        self, rollout_id: str, prompt: Prompt, response_ids: Sequence[int], reply: Message, text: str | None = None
    ) -> None:
        """Record the chain a call produced: its prompt, the sampled reply, and the end-of-turn
        token when sampling stopped without one (the template closes the turn with it). `text`:
        the reply's `reply_text`, when the caller has it."""
        ids = array("i", prompt.ids)
        ids.extend(response_ids)
        if not response_ids or response_ids[-1] not in self.end_ids:
            ids.append(self.turn_end)
        verbatim = prompt.text + (self.reply_text(response_ids) if text is None else text) + self.turn_end_text
        digest = _digest(prompt.digests[-1], reply)
        superseded = set(prompt.digests)
        chains = [c for c in self.chains.pop(rollout_id, []) if c.digest not in superseded]
        chains.append(Chain(digest, prompt.digests[0], ids, prompt.tools_key, (len(verbatim), hash(verbatim))))
        self.chains[rollout_id] = chains[-8:]
        while len(self.chains) > self.max_rollouts:
            self.chains.popitem(last=False)

    def forget(self, rollout_id: str) -> None:
        self.chains.pop(rollout_id, None)
