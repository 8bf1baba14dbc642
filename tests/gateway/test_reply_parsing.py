"""Sampled text to an assistant message: reasoning, content, tool calls."""

import json

from gateway.reply_parsing import parse_reply


def test_reasoning_content_and_tool_calls_are_split():
    msg = parse_reply(
        '<think>\nhmm\n</think>\n\nok\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    )
    assert (
        msg.reasoning,
        msg.content,
        [(c.name, json.loads(c.arguments)) for c in msg.tool_calls],
    ) == (
        "hmm",
        "ok",
        [("f", {"x": 1})],
    )
    broken = parse_reply("<tool_call>{not json}</tool_call>")
    assert broken.tool_calls == () and "not json" in broken.content
    assert parse_reply("plain").content == "plain"
    assert parse_reply("thought</think>answer", thinking=True).reasoning == "thought"


def test_a_reply_cut_while_thinking_is_all_reasoning():
    """As sglang's reasoning parsers read it: a block never closed runs to the reply's end."""
    cut = parse_reply("<think>still going")
    assert (cut.reasoning, cut.content) == ("still going", "")
    opened_by_prompt = parse_reply("still going", thinking=True)
    assert (opened_by_prompt.reasoning, opened_by_prompt.content) == ("still going", "")


def test_without_a_tool_parser_a_call_stays_text():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    reply = parse_reply(text, "none")
    assert reply.tool_calls == () and reply.content == text
