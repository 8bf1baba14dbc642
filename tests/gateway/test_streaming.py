"""Streams as they are sampled, through the real openai (Chat Completions, Responses) and anthropic
SDKs in streaming mode. The engine is the scripted sglang stand-in (tests/sglang.py), which streams
as sglang 0.5.13 does, a token every `DELAY_S`: so the first delta can be seen to arrive long before
the generation ends. Each test checks that the text, reasoning and tool calls the SDK assembles are
the recorded reply, and that the recorded token IDs and logprobs are what the engine sampled; the
stream's last event comes after the call is recorded."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from transformers import AutoModelForCausalLM

from gateway.reply_parsing import parse_reply
from tests.gateway.stack import Stack, sglang_stack
from tests.sglang import Reply, SglangStandIn, fake_logprob
from trainer.engines import DiskEngine

DELAY_S = 0.03  # between two sampled tokens
TOOL = {"command": "ls -la"}
REPLY = (
    "<think>\nThe user wants to see the files, so I should list them.\n</think>\n\n"
    "Let me list the files in this folder.\n<tool_call>\n"
    + json.dumps({"name": "bash", "arguments": TOOL})
    + "\n</tool_call>"
)
MESSAGES = [{"role": "user", "content": "What files are here?"}]
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}
CHAT_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": SCHEMA}}]


class Clock:
    """When a stream's first text reached the harness (time.monotonic(), as the stand-in's
    `finished_at`: it runs in this process)."""

    def __init__(self) -> None:
        self.first: float | None = None

    def text(self) -> None:
        if self.first is None:
            self.first = time.monotonic()

    def check_early(self, sglang: SglangStandIn) -> None:
        """The first text reached the harness before the engine sampled the reply's last token."""
        (finished,) = sglang.log.finished_at
        assert self.first is not None
        assert self.first < finished, (self.first, finished)


def recorded(s: Stack, rollout_id: str, sglang: SglangStandIn, text: str) -> dict:
    """The rollout's one call, checked against what the engine sampled: the scripted text's tokens
    and the stand-in's logprobs; returns it."""
    (call,) = s.admin.get(f"/api/rollouts/{rollout_id}/calls").json()
    sampled = [*sglang.tokenizer.encode(text, add_special_tokens=False), sglang.end_id]
    assert call["response_ids"] == sampled
    assert call["logprobs"] == pytest.approx([fake_logprob(i) for i in range(len(sampled))])
    return call


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_chat_completions_stream_as_sampled(
    tiny_path: Path, tmp_path: Path, incremental: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Either of sglang's chunk modes (each chunk whole so far, or only its new tokens) gives the
    same stream; the gateway's log says once what the costlier one costs."""
    caplog.set_level(logging.INFO, logger="gateway.engines")
    sglang = SglangStandIn(tiny_path, [REPLY], token_delay_s=DELAY_S, incremental=incremental)
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        clock = Clock()
        stream = client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            tools=CHAT_TOOLS,
            max_tokens=200,
            stream=True,
            stream_options={"include_usage": True},
        )
        reasoning, content, calls, finish, usage = "", "", {}, None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            extra = delta.model_extra or {}
            if delta.content or extra.get("reasoning_content"):
                clock.text()
            content += delta.content or ""
            reasoning += extra.get("reasoning_content") or ""
            for call in delta.tool_calls or []:
                calls.setdefault(call.index, call.function)
            finish = chunk.choices[0].finish_reason or finish
        call = recorded(s, r["id"], sglang, REPLY)
    clock.check_early(sglang)
    reply = parse_reply(call["response"]["text"], "hermes")
    assert (reasoning, content) == (reply.reasoning, reply.content)
    assert content == "Let me list the files in this folder."
    (function,) = calls.values()
    assert function.name == "bash" and json.loads(function.arguments) == TOOL
    assert finish == "tool_calls"
    assert usage is not None and usage.completion_tokens == len(call["response_ids"])
    said = caplog.text.count("streams each chunk whole so far")
    assert said == (0 if incremental else 1)


def test_responses_stream_as_sampled(tiny_path: Path, tmp_path: Path) -> None:
    sglang = SglangStandIn(tiny_path, [REPLY], token_delay_s=DELAY_S)
    tools = [{"type": "function", "name": "bash", "parameters": SCHEMA}]
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        clock = Clock()
        reasoning, text, kinds, final = "", "", [], None
        with client.responses.stream(
            model="m", input="What files are here?", tools=tools, max_output_tokens=200
        ) as stream:
            for event in stream:
                kinds.append(event.type)
                if event.type == "response.reasoning_summary_text.delta":
                    clock.text()
                    reasoning += event.delta
                elif event.type == "response.output_text.delta":
                    clock.text()
                    text += event.delta
            final = stream.get_final_response()
        call = recorded(s, r["id"], sglang, REPLY)
    clock.check_early(sglang)
    reply = parse_reply(call["response"]["text"], "hermes")
    assert (reasoning, text) == (reply.reasoning, reply.content)
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    items = {item.type: item for item in final.output}
    assert items["message"].content[0].text == reply.content
    assert items["reasoning"].summary[0].text == reply.reasoning
    assert items["function_call"].name == "bash"
    assert json.loads(items["function_call"].arguments) == TOOL
    # the items streamed are the items of the response completed
    added = [e for e in kinds if e == "response.output_item.added"]
    assert len(added) == len(final.output) == 3


def test_anthropic_messages_stream_as_sampled(tiny_path: Path, tmp_path: Path) -> None:
    sglang = SglangStandIn(tiny_path, [REPLY], token_delay_s=DELAY_S)
    tools = [{"name": "bash", "description": "Run a command", "input_schema": SCHEMA}]
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        client = s.anthropic_client(r["agent_token"], max_retries=0)
        clock = Clock()
        thinking, text = "", ""
        with client.messages.stream(
            model="claude-sonnet-4-5", max_tokens=200, messages=MESSAGES, tools=tools
        ) as stream:
            for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "thinking_delta":
                    clock.text()
                    thinking += event.delta.thinking
                elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                    clock.text()
                    text += event.delta.text
            final = stream.get_final_message()
        call = recorded(s, r["id"], sglang, REPLY)
    clock.check_early(sglang)
    reply = parse_reply(call["response"]["text"], "hermes")
    assert (thinking, text) == (reply.reasoning, reply.content)
    kinds = [block.type for block in final.content]
    assert kinds == ["thinking", "text", "tool_use"]
    assert final.content[2].name == "bash" and final.content[2].input == TOOL
    assert final.stop_reason == "tool_use"
    assert final.usage.input_tokens == len(call["prompt_ids"])


def test_a_stop_string_split_across_tokens_never_reaches_the_harness(
    tiny_path: Path, tmp_path: Path
) -> None:
    """The stop string is held back while it may be forming; once sampled, the gateway aborts the
    generation by its rid, and the reply is cut before it, as recorded."""
    sglang = SglangStandIn(
        tiny_path, ["Count: 1, 2, 3 END and then much more text"], token_delay_s=DELAY_S
    )
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=100, stop=[" END"], stream=True
        )
        deltas = [c.choices[0].delta.content or "" for c in stream if c.choices]
        (call,) = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
        deadline = time.monotonic() + 5
        while not sglang.aborted and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "".join(deltas) == "Count: 1, 2, 3"
    assert not any("END" in d or "much" in d for d in deltas)
    assert call["finish_reason"] == "stop_sequence"
    assert call["response"]["text"] == "Count: 1, 2, 3"
    assert sglang.aborted  # the rest was never sampled


@pytest.mark.parametrize("ending", ["a stop string", "the harness leaves"])
def test_a_stream_ended_early_then_pause_and_sleep_leave_sglang_alive(
    tiny_path: Path, tmp_path: Path, ending: str
) -> None:
    """The H200's crash (shared/evidence/sglang-0.5.13/): a stream the gateway stopped reading
    early (a stop string, or a harness that left after 5 chunks), the pause, then the trainer's
    sleep. sglang aborts a gone client only 2 s later and dies if its memory is released before: the
    gateway aborts the generation by its rid, and the pause returns once the engine runs nothing.
    The engine then sleeps, loads a version, and the next call is answered under it."""
    sglang = SglangStandIn(tiny_path, ["word " * 1000, "Hi."], token_delay_s=0.01)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        stops = [" word word"] if ending == "a stop string" else None
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=1000, stop=stops, stream=True
        )
        for chunks, _ in enumerate(stream, start=1):
            if chunks == 5:
                stream.close()  # the harness leaves (a stop string has ended it before)
                break
        s.admin.post("/api/pause", timeout=60).raise_for_status()
        idle_once_paused = sglang.idle()
        disk = DiskEngine(s.engine_url, tmp_path / "weights", model.save_pretrained)
        disk.sleep()
        disk.push(None, 1)
        disk.wake()
        disk.close()
        s.admin.post("/api/resume", json={"version": 1}).raise_for_status()
        after = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=16)
        calls = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
    assert idle_once_paused and sglang.died is None
    assert after.choices[0].message.content == "Hi." and calls[-1]["model_version"] == 1
    assert len(sglang.aborted) == 1


def test_an_engine_failure_mid_stream_ends_each_format_with_its_error(
    tiny_path: Path, tmp_path: Path
) -> None:
    """An engine error after the first tokens cannot become a status: the stream ends with the
    format's own error (the SDKs raise it), the rollout gets an error event, nothing is recorded."""
    text = "A long answer that the engine will not finish, because it fails."
    sglang = SglangStandIn(
        tiny_path, [Reply(text, fail_after=6) for _ in range(3)], token_delay_s=DELAY_S
    )
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        chat = s.openai_client(r["agent_token"], max_retries=0)
        failing = chat.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=100, stream=True
        )
        # the stream's connection is closed however it ends
        with pytest.raises(openai.APIError, match="failed the generation"), failing:
            for _ in failing:
                pass
        with chat.responses.stream(model="m", input="hi", max_output_tokens=100) as stream:
            kinds = [event.type for event in stream]
        assert kinds[-1] == "response.failed"
        claude = s.anthropic_client(r["agent_token"], max_retries=0)
        failing = claude.messages.stream(model="c", max_tokens=100, messages=MESSAGES)
        with (
            pytest.raises(anthropic.APIStatusError, match="failed the generation"),
            failing as stream,
        ):
            for _ in stream:
                pass
        calls = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
        errors = [
            e for e in s.admin.get(f"/api/rollouts/{r['id']}/events").json() if e["kind"] == "error"
        ]
    assert calls == []
    assert len(errors) == 3


def test_a_client_that_goes_mid_stream_aborts_the_generation_and_nothing_is_recorded(
    tiny_path: Path, tmp_path: Path
) -> None:
    text = "word " * 200
    sglang = SglangStandIn(tiny_path, [text], token_delay_s=DELAY_S)
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 300, "stream": True}
        headers = {"Authorization": f"Bearer {r['agent_token']}"}
        with httpx.stream(
            "POST", f"{r['base_url']}/chat/completions", json=body, headers=headers
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get(
                    "content"
                ):
                    break  # the harness goes after the first text
        deadline = time.monotonic() + 10
        while not sglang.aborted and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        calls = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
    assert sglang.aborted
    assert calls == []


def test_a_pause_waits_for_the_stream_in_flight_and_a_held_call_streams_once_resumed(
    tiny_path: Path, tmp_path: Path
) -> None:
    """The pause returns once the stream in flight has ended (recorded under the version it
    started with); a call that comes during the pause is held, then streams after the resume."""
    sglang = SglangStandIn(tiny_path, ["first " * 30, "second reply"], token_delay_s=DELAY_S)
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        texts: list[str] = []

        def call() -> None:
            stream = client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=100, stream=True
            )
            texts.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))

        first = threading.Thread(target=call)
        first.start()
        time.sleep(10 * DELAY_S)  # the first stream is under way
        s.admin.post("/api/pause", timeout=60).raise_for_status()
        # the pause waited for the stream in flight: recorded (before its last chunk was sent)
        recorded_by_the_pause = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
        held = threading.Thread(target=call)
        held.start()
        time.sleep(0.5)
        assert len(texts) == 1  # the held call has not been answered
        s.admin.post("/api/resume").raise_for_status()
        first.join(30)
        held.join(30)
        calls = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
    assert len(recorded_by_the_pause) == 1
    assert texts == ["first " * 30, "second reply"]
    assert len(calls) == 2


def test_several_choices_stream_each_once_all_are_recorded(tiny_path: Path, tmp_path: Path) -> None:
    """`n` = 2 streamed: each choice's text under its own index, once both are recorded."""
    sglang = SglangStandIn(tiny_path, ["the first", "the second"], token_delay_s=DELAY_S)
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=20, n=2, stream=True
        )
        texts = {0: "", 1: ""}
        finished = {}
        for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
                if choice.finish_reason:
                    finished[choice.index] = choice.finish_reason
        calls = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
    assert texts == {0: "the first", 1: "the second"}
    assert finished == {0: "stop", 1: "stop"}
    assert [c["response"]["text"] for c in calls] == ["the first", "the second"]
