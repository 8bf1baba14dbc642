"""Messages to token IDs and sampled IDs back to text, with the model's own chat template.

- Owns rendering a conversation, and prefix-preserving mode: a prompt that re-sends an earlier
  call's conversation and reply is built on that reply's sampled IDs (its transcript); any other
  prompt is classified (`PrefixBreak`).
- Marker text inside messages stays text; text no context can hold is refused before it is
  tokenized.
- Keeps no rollout's transcripts (the proxy's per-rollout record does: `gateway/rollouts.py`);
  the sampled text becomes a message in `gateway/reply_parsing.py`. Does not talk to engines or
  the store, or know wire formats.
"""

from __future__ import annotations  # array[int] is not subscriptable at run time before Python 3.12

import functools
import inspect
import itertools
import json
import re
import secrets
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agl.types import JSON, PrefixBreak
from gateway.reply_parsing import TOOL_PARSERS
from gateway.types import ContextOverflow, Message, RenderError, ToolCall

TRANSCRIPTS = 8  # a rollout's transcripts kept: its latest conversations (sub-agents, retries)
FIRST_HEADS = 64  # first messages whose history's length `_after` keeps (a group starts alike)


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
    """A rendered prompt's IDs, how they relate to the rollout's transcripts, and what `remember`
    needs to keep the transcript its call makes."""

    ids: array[int]
    extended: bool  # built on an earlier call's sampled tokens
    mismatch: PrefixBreak | None  # None when extended or first
    digests: list[int] = field(default_factory=list)  # [i] identifies messages[:i + 1]
    tools_key: str = ""  # the tools and template variables, canonical
    text: str = ""  # as rendered


@dataclass(frozen=True)
class _Conversation:
    """What a prompt is asked for, with the digests and key a transcript is matched on."""

    messages: Sequence[Message]
    tools: list[JSON]
    template: JSON | None
    digests: list[int]  # [i] identifies messages[:i + 1]
    tools_key: str  # the tools and template variables, canonical


@dataclass(frozen=True)
class _Match:
    """A transcript a prompt extends, and how many of the prompt's messages it covers."""

    transcript: Transcript
    covers: int


def _match(history: Sequence[Transcript], conversation: _Conversation) -> _Match | None:
    """The latest transcript rendered with the same tools and template variables (others may
    render the same messages differently) whose conversation these messages continue."""
    digests = conversation.digests
    for t in reversed(history):
        if t.tools_key == conversation.tools_key and t.digest in digests[:-1]:
            return _Match(transcript=t, covers=digests.index(t.digest) + 1)
    return None


class Renderer:
    """Chat template rendering for one tokenizer; prompts are built on a rollout's transcripts,
    which its caller keeps (`prompt` reads them, `remember` gives the next ones)."""

    def __init__(
        self, tokenizer: Any, *, tool_parser: str = "hermes", context_length: int = 0
    ) -> None:
        if tool_parser not in TOOL_PARSERS:
            raise ValueError(f"unknown tool parser {tool_parser!r}; known: {sorted(TOOL_PARSERS)}")
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser
        self.context_length = context_length
        # No text longer than this fits the context (no token is longer than the vocabulary's
        # longest entry): longer text is refused before it is tokenized, which costs seconds and
        # GBs at 30 MB.
        self.token_chars = max(map(len, tokenizer.get_vocab()))
        # Text in messages and tools that spells an added token (`<|im_end|>`) stays text: only the
        # template writes markers, so tool output cannot forge a turn, nor change the tokens the
        # model is trained on.
        added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        self._markers = None
        if added:
            self._markers = re.compile("|".join(map(re.escape, added)))
        # never shown to a client, so no text can spell it
        self._stand_in = f"@@agl{secrets.token_hex(8)}."
        # A group's rollouts start from the same prompt (one task, one harness): it is tokenized once.
        self._encode_first = functools.lru_cache(maxsize=64)(
            lambda text: array("i", self.encode(text))
        )
        # the Rust tokenizer reading markers as text, made when first needed
        self._plain: Any = None
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if not isinstance(im_end, int) or im_end == tokenizer.unk_token_id:
            im_end = tokenizer.eos_token_id
        self.turn_end: int = im_end
        self.turn_end_text = str(tokenizer.convert_ids_to_tokens(im_end))
        self.end_ids = {im_end, tokenizer.eos_token_id} - {None}
        # the Rust tokenizer: no wrapper cost
        self._backend: Any = getattr(tokenizer, "backend_tokenizer", None)
        # Decoding is the Rust tokenizer's, unless the wrapper would add its clean-up pass.
        self._decoder: Any = tokenizer
        if self._backend is not None and not getattr(
            tokenizer, "clean_up_tokenization_spaces", True
        ):
            self._decoder = self._backend
        # Qwen3's on/off
        self.thinking_switch = "enable_thinking" in str(tokenizer.chat_template or "")
        # the template renderer's own arguments: not template variables
        self._arguments = set(inspect.signature(tokenizer.apply_chat_template).parameters)
        self._stable: dict[str, bool] = {}  # template variables (JSON) -> `stable`
        # (first message, tools and template variables (JSON)) -> its history's length (`_after`)
        self._first_heads: dict[tuple[Message, str], int] = {}

    def stable(self, template: JSON | None = None) -> bool:
        """Whether the template, with these variables, renders a conversation as its history's
        rendering, then the new messages' (ChatML does; a template that strips earlier turns'
        reasoning does not): then an extension renders only its new messages (`_after`), not the
        whole conversation again. Checked once on a sample."""
        key = json.dumps(template or {}, sort_keys=True)
        if key not in self._stable:
            self._stable[key] = self._renders_each_message_once(template)
        return self._stable[key]

    def _renders_each_message_once(self, template: JSON | None) -> bool:
        """Whether each sample conversation, with and without tools, renders as the history through
        each assistant message followed by what the rest adds (`_after`)."""
        call = ToolCall(name="f", arguments='{"a": 1}', id="c1")
        sample = [
            Message(role="system", content="s"),
            Message(role="user", content="u"),
            Message(role="assistant", content="a", tool_calls=(call,), reasoning="r"),
            Message(role="tool", content="out", tool_call_id="c1"),
            Message(role="assistant", content="b", reasoning="r2"),
            Message(role="user", content="v"),
            Message(role="assistant", content="c"),
            Message(role="user", content="w"),
        ]
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        for conversation, offered in itertools.product((sample, sample[1:]), (tools, [])):
            try:
                whole = self.render_text(
                    conversation, offered, generation_prompt=True, template=template
                )
                for k in (i for i, m in enumerate(conversation) if m.role == "assistant"):
                    head = self._history(conversation[: k + 1], offered, template)
                    key = json.dumps([offered, template or {}], sort_keys=True)
                    rest, _ = self._after(
                        conversation[0], conversation[k + 1 :], offered, template, key
                    )
                    if head + rest != whole:
                        return False
            except RenderError:
                return False
        return True

    def _history(self, history: Sequence[Message], tools: list[JSON], template: JSON | None) -> str:
        """The template's text of `history`, through its last turn end (what a later message is
        rendered after)."""
        text = self.render_text(history, tools, generation_prompt=False, template=template)
        return text[: text.rfind(self.turn_end_text) + len(self.turn_end_text)]

    def _after(
        self,
        first: Message,
        new: Sequence[Message],
        tools: list[JSON],
        template: JSON | None,
        tools_key: str,
    ) -> tuple[str, list[tuple[int, int]]]:
        """The text `new` adds after a history that starts with `first` (and its marker spans),
        where the template is `stable`: the rendering of `first` + `new` past that of `first`
        alone, from its turn end. `tools_key`: the tools and template variables, canonical. The
        length of `first`'s rendering is kept (each extension of a rollout starts with the same
        message), so an extension renders the template once."""
        key = (first, tools_key)
        cut = self._first_heads.get(key)
        if cut is None:
            cut = len(self._history([first], tools, template))
            if len(self._first_heads) >= FIRST_HEADS:
                del self._first_heads[next(iter(self._first_heads))]  # the oldest
            self._first_heads[key] = cut
        text, literal = self.render_prompt([first, *new], tools, template)
        return text[cut:], [(a - cut, b - cut) for a, b in literal if a >= cut]

    def render_text(
        self,
        messages: Sequence[Message],
        tools: list[JSON],
        *,
        generation_prompt: bool,
        template: JSON | None = None,
    ) -> str:
        """The template's text; `template`: its variables beyond messages and tools
        (`enable_thinking`)."""
        # A variable may not set the renderer's own arguments: a whole template,
        # continue_final_message.
        if taken := sorted(self._arguments.intersection(template or {})):
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
        """The prompt's text, and the spans of it that are marker text from inside messages, tools
        or template variables. Each such text is swapped for a unique stand-in while the template
        renders, then put back."""
        found: list[str] = []
        if (markers := self._markers) is not None:
            mark = self._stand_in

            def stand_in(m: re.Match[str]) -> str:
                found.append(m.group(0))
                return f"{mark}{len(found) - 1}@@"

            def swapped(value: Any) -> Any:
                return json.loads(markers.sub(stand_in, json.dumps(value)))

            messages = [m.map_text(lambda text: markers.sub(stand_in, text)) for m in messages]
            if tools:
                tools = swapped(tools)
            if template:
                template = swapped(template)
        text = self.render_text(messages, tools, generation_prompt=True, template=template)
        if not found:
            return text, []
        return self._put_back(text, found)

    def _put_back(self, text: str, found: list[str]) -> tuple[str, list[tuple[int, int]]]:
        """`text` with each stand-in replaced by the marker text it stands for, and their spans."""
        parts = []
        spans = []
        at = 0  # in `text`
        n = 0  # in the text put back
        for m in re.finditer(rf"{re.escape(self._stand_in)}(\d+)@@", text):
            parts += [text[at : m.start()], found[int(m.group(1))]]
            n += m.start() - at
            spans.append((n, n + len(parts[-1])))
            n = spans[-1][1]
            at = m.end()
        return "".join([*parts, text[at:]]), spans

    def encode(self, text: str, literal: Sequence[tuple[int, int]] = ()) -> list[int]:
        """Token IDs of `text`; the `literal` spans (marker text from messages) are tokenized as
        plain text."""
        self.check_length(len(text))
        if literal:
            ids = []
            at = 0
            for a, b in literal:
                ids += self.encode(text[at:a]) + self._encode_plain(text[a:b])
                at = b
            return ids + self.encode(text[at:])
        if self._backend is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        # no offsets
        return list(self._backend.encode_batch_fast([text], add_special_tokens=False)[0].ids)

    def check_length(self, chars: int) -> None:
        """Refuse text of `chars` characters when no context can hold it (no token is longer than
        `token_chars`)."""
        if self.context_length and chars > self.context_length * self.token_chars:
            raise ContextOverflow(
                f"This model's maximum context length is {self.context_length} tokens, and the "
                f"prompt is {chars} characters: more than that many tokens can hold (at most "
                f"{self.token_chars} each)."
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

    def opens_thinking(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt ends inside a thinking block its template opened (the reply starts
        with reasoning): its last tokens read `<think>` and a line break at most."""
        return self.decode(prompt_ids[-8:]).rstrip().endswith("<think>")

    def reply_text(self, ids: Sequence[int]) -> str:
        """The visible text of a reply: without the end-of-turn token that closed it."""
        if ids and ids[-1] in self.end_ids:
            ids = ids[:-1]
        return self.decode(ids)

    # ------------------------------------------------------------------ prompts on transcripts

    def prompt(
        self,
        history: Sequence[Transcript],
        messages: Sequence[Message],
        tools: list[JSON],
        *,
        preserve: bool = True,
        template: JSON | None = None,
    ) -> Prompt:
        """Input IDs for `messages`, built on the rollout's matching transcript in `history` when
        there is one (`_match`). Without one the prompt is rendered whole (`_unmatched`); with one,
        a `stable` template renders only the new messages (`_appended`), else the whole prompt is
        rendered and tokenized past the transcript's text (`_extended`), or, where that text is
        not found or `preserve` is off, tokenized afresh (`_retokenized`)."""
        if not messages:
            raise RenderError("messages must not be empty")
        tools_key = json.dumps([tools, template or {}], sort_keys=True)
        # Before rendering: the prompt's text is at least this long.
        self.check_length(len(tools_key) + sum(len(m.content) for m in messages))
        conversation = _Conversation(
            messages=messages,
            tools=tools,
            template=template,
            digests=list(itertools.accumulate(messages, _digest, initial=0))[1:],
            tools_key=tools_key,
        )
        match = _match(history, conversation)
        if match is None:
            return self._unmatched(history, conversation)
        if preserve and self.stable(template):
            return self._appended(match, conversation)
        full, literal = self.render_prompt(messages, tools, template)
        covered = self._covered(full, match, conversation, as_sampled=preserve)
        if covered is None or not preserve:
            return self._retokenized(match, conversation, full, literal, found=covered is not None)
        return self._extended(match, conversation, full, literal, covered)

    def _unmatched(self, history: Sequence[Transcript], conversation: _Conversation) -> Prompt:
        """A prompt no transcript covers: the rollout's first, or a break, classified by whether
        it starts as one of the rollout's conversations did (the harness edited its context)."""
        full, literal = self.render_prompt(
            conversation.messages, conversation.tools, conversation.template
        )
        mismatch: PrefixBreak | None
        if not history:
            mismatch = None
        elif any(t.first == conversation.digests[0] for t in history):
            mismatch = PrefixBreak.CONTEXT_REWRITTEN
        else:
            mismatch = PrefixBreak.NEW_CHAIN
        if literal:
            ids = array("i", self.encode(full, literal))
        else:
            # a copy of the cached IDs: the caller may extend them
            ids = array("i", self._encode_first(full))
        return Prompt(
            ids=ids,
            extended=False,
            mismatch=mismatch,
            digests=conversation.digests,
            tools_key=conversation.tools_key,
            text=full,
        )

    def _appended(self, match: _Match, conversation: _Conversation) -> Prompt:
        """With a `stable` template only the new messages are rendered: the history is the
        transcript's."""
        new = conversation.messages[match.covers :]
        added, spans = self._after(
            conversation.messages[0],
            new,
            conversation.tools,
            conversation.template,
            conversation.tools_key,
        )
        return Prompt(
            ids=match.transcript.ids + array("i", self.encode(added, spans)),
            extended=True,
            mismatch=None,
            digests=conversation.digests,
            tools_key=conversation.tools_key,
        )

    def _covered(
        self, full: str, match: _Match, conversation: _Conversation, *, as_sampled: bool
    ) -> int | None:
        """How much of the rendered prompt `full` is the transcript's conversation: with
        `as_sampled`, first its text as sampled when the reply came back so (no second render),
        else the template's text of its history (`_head`); None when neither starts `full`."""
        if as_sampled:
            length, digest = match.transcript.verbatim
            if hash(full[:length]) == digest:
                return length
        history = conversation.messages[: match.covers]
        head = self._head(full, history, conversation.tools, conversation.template)
        if head is None:
            return None
        return len(head)

    def _extended(
        self,
        match: _Match,
        conversation: _Conversation,
        full: str,
        literal: list[tuple[int, int]],
        covered: int,
    ) -> Prompt:
        """The transcript's IDs, then the tokens of the text past the `covered` characters."""
        tail = [(a - covered, b - covered) for a, b in literal if a >= covered]
        return Prompt(
            ids=match.transcript.ids + array("i", self.encode(full[covered:], tail)),
            extended=True,
            mismatch=None,
            digests=conversation.digests,
            tools_key=conversation.tools_key,
            text=full,
        )

    def _retokenized(
        self,
        match: _Match,
        conversation: _Conversation,
        full: str,
        literal: list[tuple[int, int]],
        *,
        found: bool,
    ) -> Prompt:
        """The whole prompt tokenized afresh. It still extends the transcript if its IDs start
        with the transcript's; else the break is classified: the template changed the history's
        text (`found`: false), or the text is the same but tokenizes differently at a boundary."""
        ids = array("i", self.encode(full, literal))
        mismatch: PrefixBreak | None
        if not found:
            mismatch = PrefixBreak.TEMPLATE_EDIT
        elif ids[: len(match.transcript.ids)] == match.transcript.ids:
            mismatch = None
        else:
            mismatch = PrefixBreak.RETOKENIZED_BOUNDARY
        return Prompt(
            ids=ids,
            extended=not mismatch,
            mismatch=mismatch,
            digests=conversation.digests,
            tools_key=conversation.tools_key,
            text=full,
        )

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

    def recorded(
        self,
        messages: Sequence[Message],
        tools: list[JSON],
        ids: Sequence[int],
        *,
        template: JSON | None = None,
    ) -> Prompt:
        """A prompt another gateway replica rendered and recorded as `ids`, as `remember` takes it:
        its messages' digests and tools key, and its text where the template is not `stable`
        (`_covered` compares a later prompt's text with a transcript's then). Nothing is
        tokenized, and a stable template renders nothing."""
        if not messages:
            raise RenderError("messages must not be empty")
        text = ""
        if not self.stable(template):
            text, _ = self.render_prompt(messages, tools, template)
        return Prompt(
            ids=array("i", ids),
            extended=False,
            mismatch=None,
            digests=list(itertools.accumulate(messages, _digest, initial=0))[1:],
            tools_key=json.dumps([tools, template or {}], sort_keys=True),
            text=text,
        )

    def remember(
        self,
        history: Sequence[Transcript],
        prompt: Prompt,
        response_ids: Sequence[int],
        reply: Message,
        text: str | None = None,
    ) -> list[Transcript]:
        """The rollout's transcripts once a call is answered: `history` but those the call's
        conversation continues, then the call's own (prompt, sampled reply, and the turn end the
        template adds when sampling stopped without one); the latest `TRANSCRIPTS`. `text`: the
        reply's `reply_text`, if known."""
        ids = prompt.ids + array("i", response_ids)
        if not response_ids or response_ids[-1] not in self.end_ids:
            ids.append(self.turn_end)
        if text is None:
            text = self.reply_text(response_ids)
        verbatim = prompt.text + text + self.turn_end_text
        superseded = set(prompt.digests)
        kept = [t for t in history if t.digest not in superseded]
        kept.append(
            Transcript(
                digest=_digest(prompt.digests[-1], reply),
                first=prompt.digests[0],
                ids=ids,
                tools_key=prompt.tools_key,
                verbatim=(len(verbatim), hash(verbatim)),
            )
        )
        return kept[-TRANSCRIPTS:]
