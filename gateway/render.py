"""Messages to token IDs and sampled IDs back to messages, with the model's own chat template.

Owns rendering, parsing a sampled reply into content, reasoning and tool calls (a registry of
tool-call formats), and each rollout's transcripts for prefix-preserving mode (DESIGN.md section
4): a prompt that re-sends an earlier call's conversation and reply is built on that reply's
sampled IDs; any other prompt is classified. Also that marker text inside messages stays text, and
that text no context can hold is refused before it is tokenized. It does not talk to engines, store,
or know wire formats.
"""

from __future__ import annotations  # array[int] is not subscriptable at run time before Python 3.12

import functools
import inspect
import itertools
import json
import re
import secrets
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agl.types import JSON
from gateway.types import ContextOverflow, Message, RenderError, ToolCall

# ---------------------------------------------------------------------------- reply parsing

_THINK = re.compile(r"<think>(.*?)</think>\s*", re.S)
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
MAX_ROLLOUTS = 10_000  # rollouts whose transcripts are kept (least recently called dropped first)


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """Qwen / Hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks."""
    calls = []

    def take(match: re.Match[str]) -> str:
        try:
            data = json.loads(match.group(1))
            name, args = data["name"], data.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            return match.group(
                0
            )  # not a well-formed call: leave it in the content for the harness to see
        calls.append(
            ToolCall(
                str(name), args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            )
        )
        return ""

    rest = _HERMES.sub(take, text)
    return (rest.strip(), calls) if calls else (text, calls)


TOOL_PARSERS: dict[str, Callable[[str], tuple[str, list[ToolCall]]]] = {
    "hermes": parse_hermes,
    "none": lambda text: (text, []),
}


def parse_reply(text: str, tool_parser: str = "hermes") -> Message:
    """A sampled reply as an assistant message: reasoning split off, tool calls parsed by `tool_parser`."""
    reasoning = ""
    match = _THINK.search(text)
    if match and not text[: match.start()].strip():
        reasoning, text = match.group(1).strip(), text[match.end() :]
    elif "</think>" in text and "<think>" not in text:  # templates that open the block themselves
        reasoning, _, text = text.partition("</think>")
        reasoning, text = reasoning.strip(), text.lstrip()
    content, calls = TOOL_PARSERS[tool_parser](text)
    return Message("assistant", content, tuple(calls), reasoning)


# ---------------------------------------------------------------------------- rendering and transcripts


def _digest(previous: int, message: Message) -> int:
    # Python's own 64-bit string hash: in-process only (transcripts are never stored), and unlike
    # hashlib it never releases the GIL mid-call, which let other threads stall the event loop.
    return hash((previous, message.key()))


@dataclass
class Transcript:
    """The token sequence of one conversation of a rollout, through the last reply returned."""

    digest: int  # of the messages it covers, the returned reply included
    first: int  # of its first message, to tell a rewritten context from a new conversation
    ids: array[int]
    tools_key: str  # of the tools and template variables it was rendered with
    verbatim: tuple[int, int]  # (length, hash) of the prompt text + the reply as sampled + turn end


@dataclass(frozen=True)
class Prompt:
    ids: array[int]
    extended: bool  # built on an earlier call's sampled tokens
    mismatch: str  # "" when extended or first; else the class of the break
    digests: list[int] = field(default_factory=list)  # [i] identifies messages[:i + 1]
    tools_key: str = ""  # the tools and template variables, canonical
    text: str = ""  # as rendered


class Renderer:
    """Chat template rendering for one tokenizer, with per-rollout transcripts (bounded LRU)."""

    def __init__(
        self, tokenizer: Any, *, tool_parser: str = "hermes", context_length: int = 0
    ) -> None:
        if tool_parser not in TOOL_PARSERS:
            raise ValueError(f"unknown tool parser {tool_parser!r}; known: {sorted(TOOL_PARSERS)}")
        self.tokenizer, self.tool_parser = tokenizer, tool_parser
        # No text longer than this fits the context (no token is longer than the vocabulary's longest
        # entry): longer text is refused before it is tokenized, which costs seconds and GBs at 30 MB.
        self.context_length, self.token_chars = context_length, max(map(len, tokenizer.get_vocab()))
        # Text in messages and tools that spells an added token (`<|im_end|>`) stays text: only the template
        # writes markers, so tool output cannot forge a turn, nor change the tokens the model is trained on.
        added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        self._markers = re.compile("|".join(map(re.escape, added))) if added else None
        self._stand_in = (
            f"@@agl{secrets.token_hex(8)}."  # never shown to a client, so no text can spell it
        )
        # A group's rollouts start from the same prompt (one task, one harness): it is tokenized once.
        self._encode_first = functools.lru_cache(maxsize=64)(
            lambda text: array("i", self.encode(text))
        )
        self._plain: Any = (
            None  # the Rust tokenizer reading markers as text, made when first needed
        )
        self.transcripts: OrderedDict[str, list[Transcript]] = OrderedDict()
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if not isinstance(im_end, int) or im_end == tokenizer.unk_token_id:
            im_end = tokenizer.eos_token_id
        self.turn_end: int = im_end
        self.turn_end_text = str(tokenizer.convert_ids_to_tokens(im_end))
        self.end_ids = {im_end, tokenizer.eos_token_id} - {None}
        self._backend: Any = getattr(
            tokenizer, "backend_tokenizer", None
        )  # the Rust tokenizer: no wrapper cost
        # Decoding is the Rust tokenizer's, unless the wrapper would add its clean-up pass.
        fast = self._backend is not None and not getattr(
            tokenizer, "clean_up_tokenization_spaces", True
        )
        self._decoder: Any = self._backend if fast else tokenizer
        self.thinking_switch = "enable_thinking" in str(
            tokenizer.chat_template or ""
        )  # Qwen3's on/off
        self._arguments = set(
            inspect.signature(tokenizer.apply_chat_template).parameters
        )  # not template variables
        self._stable: dict[str, bool] = {}  # template variables (JSON) -> `stable`

    def stable(self, template: JSON | None = None) -> bool:
        """Whether the template, with these variables, renders a conversation as its history's rendering, then the
        new messages' (ChatML does; a template that strips earlier turns' reasoning does not): then an extension
        renders only its new messages (`_after`), not the whole conversation again. Checked once on a sample."""
        key = json.dumps(template or {}, sort_keys=True)
        if key not in self._stable:
            self._stable[key] = self._renders_each_message_once(template)
        return self._stable[key]

    def _renders_each_message_once(self, template: JSON | None) -> bool:
        call = ToolCall("f", '{"a": 1}', "c1")
        sample = [
            Message("system", "s"),
            Message("user", "u"),
            Message("assistant", "a", (call,), "r"),
        ]
        sample += [
            Message("tool", "out", tool_call_id="c1"),
            Message("assistant", "b", reasoning="r2"),
        ]
        sample += [Message("user", "v"), Message("assistant", "c"), Message("user", "w")]
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        for conversation, offered in itertools.product((sample, sample[1:]), (tools, [])):
            try:
                whole = self.render_text(
                    conversation, offered, generation_prompt=True, template=template
                )
                for k in (i for i, m in enumerate(conversation) if m.role == "assistant"):
                    head = self._history(conversation[: k + 1], offered, template)
                    if (
                        head
                        + self._after(conversation[:1], conversation[k + 1 :], offered, template)[0]
                        != whole
                    ):
                        return False
            except RenderError:
                return False
        return True

    def _history(self, history: Sequence[Message], tools: list[JSON], template: JSON | None) -> str:
        """The template's text of `history`, through its last turn end (what a later message is rendered after)."""
        text = self.render_text(history, tools, generation_prompt=False, template=template)
        return text[: text.rfind(self.turn_end_text) + len(self.turn_end_text)]

    def _after(
        self,
        first: Sequence[Message],
        new: Sequence[Message],
        tools: list[JSON],
        template: JSON | None,
    ) -> tuple[str, list[tuple[int, int]]]:
        """The text `new` adds after a history that starts with `first` (and its marker spans), where the
        template is `stable`: the rendering of `first` + `new` past that of `first` alone, from its turn end."""
        cut = len(self._history(first, tools, template))
        text, literal = self.render_prompt([*first, *new], tools, template)
        return text[cut:], [(a - cut, b - cut) for a, b in literal if a >= cut]

    def render_text(
        self,
        messages: Sequence[Message],
        tools: list[JSON],
        *,
        generation_prompt: bool,
        template: JSON | None = None,
    ) -> str:
        """The template's text; `template`: its variables beyond messages and tools (`enable_thinking`)."""
        if taken := sorted(
            self._arguments.intersection(template or {})
        ):  # a whole template, continue_final_message
            raise RenderError(
                f"chat template variables cannot set the renderer's own arguments {taken}"
            )
        try:
            text = self.tokenizer.apply_chat_template(
                [m.template_dict() for m in messages],
                tools=tools or None,
                add_generation_prompt=generation_prompt,
                tokenize=False,
                **(template or {}),
            )
        except Exception as e:
            raise RenderError(f"the chat template could not render these messages: {e}") from e
        return str(text)

    def render_prompt(
        self, messages: Sequence[Message], tools: list[JSON], template: JSON | None = None
    ) -> tuple[str, list[tuple[int, int]]]:
        """The prompt's text, and the spans of it that are marker text from inside messages, tools or template
        variables. Each such text is swapped for a unique stand-in while the template renders, then put back."""
        found: list[str] = []
        if (markers := self._markers) is not None:
            mark = self._stand_in

            def stand_in(m: re.Match[str]) -> str:
                found.append(m.group(0))
                return f"{mark}{len(found) - 1}@@"

            messages = [m.map_text(lambda text: markers.sub(stand_in, text)) for m in messages]
            tools = json.loads(markers.sub(stand_in, json.dumps(tools))) if tools else tools
            template = (
                json.loads(markers.sub(stand_in, json.dumps(template))) if template else template
            )
        text = self.render_text(messages, tools, generation_prompt=True, template=template)
        if not found:
            return text, []
        parts, spans, at, n = [], [], 0, 0
        for m in re.finditer(rf"{re.escape(mark)}(\d+)@@", text):
            parts += [text[at : m.start()], found[int(m.group(1))]]
            n += m.start() - at
            spans.append((n, n + len(parts[-1])))
            n, at = spans[-1][1], m.end()
        return "".join([*parts, text[at:]]), spans

    def encode(self, text: str, literal: Sequence[tuple[int, int]] = ()) -> list[int]:
        """Token IDs of `text`; the `literal` spans (marker text from messages) are tokenized as plain text."""
        self.check_length(len(text))
        if literal:
            ids, at = [], 0
            for a, b in literal:
                ids += self.encode(text[at:a]) + self._encode_plain(text[a:b])
                at = b
            return ids + self.encode(text[at:])
        if self._backend is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        return list(
            self._backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
        )  # no offsets

    def check_length(self, chars: int) -> None:
        """Refuse text of `chars` characters when no context can hold it (no token is longer than `token_chars`)."""
        if self.context_length and chars > self.context_length * self.token_chars:
            raise ContextOverflow(
                f"This model's maximum context length is {self.context_length} tokens, and the prompt is "
                f"{chars} characters: more than that many tokens can hold (at most {self.token_chars} each)."
            )

    def _encode_plain(self, text: str) -> list[int]:
        if self._backend is None:
            return list(
                self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
            )
        if self._plain is None:  # every added token special, and special tokens read as text
            spec = json.loads(self._backend.to_str())
            for token in spec["added_tokens"]:
                token["special"] = True
            self._plain = type(self._backend).from_str(json.dumps(spec))
            self._plain.encode_special_tokens = True
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._decoder.decode(list(ids), skip_special_tokens=False))

    def reply_text(self, ids: Sequence[int]) -> str:
        """The visible text of a reply: without the end-of-turn token that closed it."""
        return self.decode(ids[:-1] if ids and ids[-1] in self.end_ids else ids)

    def prompt(
        self,
        rollout_id: str,
        messages: Sequence[Message],
        tools: list[JSON],
        *,
        preserve: bool = True,
        template: JSON | None = None,
    ) -> Prompt:
        """Input IDs for `messages`; extends the rollout's matching transcript when there is one: one rendered
        with the same tools and `template` variables (others may render the same messages differently)."""
        if not messages:
            raise RenderError("messages must not be empty")
        tools_key = json.dumps([tools, template or {}], sort_keys=True)
        self.check_length(
            len(tools_key) + sum(len(m.content) for m in messages)
        )  # before rendering: at least this
        digests = list(itertools.accumulate(messages, _digest, initial=0))[
            1:
        ]  # [i]: of messages[:i + 1]
        transcripts = self.transcripts.get(rollout_id, [])
        for t in reversed(transcripts):
            if t.tools_key != tools_key or t.digest not in digests[:-1]:
                continue
            if preserve and self.stable(
                template
            ):  # only the new messages rendered: the history is the transcript
                new = messages[digests.index(t.digest) + 1 :]
                added, spans = self._after(messages[:1], new, tools, template)
                return Prompt(
                    t.ids + array("i", self.encode(added, spans)), True, "", digests, tools_key
                )
            full, literal = self.render_prompt(messages, tools, template)
            length, digest = t.verbatim
            if (
                not preserve or hash(full[:length]) != digest
            ):  # else the reply came back as sampled: no second render
                head = self._head(full, messages[: digests.index(t.digest) + 1], tools, template)
                if head is None or not preserve:  # the whole prompt tokenized afresh
                    ids = array("i", self.encode(full, literal))
                    same = head is not None and ids[: len(t.ids)] == t.ids
                    kind = (
                        "template_edit" if head is None else "" if same else "retokenized_boundary"
                    )
                    return Prompt(ids, same, kind, digests, tools_key, full)
                length = len(head)
            tail = [
                (a - length, b - length) for a, b in literal if a >= length
            ]  # the head is the transcript's
            return Prompt(
                t.ids + array("i", self.encode(full[length:], tail)),
                True,
                "",
                digests,
                tools_key,
                full,
            )
        full, literal = self.render_prompt(messages, tools, template)
        rewritten = any(
            t.first == digests[0] for t in transcripts
        )  # same start: the harness edited its context
        kind = "" if not transcripts else "context_rewritten" if rewritten else "new_chain"
        ids = array("i", self._encode_first(full) if not literal else self.encode(full, literal))
        return Prompt(ids, False, kind, digests, tools_key, full)

    def _head(
        self, full: str, history: Sequence[Message], tools: list[JSON], template: JSON | None
    ) -> str | None:
        """The text of `full` that renders `history`, through its last reply's turn end; tried as
        sent and with reasoning stripped (templates that drop earlier turns' reasoning)."""
        for variant in (history, [replace(m, reasoning="") for m in history]):
            head = self._history(variant, tools, template)
            if full.startswith(head):
                return head
        return None

    def remember(
        self,
        rollout_id: str,
        prompt: Prompt,
        response_ids: Sequence[int],
        reply: Message,
        text: str | None = None,
    ) -> None:
        """Keep the transcript a call produced: prompt, sampled reply, and the turn end the template
        adds when sampling stopped without one. `text`: the reply's `reply_text`, if known."""
        ids = prompt.ids + array("i", response_ids)
        if not response_ids or response_ids[-1] not in self.end_ids:
            ids.append(self.turn_end)
        verbatim = (
            prompt.text
            + (self.reply_text(response_ids) if text is None else text)
            + self.turn_end_text
        )
        digest = _digest(prompt.digests[-1], reply)
        superseded = set(prompt.digests)
        kept = [t for t in self.transcripts.pop(rollout_id, []) if t.digest not in superseded]
        kept.append(
            Transcript(
                digest, prompt.digests[0], ids, prompt.tools_key, (len(verbatim), hash(verbatim))
            )
        )
        self.transcripts[rollout_id] = kept[-8:]
        while len(self.transcripts) > MAX_ROLLOUTS:
            self.transcripts.popitem(last=False)

    def forget(self, rollout_id: str) -> None:
        self.transcripts.pop(rollout_id, None)
