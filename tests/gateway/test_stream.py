"""A reply shown while it is sampled (`gateway/stream.py`): what a stream shows is always the start
of what the recorded reply says, and it is shown as soon as it is certain."""

from __future__ import annotations

import random

from gateway.render import Renderer
from gateway.reply_parsing import parse_reply
from gateway.stream import Detokenizer, Shown
from gateway.types import CONTENT, REASONING
from tests.gateway.qwen import CHATML_TOOLS, qwen_tokenizer

PIECES = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    '{"name": "f", "arguments": {"x": 1}}',
    " ",
    "\n",
    "hello",
    "world",
    "STOP",
    "ST",
    "<",
    "</",
    "think",
    ">",
    "a",
    "tool_call",
]


def shown_in_deltas(text: str, sizes: list[int], **options: object) -> Shown:
    """`text` fed to a `Shown` in deltas of the given sizes."""
    shown = Shown(**options)  # type: ignore[arg-type]
    start = 0
    for size in sizes:
        shown.add(text[start : start + size])
        start += size
    shown.add(text[start:])
    return shown


def recorded(text: str, stops: list[str], tools: bool, thinking: bool) -> tuple[str, str]:
    """The reasoning and content of `text` as the gateway records and parses it: cut before the
    first stop string."""
    found = [text.find(stop) for stop in stops if stop in text]
    if found:
        text = text[: min(found)]
    reply = parse_reply(text, "hermes" if tools else "none", thinking=thinking)
    return reply.reasoning, reply.content


def test_what_is_shown_always_begins_what_is_recorded():
    """Random replies of markers, whitespace, stop strings and text, cut into random deltas: the
    reasoning and content shown are each the start of the recorded reply's, whatever the stop
    strings, tools and thinking (the property every stream relies on)."""
    for trial in range(4000):
        rng = random.Random(trial)
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
        stops = rng.choice([[], ["STOP"], ["ST", "world"]])
        tools = rng.random() < 0.6
        thinking = rng.random() < 0.3
        sizes = [rng.randint(1, 5) for _ in range(len(text))]
        shown = shown_in_deltas(
            text,
            sizes,
            stops=stops,
            tool_marker="<tool_call>" if tools else "",
            thinking=thinking,
        )
        reasoning, content = recorded(text, stops, tools, thinking)
        case = (text, stops, tools, thinking)
        assert reasoning.startswith(shown.sent(REASONING)), case
        assert content.startswith(shown.sent(CONTENT)), case


def test_plain_text_is_shown_as_it_comes():
    """A reply with no markers is shown delta by delta, holding back only trailing whitespace."""
    shown = Shown(stops=[], tool_marker="<tool_call>", thinking=False)
    assert [p.text for p in shown.add("Hello")] == ["Hello"]
    assert [p.text for p in shown.add(" wor")] == [" wor"]
    assert [p.text for p in shown.add("ld ")] == ["ld"]  # the space waits for what follows
    assert shown.sent(CONTENT) == "Hello world"
    assert [p.text for p in shown.add("!")] == [" !"]


def test_a_stop_string_split_across_deltas_never_leaks():
    """ "ST" may begin "STOP": it is held; once "OP" completes it, nothing after is shown and the
    reply is stopped."""
    shown = Shown(stops=["STOP"], tool_marker="", thinking=False)
    shown.add("The answer ST")
    assert shown.sent(CONTENT) == "The answer"
    shown.add("OP and more")
    assert shown.stopped
    assert shown.sent(CONTENT) == "The answer"
    shown.add(" even more")
    assert shown.sent(CONTENT) == "The answer"


def test_text_that_only_looked_like_a_stop_string_is_shown_once_it_cannot_be():
    shown = Shown(stops=["STOP"], tool_marker="", thinking=False)
    shown.add("a ST")
    shown.add("ART")
    assert shown.sent(CONTENT) == "a START"
    assert not shown.stopped


def test_a_tool_call_is_held_and_the_text_before_it_is_shown():
    """Content streams until the tool-call marker, even one split across deltas; the call itself is
    sent once recorded, so nothing after the marker is shown."""
    shown = Shown(stops=[], tool_marker="<tool_call>", thinking=False)
    shown.add("Let me look.\n<tool")
    assert shown.sent(CONTENT) == "Let me look."
    shown.add('_call>\n{"name": "ls", "arguments": {}}\n</tool_call>')
    shown.add(" trailing text")
    assert shown.sent(CONTENT) == "Let me look."


def test_reasoning_then_content():
    """A thinking block the reply opens streams as reasoning, stripped as parsing strips it; the
    text after it as content."""
    shown = Shown(stops=[], tool_marker="", thinking=False)
    for delta in ["<thi", "nk>\n", "First, ", "add.", "\n</th", "ink>\n\n", "It is ", "4."]:
        shown.add(delta)
    assert shown.sent(REASONING) == "First, add."
    assert shown.sent(CONTENT) == "It is 4."


def test_a_thinking_block_the_prompt_opened_starts_as_reasoning():
    shown = Shown(stops=[], tool_marker="", thinking=True)
    shown.add("\nplan it")
    shown.add("\n</think>\n\ndone")
    assert shown.sent(REASONING) == "plan it"
    assert shown.sent(CONTENT) == "done"


def test_the_detokenizer_gives_the_text_of_the_whole_reply_a_few_ids_at_a_time():
    """Qwen's byte-level vocabulary splits some characters across tokens: the deltas, however the
    IDs are grouped, add up to the decoded reply, and no delta holds half a character."""
    renderer = Renderer(qwen_tokenizer())
    text = "Grüße, 世界! 🚀 def f(x):\n    return x ** 2  # ok ✓\n"
    ids = renderer.encode(text)
    for seed in range(20):
        rng = random.Random(seed)
        decoder = Detokenizer(renderer.decode)
        deltas = []
        start = 0
        while start < len(ids):
            size = rng.randint(1, 3)
            deltas.append(decoder.add(ids[start : start + size]))
            start += size
        assert "".join(deltas) == renderer.decode(ids)
        assert not any("\ufffd" in delta for delta in deltas)


def test_opens_thinking_reads_the_prompt_end():
    """The reply starts in a thinking block when the prompt's last tokens open one; a prompt that
    opened and closed an empty block (thinking off) does not."""
    tok = qwen_tokenizer()
    tok.chat_template = CHATML_TOOLS
    renderer = Renderer(tok)
    opened = renderer.encode("<|im_start|>assistant\n<think>\n")
    closed = renderer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert renderer.opens_thinking(opened)
    assert not renderer.opens_thinking(closed)
    assert not renderer.opens_thinking(renderer.encode("<|im_start|>assistant\n"))
