"""Wire formats' `parse`: what each request field becomes for the chat template, and which set fields are
named as not honoured (they would change what the model sees, and no prompt can show them); and the
`Stream` contract every format's stream keeps."""

from __future__ import annotations

import json

import pytest

from gateway import wire
from gateway.types import CONTENT, Completion, Message, Part, RenderError

USER = [{"role": "user", "content": "x"}]
FN = {"type": "function", "name": "exec", "parameters": {"type": "object"}}


def parsed(
    schema: type[wire.ChatRequest | wire.ResponsesRequest | wire.AnthropicRequest],
    switch: bool,
    **body,
):
    _, tools, params = schema.model_validate(body).parse(switch)
    return [t["function"]["name"] for t in tools], params.template, params.not_honoured


OFF, ON = {"enable_thinking": False}, {"enable_thinking": True}
CHAT, RESPONSES, ANTHROPIC = wire.ChatRequest, wire.ResponsesRequest, wire.AnthropicRequest


@pytest.mark.parametrize(
    ("schema", "body", "switch", "template", "not_honoured"),
    [
        (CHAT, {}, True, {}, []),
        (CHAT, {"chat_template_kwargs": OFF}, False, OFF, []),  # passed as given, as vLLM does
        (
            CHAT,
            {"tool_choice": "required", "reasoning_effort": "low"},
            True,
            {},
            ["tool_choice", "reasoning_effort"],
        ),
        (
            CHAT,
            {"tool_choice": {"type": "function", "function": {"name": "f"}}},
            True,
            {},
            ["tool_choice"],
        ),
        (CHAT, {"response_format": {"type": "json_object"}}, True, {}, ["response_format"]),
        (CHAT, {"response_format": {"type": "text"}, "tool_choice": "auto"}, True, {}, []),
        # the usage chunk is sent when asked; another stream option is not
        (
            CHAT,
            {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
            True,
            {},
            ["stream_options.continuous_usage_stats"],
        ),
        (
            ANTHROPIC,
            {"thinking": {"type": "enabled", "budget_tokens": 1024}},
            True,
            ON,
            ["thinking.budget_tokens"],
        ),
        (ANTHROPIC, {"thinking": {"type": "adaptive"}}, True, ON, []),
        (ANTHROPIC, {"thinking": {"type": "disabled"}}, True, OFF, []),
        # no switch in the template
        (ANTHROPIC, {"thinking": {"type": "disabled"}}, False, {}, ["thinking"]),
        (ANTHROPIC, {"thinking": {"type": "sometimes"}}, True, {}, ["thinking"]),
        (ANTHROPIC, {"tool_choice": {"type": "any"}}, True, {}, ["tool_choice"]),
        (ANTHROPIC, {"tool_choice": {"type": "auto"}}, True, {}, []),
        (
            RESPONSES,
            {"reasoning": {"effort": "high", "summary": "auto"}},
            True,
            ON,
            ["reasoning.effort"],
        ),
        (RESPONSES, {"reasoning": {"effort": "minimal"}}, True, OFF, ["reasoning.effort"]),
        (RESPONSES, {"reasoning": {"effort": "none"}}, True, OFF, []),
        (RESPONSES, {"reasoning": {}}, True, ON, []),
        (RESPONSES, {"reasoning": {"effort": "low"}}, False, {}, ["reasoning", "reasoning.effort"]),
        (RESPONSES, {"text": {"verbosity": "low", "format": {"type": "text"}}}, True, {}, []),
        (RESPONSES, {"text": {"format": {"type": "json_schema"}}}, True, {}, ["text.format"]),
        (
            RESPONSES,
            {"tool_choice": "required", "previous_response_id": "r"},
            True,
            {},
            ["tool_choice", "previous_response_id"],
        ),
    ],
)
def test_thinking_maps_onto_the_template_switch_and_what_no_prompt_shows_is_named(
    schema, body: dict, switch: bool, template: dict, not_honoured: list[str]
):
    """`thinking` and `reasoning` turn the template's `enable_thinking` on or off where it has that switch
    (effort "none" and "minimal": off); a budget or an effort level has none."""
    base = {
        CHAT: {"messages": USER},
        ANTHROPIC: {"messages": USER, "max_tokens": 8},
        RESPONSES: {"input": "x"},
    }
    _, got_template, got = parsed(schema, switch, **base[schema], **body)
    assert (got_template, got) == (template, not_honoured)


def test_codex_namespace_tools_are_functions_under_their_own_names_and_built_in_tools_are_named():
    namespace = {
        "type": "namespace",
        "name": "shell",
        "description": "run things",
        "tools": [FN, FN | {"name": "b"}],
    }
    tools = [
        namespace,
        {"type": "web_search"},
        FN | {"name": "plain"},
        {"type": "custom", "name": "apply_patch"},
    ]
    names, _, named = parsed(wire.ResponsesRequest, True, input="x", tools=tools)
    assert names == ["exec", "b", "plain"] and named == ["tools.web_search", "tools.custom"]
    assert parsed(wire.ResponsesRequest, True, input="x", tools=tools, tool_choice="none")[0] == []
    for bad in (
        [{"type": "namespace", "tools": "exec"}],
        [{"name": "untyped"}],
        [{"type": "namespace", "tools": [1]}],
    ):
        with pytest.raises(RenderError):
            parsed(wire.ResponsesRequest, True, input="x", tools=bad)


def test_anthropic_server_tools_are_named_and_tool_choice_none_drops_the_tools():
    bash = {"name": "bash", "input_schema": {"type": "object"}}
    tools = [
        bash,
        {"type": "custom", **bash, "name": "b2"},
        {"type": "web_search_20250305", "name": "web_search"},
    ]
    body = {"messages": USER, "max_tokens": 8, "tools": tools}
    names, _, named = parsed(wire.AnthropicRequest, True, **body)
    assert names == ["bash", "b2"] and named == ["tools.web_search_20250305"]
    assert parsed(wire.AnthropicRequest, True, **body, tool_choice={"type": "none"})[0] == []


# Each format's request, and the last event of its stream (its `type`, or `[DONE]`)
STREAMED = [
    (wire.ChatRequest, {"messages": USER}, "[DONE]"),
    (wire.CompletionRequest, {"prompt": "x"}, "[DONE]"),
    (wire.ResponsesRequest, {"input": "x"}, "response.completed"),
    (wire.AnthropicRequest, {"messages": USER, "max_tokens": 8}, "message_stop"),
]
RECORDED = Completion(
    reply=Message(role="assistant", content="Hello"),
    prompt_tokens=3,
    completion_tokens=2,
    finish_reason="stop",
    stop_sequence="",
    logprobs=[],
    tokens=[],
)


def event_data(event: str):
    """A server-sent event's data: its JSON object, or `[DONE]`."""
    payload = event.rstrip("\n").splitlines()[-1].removeprefix("data: ")
    if payload == "[DONE]":
        return payload
    return json.loads(payload)


def text_of_event(data) -> str:
    """The reply's text an event carries, in whichever format it is."""
    if data == "[DONE]":
        return ""
    kind = data.get("type")
    if kind == "response.output_text.delta":
        return data["delta"]
    if kind == "content_block_delta":
        return data["delta"].get("text", "")
    choices = data.get("choices", [])
    return "".join(c.get("text") or c.get("delta", {}).get("content") or "" for c in choices)


@pytest.mark.parametrize(("schema", "body", "last"), STREAMED)
@pytest.mark.parametrize("shown", ["", "Hel", "Hello"])
def test_each_format_streams_the_recorded_text_once_and_ends_with_its_last_event(
    schema, body: dict, last: str, shown: str
):
    """What a stream has shown of a reply while it was sampled, then its closing, is the recorded
    text, once; the closing's last event ends the stream."""
    request = schema.model_validate(body)
    stream: wire.Stream = request.streamer()
    events = list(stream.opening(RECORDED.prompt_tokens))
    if shown:
        events += stream.delta(Part(kind=CONTENT, text=shown))
    events += stream.closing(request.reply([RECORDED]), {CONTENT: shown})
    data = [event_data(event) for event in events]
    assert "".join(map(text_of_event, data)) == "Hello"
    assert data[-1] == last or data[-1]["type"] == last
