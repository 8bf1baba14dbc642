"""The gateway end to end with real clients: openai, litellm, anthropic SDKs against a real
gateway, store and embedded engine (tiny model) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import torch
from transformers import AutoTokenizer

from agl.types import Status
from tests.gateway.qwen import SWITCH
from tests.gateway.stack import ADMIN, Stack, stack

TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "run a command",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    },
}
CALL_TEXT = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>'


@pytest.fixture
def free(tiny_path: Path, tmp_path: Path):
    """The tiny model sampling freely."""
    with stack(tiny_path, tmp_path) as s:
        yield s


@pytest.fixture
def thinking(tiny_path: Path, tmp_path: Path):
    """The tiny model sampling freely; the gateway's chat template has Qwen3's `enable_thinking` switch."""
    tok = AutoTokenizer.from_pretrained(tiny_path)
    tok.chat_template = tok.chat_template.replace(
        "assistant\n{% endif -%}", f"assistant\n{SWITCH}{{% endif -%}}"
    )
    tok.save_pretrained(tmp_path / "tokenizer")
    with stack(tiny_path, tmp_path, tokenizer=str(tmp_path / "tokenizer")) as s:
        yield s


def not_honoured(s: Stack, rollout_id: str) -> list[dict]:
    return [
        e["data"]
        for e in s.admin.get(f"/api/rollouts/{rollout_id}/events").json()
        if e["kind"] == "not_honoured"
    ]


def scripted(tiny_path: Path, tmp_path: Path, texts: list[str], **settings: object):
    return stack(tiny_path, tmp_path, script=texts, **settings)


def decoded(s: Stack, ids: list[int]) -> str:
    return s.engine.tokenizer.decode(ids, skip_special_tokens=False)


def check_fidelity(s: Stack, rollout_id: str) -> list[dict]:
    """Every recorded call: as many logprobs as response IDs, and they are the model's own
    (teacher-forced) log-probabilities of those IDs at temperature 1."""
    calls = s.admin.get(f"/api/rollouts/{rollout_id}/calls").json()
    model = s.engine.model
    for call in calls:
        prompt, response, logprobs = call["prompt_ids"], call["response_ids"], call["logprobs"]
        assert len(response) == len(logprobs) > 0
        with torch.no_grad():
            logits = model(torch.tensor([prompt + response])).logits[0].float()
        expected = torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(
            1, torch.tensor(response)[:, None]
        )[:, 0]
        assert torch.allclose(expected, torch.tensor(logprobs), atol=1e-4), call["seq"]
    return calls


# ------------------------------------------------------------------ OpenAI SDK


def test_openai_sync_records_exact_tokens(free: Stack):
    r = free.rollout()
    client = free.openai_client(r["agent_token"])
    out = client.chat.completions.create(
        model="solver",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=12,
        temperature=1.0,
    )
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.completion_tokens > 0
    (call,) = check_fidelity(free, r["id"])
    assert call["agent"] == "solver" and call["request"]["messages"][0]["content"] == "hello"
    assert decoded(free, call["response_ids"]).startswith(out.choices[0].message.content or "")
    rollout = free.admin.get(f"/api/rollouts/{r['id']}").json()
    assert rollout["status"] == "running"  # the first call started it


def test_calls_record_their_temperature_and_a_rollouts_sampling_overrides_the_harness(free: Stack):
    """Validation rollouts are greedy whatever the harness asks: the rollout's `sampling` is applied
    to each of its calls, and every call records the temperature it was sampled at."""
    messages = [{"role": "user", "content": "hello"}]
    plain, greedy = free.rollout(), free.rollout(sampling={"temperature": 0})
    for r in (plain, greedy):
        client = free.openai_client(r["agent_token"])
        for _ in range(2):
            client.chat.completions.create(
                model="m", messages=messages, max_tokens=8, temperature=0.3
            )
    (a, b), (c, d) = (
        free.admin.get(f"/api/rollouts/{r['id']}/calls").json() for r in (plain, greedy)
    )
    assert a["temperature"] == b["temperature"] == pytest.approx(0.3)  # as asked
    # greedy
    assert c["temperature"] == d["temperature"] == 0.0 and c["response_ids"] == d["response_ids"]
    assert free.admin.get(f"/api/rollouts/{greedy['id']}").json()["metadata"]["sampling"] == {
        "temperature": 0.0
    }


@pytest.mark.parametrize(
    "body",
    [
        {"sampling": {"temperature": "hot"}},
        {"sampling": {"temperature": 3}},
        {"sampling": {"tempreature": 0}},
        {"metadata": {"sampling": {"temperature": 0}}},  # only through the validated field
    ],
)
def test_bad_rollout_sampling_is_a_400_and_creates_nothing(free: Stack, body: dict):
    reply = free.admin.post("/api/rollouts", json={"task": {}, "group": "bad", **body})
    assert reply.status_code == 400, reply.text
    assert free.admin.get("/api/rollouts", params={"group": "bad"}).json() == []


def test_openai_async_concurrent_and_n(free: Stack):
    r = free.rollout()

    async def main() -> list:
        client = openai.AsyncOpenAI(base_url=r["base_url"], api_key=r["agent_token"])
        jobs = [
            client.chat.completions.create(
                model="a",
                messages=[{"role": "user", "content": f"q{i}"}],
                max_tokens=8,
                n=2,
                seed=i,
            )
            for i in range(4)
        ]
        try:
            return await asyncio.gather(*jobs)
        finally:
            await client.close()

    outs = asyncio.run(main())
    assert all(len(o.choices) == 2 for o in outs)
    calls = check_fidelity(free, r["id"])
    assert len(calls) == 8  # each choice is one recorded call
    assert sorted(c["seq"] for c in calls) == list(range(8))


def test_openai_streaming_tool_call_round_trip(tiny_path: Path, tmp_path: Path):
    with scripted(tiny_path, tmp_path, [CALL_TEXT, "All done."]) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"])
        messages: list = [
            {"role": "system", "content": "You run commands."},
            {"role": "user", "content": "list"},
        ]
        chunks = list(
            client.chat.completions.create(
                model="m",
                messages=messages,
                tools=[TOOL],
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=64,
            )
        )
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("bash", {"cmd": "ls -la"})
        ]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        finish = [
            c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
        ]
        assert finish == ["tool_calls"]
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": calls[0].id,
                        "type": "function",
                        "function": {"name": "bash", "arguments": calls[0].function.arguments},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "file.txt"})
        out = client.chat.completions.create(
            model="m", messages=messages, tools=[TOOL], max_tokens=64
        )
        assert out.choices[0].message.content == "All done."
        first, second = check_fidelity(s, r["id"])
        assert decoded(s, first["response_ids"]).startswith(CALL_TEXT)
        # prefix-preserving: the second prompt starts with the first prompt and its sampled reply
        assert second["prompt_ids"][: len(first["prompt_ids"]) + len(first["response_ids"])] == (
            first["prompt_ids"] + first["response_ids"]
        )
        assert 'agl_prefix_total{kind="extended"} 1.0' in s.admin.get("/metrics").text


def test_litellm_openai_model(tiny_path: Path, tmp_path: Path):
    import litellm

    with scripted(tiny_path, tmp_path, ["four"]) as s:
        r = s.rollout()
        out = litellm.completion(
            model="openai/solver",
            api_base=r["base_url"],
            api_key=r["agent_token"],
            messages=[{"role": "user", "content": "2+2?"}],
            max_tokens=16,
        )
        assert out.choices[0].message.content == "four"
        (call,) = check_fidelity(s, r["id"])
        assert call["agent"] == "solver"
    # litellm keeps the OpenAI client it made, and its connection, for later calls: closed here,
    # so no socket outlives the test
    for client in litellm.in_memory_llm_clients_cache.cache_dict.values():
        if isinstance(client, openai.OpenAI):
            client.close()
    litellm.in_memory_llm_clients_cache.flush_cache()


def test_responses_api(tiny_path: Path, tmp_path: Path):
    with scripted(tiny_path, tmp_path, [CALL_TEXT, "Listed."]) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"])
        tool = {"type": "function", "name": "bash", "parameters": TOOL["function"]["parameters"]}
        first = client.responses.create(
            model="codex", instructions="be brief", input="list files", tools=[tool]
        )
        (fc,) = [item for item in first.output if item.type == "function_call"]
        assert (fc.name, json.loads(fc.arguments)) == ("bash", {"cmd": "ls -la"})
        events = list(
            client.responses.create(
                model="codex",
                instructions="be brief",
                input=[
                    {"role": "user", "content": "list files"},
                    {
                        "type": "function_call",
                        "call_id": fc.call_id,
                        "name": "bash",
                        "arguments": fc.arguments,
                    },
                    {"type": "function_call_output", "call_id": fc.call_id, "output": "a.txt"},
                ],
                tools=[tool],
                stream=True,
            )
        )
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text == "Listed."
        assert len(check_fidelity(s, r["id"])) == 2


def test_codex_namespace_tools_are_offered_as_the_functions_they_group(
    tiny_path: Path, tmp_path: Path
):
    """Codex groups tools in `namespace` tools: each nested function is rendered, and a call of it
    comes back under its own name. A built-in tool (`web_search`) no prompt can show is named in a
    `not_honoured` event."""
    with scripted(tiny_path, tmp_path, [CALL_TEXT]) as s:
        r = s.rollout()
        bash = {"type": "function", "name": "bash", "parameters": TOOL["function"]["parameters"]}
        group = {"type": "namespace", "name": "shell", "description": "commands", "tools": [bash]}
        body = {"model": "codex", "input": "list files", "tools": [group, {"type": "web_search"}]}
        headers = {"Authorization": f"Bearer {r['agent_token']}"}
        reply = httpx.post(s.url + "/v1/responses", headers=headers, json=body)
        (fc,) = [item for item in reply.json()["output"] if item["type"] == "function_call"]
        assert (fc["name"], json.loads(fc["arguments"])) == ("bash", {"cmd": "ls -la"})
        (call,) = check_fidelity(s, r["id"])
        assert '"name": "bash"' in decoded(s, call["prompt_ids"])
        assert not_honoured(s, r["id"]) == [{"fields": ["tools.web_search"]}]
        for tools in (
            [{"type": "namespace", "name": "shell", "tools": "bash"}],
            ["web_search"],
            [{"name": "bash"}],
        ):
            refused = httpx.post(
                s.url + "/v1/responses", headers=headers, json=body | {"tools": tools}
            )
            assert (
                refused.status_code == 400
                and refused.json()["error"]["type"] == "invalid_request_error"
            )


def test_thinking_and_template_variables_reach_the_template(thinking: Stack):
    """Chat's `chat_template_kwargs`, Anthropic's `thinking` and Responses' `reasoning` set the template's
    `enable_thinking` (off: an empty think block after the generation prompt); a budget has no switch."""
    r = thinking.rollout()
    chat = thinking.openai_client(r["agent_token"])
    claude = thinking.anthropic_client(r["agent_token"])
    user, empty = [{"role": "user", "content": "hi"}], "<think>\n\n</think>\n\n"

    def last_prompt_ends() -> str:
        call = thinking.admin.get(f"/api/rollouts/{r['id']}/calls").json()[-1]
        return decoded(thinking, call["prompt_ids"]).rpartition("<|im_start|>assistant\n")[2]

    off = {"chat_template_kwargs": {"enable_thinking": False}}
    chat.chat.completions.create(model="m", messages=user, max_tokens=4, extra_body=off)
    assert last_prompt_ends() == empty
    chat.chat.completions.create(model="m", messages=user, max_tokens=4)
    assert last_prompt_ends() == ""
    claude.messages.create(model="c", max_tokens=4, messages=user, thinking={"type": "disabled"})
    assert last_prompt_ends() == empty
    claude.messages.create(
        model="c", max_tokens=8, messages=user, thinking={"type": "enabled", "budget_tokens": 4}
    )
    assert last_prompt_ends() == ""
    chat.responses.create(
        model="codex", input="hi", max_output_tokens=4, reasoning={"effort": "none"}
    )
    assert last_prompt_ends() == empty
    assert not_honoured(thinking, r["id"]) == [{"fields": ["thinking.budget_tokens"]}]


def test_what_no_prompt_shows_is_named_once_per_rollout_and_counted(free: Stack):
    """On a template without a thinking switch, Anthropic's `thinking` is not honoured: a `not_honoured`
    event names it once per rollout, and /metrics counts it. A refused request names nothing."""
    r = free.rollout()
    claude = free.anthropic_client(r["agent_token"], max_retries=0)
    user, think = [{"role": "user", "content": "hi"}], {"type": "enabled", "budget_tokens": 4}
    for _ in range(2):
        claude.messages.create(model="c", max_tokens=8, messages=user, thinking=think)
    # too long a completion
    body = {"max_tokens": 10**6, "messages": user, "tool_choice": {"type": "any"}}
    refused = httpx.post(
        free.url + "/v1/messages", headers={"x-api-key": r["agent_token"]}, json=body
    )
    assert refused.status_code == 400
    claude.messages.create(
        model="c", max_tokens=8, messages=user, thinking=think, tool_choice={"type": "auto"}
    )
    assert not_honoured(free, r["id"]) == [{"fields": ["thinking", "thinking.budget_tokens"]}]
    metrics = free.admin.get("/metrics").text
    assert 'agl_not_honoured_total{field="thinking"} 1.0' in metrics
    assert 'field="tool_choice"' not in metrics


# ------------------------------------------------------------------ AIR


def test_air_gives_a_failed_tool_calls_reward_to_the_call_that_asked_for_it(
    tiny_path: Path, tmp_path: Path
):
    """A tool result that reports an error (Anthropic's `is_error`, or the pattern in Chat Completions' and
    Responses' text) becomes an intermediate reward of the agent's call that made the tool call, once the
    request that sends it back is recorded. A successful result, or a refused request, posts nothing."""
    air = {"air_tool_error_reward": -0.5, "air_error_pattern": r"(?i)\berror\b"}
    with scripted(tiny_path, tmp_path, [CALL_TEXT] * 8, **air) as s:

        def rewards(rid: str) -> list[dict]:
            return [
                e["data"]
                for e in s.admin.get(f"/api/rollouts/{rid}/events").json()
                if e["kind"] == "reward"
            ]

        r = s.rollout()
        chat = s.openai_client(r["agent_token"]).chat.completions
        asked = [{"role": "user", "content": "list"}]
        first = (
            chat.create(model="m", messages=asked, tools=[TOOL], max_tokens=64).choices[0].message
        )
        (tc,) = first.tool_calls
        turn = [
            first.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": tc.id, "content": "a.txt"},
        ]
        second = (
            chat.create(model="m", messages=asked + turn, tools=[TOOL], max_tokens=64)
            .choices[0]
            .message
        )
        assert rewards(r["id"]) == []  # a result that is not an error
        (tc,) = second.tool_calls
        error = {"role": "tool", "tool_call_id": tc.id, "content": "Error: ls failed"}
        # two failed results
        failed = [*asked, *turn, second.model_dump(exclude_none=True), error, error]
        # refused (too long a completion): nothing is posted
        with pytest.raises(openai.BadRequestError):
            chat.create(model="m", messages=failed, tools=[TOOL], max_tokens=10**6)
        assert rewards(r["id"]) == []
        chat.create(model="m", messages=failed, tools=[TOOL], max_tokens=64)
        seqs = [c["seq"] for c in s.admin.get(f"/api/rollouts/{r['id']}/calls").json()]
        assert rewards(r["id"]) == [
            {"value": -1.0, "source": "air:tool_error", "final": False, "call_seq": seqs[1]}
        ]

        r = s.rollout()
        client = s.anthropic_client(r["agent_token"])
        tools = [
            {"name": "bash", "description": "run", "input_schema": TOOL["function"]["parameters"]}
        ]
        user = [{"role": "user", "content": "list"}]
        got = client.messages.create(model="claude", max_tokens=64, tools=tools, messages=user)
        (use,) = [b for b in got.content if b.type == "tool_use"]
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "fine", "is_error": True}
        reply = {"role": "assistant", "content": [b.model_dump() for b in got.content]}
        client.messages.create(
            model="claude",
            max_tokens=64,
            tools=tools,
            messages=[*user, reply, {"role": "user", "content": [result]}],
        )
        seqs = [c["seq"] for c in s.admin.get(f"/api/rollouts/{r['id']}/calls").json()]
        assert [(d["value"], d["call_seq"]) for d in rewards(r["id"])] == [(-0.5, seqs[0])]

        r = s.rollout()
        responses = s.openai_client(r["agent_token"]).responses
        tool = {"type": "function", "name": "bash", "parameters": TOOL["function"]["parameters"]}
        (fc,) = [
            i
            for i in responses.create(model="codex", input="list", tools=[tool]).output
            if i.type != "message"
        ]
        items = [
            {
                "type": "function_call",
                "call_id": fc.call_id,
                "name": "bash",
                "arguments": fc.arguments,
            }
        ]
        items.append(
            {"type": "function_call_output", "call_id": fc.call_id, "output": "ERROR: denied"}
        )
        responses.create(
            model="codex", input=[{"role": "user", "content": "list"}, *items], tools=[tool]
        )
        seqs = [c["seq"] for c in s.admin.get(f"/api/rollouts/{r['id']}/calls").json()]
        assert [(d["value"], d["call_seq"]) for d in rewards(r["id"])] == [(-0.5, seqs[0])]


# ------------------------------------------------------------------ Anthropic SDK


def test_anthropic_tool_use_and_streaming(tiny_path: Path, tmp_path: Path):
    with scripted(tiny_path, tmp_path, [CALL_TEXT, "Here they are."]) as s:
        r = s.rollout()
        client = s.anthropic_client(r["agent_token"])
        tools = [
            {"name": "bash", "description": "run", "input_schema": TOOL["function"]["parameters"]}
        ]
        first = client.messages.create(
            model="claude",
            max_tokens=64,
            system="You run commands.",
            tools=tools,
            messages=[{"role": "user", "content": "list"}],
        )
        assert first.stop_reason == "tool_use"
        (use,) = [b for b in first.content if b.type == "tool_use"]
        assert (use.name, use.input) == ("bash", {"cmd": "ls -la"})
        with client.messages.stream(
            model="claude",
            max_tokens=64,
            system="You run commands.",
            tools=tools,
            messages=[
                {"role": "user", "content": "list"},
                {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}],
                },
            ],
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text == "Here they are." and final.stop_reason == "end_turn"
        assert final.usage.output_tokens > 0
        assert len(check_fidelity(s, r["id"])) == 2


def test_no_tool_calls_are_parsed_when_no_tools_were_offered(tiny_path: Path, tmp_path: Path):
    """Claude Code's title request offers `tools: []`; it got a `tool_use` block back, which no real
    API sends (#22). Without tools the sampled text is the reply, tool-call markup and all; the call
    is recorded the same."""
    with scripted(tiny_path, tmp_path, [CALL_TEXT, CALL_TEXT]) as s:
        r = s.rollout()
        claude = s.anthropic_client(r["agent_token"])
        title = claude.messages.create(
            model="claude", max_tokens=64, tools=[], messages=[{"role": "user", "content": "t"}]
        )
        assert title.stop_reason == "end_turn" and [b.type for b in title.content] == ["text"]
        assert title.content[0].text == CALL_TEXT
        chat = s.openai_client(r["agent_token"]).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "t"}], max_tokens=64
        )
        assert chat.choices[0].finish_reason == "stop" and not chat.choices[0].message.tool_calls
        assert chat.choices[0].message.content == CALL_TEXT
        assert len(check_fidelity(s, r["id"])) == 2


def test_anthropic_system_turns_inside_messages_are_rendered_as_system_messages(
    tiny_path: Path, tmp_path: Path
):
    """Claude Code 2.1, given a model name it does not know, sends its environment as a `system` turn inside
    `messages` (with cache_control); it was refused with 400 and the harness gave up (#22)."""
    with scripted(tiny_path, tmp_path, ["Done."]) as s:
        r = s.rollout()
        env = {
            "type": "text",
            "text": "# Environment\ncwd: /w",
            "cache_control": {"type": "ephemeral"},
        }
        body = {"model": "solver", "max_tokens": 16, "system": "You are a coding agent."}
        body["messages"] = [
            {"role": "user", "content": "Write hi"},
            {"role": "system", "content": [env]},
        ]
        reply = httpx.post(
            s.url + "/v1/messages?beta=true", headers={"x-api-key": r["agent_token"]}, json=body
        )
        assert reply.status_code == 200, reply.text
        (call,) = check_fidelity(s, r["id"])
        prompt = decoded(s, call["prompt_ids"])
        assert (
            prompt.index("You are a coding agent.")
            < prompt.index("Write hi")
            < prompt.index("# Environment")
        )
        assert prompt.count("<|im_start|>system") == 2


def test_anthropic_errors_are_in_anthropic_format(free: Stack):
    r = free.rollout()
    client = free.anthropic_client("wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        client.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error"  # type: ignore[index]
    raw = httpx.post(
        free.url + "/v1/messages",
        headers={"x-api-key": r["agent_token"]},
        json={"model": "c", "messages": []},
    )
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"


# ------------------------------------------------------------------ completions, models, path tokens


def test_completions_with_text_and_token_prompts_and_path_token(free: Stack):
    r = free.rollout()
    base = f"{free.url}/r/{r['agent_token']}/v1"
    client = free.openai_client("ignored-when-the-path-has-a-token", base_url=base)
    text = client.completions.create(model="raw", prompt="Once upon", max_tokens=5)
    ids = client.completions.create(model="raw", prompt=[1, 2, 3], max_tokens=5)
    assert text.choices[0].finish_reason in ("stop", "length") and ids.usage.prompt_tokens == 3  # type: ignore[union-attr]
    assert [m.id for m in client.models.list()] == ["agl"]
    assert len(check_fidelity(free, r["id"])) == 2


def test_context_overflow_is_context_length_exceeded(free: Stack):
    r = free.rollout()
    client = free.openai_client(r["agent_token"], max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=free.engine.max_context,
        )
    assert e.value.code == "context_length_exceeded"
    assert free.admin.get(f"/api/rollouts/{r['id']}/calls").json() == []
    events = free.admin.get(f"/api/rollouts/{r['id']}/events").json()
    assert events[-1]["kind"] == "error"
    metrics = free.admin.get("/metrics").text
    assert 'agl_call_errors_total{kind="invalid_request_error",status="400"} 1.0' in metrics
    # prompts are classified only once their call is recorded (#22)
    assert "agl_prefix_total{" not in metrics


def test_stop_strings_cut_the_recorded_tokens_too(tiny_path: Path, tmp_path: Path):
    with scripted(tiny_path, tmp_path, ["alpha END beta gamma"]) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"])
        out = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stop=["END"]
        )
        assert out.choices[0].message.content == "alpha "
        (call,) = check_fidelity(s, r["id"])
        assert decoded(s, call["response_ids"]).startswith("alpha END")
        assert "beta" not in decoded(s, call["response_ids"])


# ------------------------------------------------------------------ pause and resume


def test_pause_drains_and_no_call_crosses_a_version(free: Stack):
    """50 calls in flight when the pause starts and 50 arriving during it: all succeed, pause
    returns only when drained, and every call is recorded under exactly one version."""
    rollouts = [free.rollout() for _ in range(10)]
    results: list[object] = []
    started = threading.Event()

    async def harnesses(count: int, offset: int) -> None:
        clients = [
            openai.AsyncOpenAI(base_url=r["base_url"], api_key=r["agent_token"]) for r in rollouts
        ]

        async def one(i: int) -> None:
            c = clients[(i + offset) % len(clients)]
            try:
                await c.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"{i}"}], max_tokens=24
                )
                results.append("ok")
            except Exception as e:  # noqa: BLE001 - counted below
                results.append(e)

        started.set()
        await asyncio.gather(*(one(i) for i in range(count)))
        for c in clients:
            await c.close()

    first = threading.Thread(target=lambda: asyncio.run(harnesses(50, 0)))
    first.start()
    started.wait()
    while free.admin.get("/api/state").json()["inflight"] < 5:
        pass
    started.clear()
    second = threading.Thread(target=lambda: asyncio.run(harnesses(50, 3)))
    pause = free.admin.post("/api/pause", timeout=120).json()
    assert pause["paused"] and pause["inflight"] == 0
    second.start()
    started.wait()
    recorded_at_pause = sum(
        len(free.admin.get(f"/api/rollouts/{r['id']}/calls").json()) for r in rollouts
    )
    while free.admin.get("/api/state").json()["waiting"] < 10:
        pass
    assert (
        sum(len(free.admin.get(f"/api/rollouts/{r['id']}/calls").json()) for r in rollouts)
        == recorded_at_pause
    )
    assert free.admin.post("/api/resume", json={"version": 1}).json()["version"] == 1
    first.join()
    second.join()
    assert results.count("ok") == 100, [r for r in results if r != "ok"][:3]
    calls = [c for r in rollouts for c in free.admin.get(f"/api/rollouts/{r['id']}/calls").json()]
    versions = sorted(c["model_version"] for c in calls)
    assert (
        len(calls) == 100
        and versions.count(0) == recorded_at_pause
        and versions.count(1) == 100 - recorded_at_pause
    )


def test_pause_hold_limit_ends_in_503(tiny_path: Path, tmp_path: Path):
    with stack(tiny_path, tmp_path, max_hold_s=0.3) as s:
        r = s.rollout()
        s.admin.post("/api/pause")
        reply = httpx.post(
            s.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {r['agent_token']}"},
            json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3},
        )
        assert reply.status_code == 503 and reply.headers["retry-after"]
        assert reply.json()["error"]["message"].startswith("the gateway has been paused")
        s.admin.post("/api/resume", json={})


# ------------------------------------------------------------------ auth and the admin API


def test_tokens_are_scoped_to_their_rollout(free: Stack):
    a, b = free.rollout(), free.rollout(grader={"cmd": "grade.sh"})
    assert "grader_token" in b and "grader_token" not in a
    agent_a = {"Authorization": f"Bearer {a['agent_token']}"}
    agent_b = {"Authorization": f"Bearer {b['agent_token']}"}
    grader_b = {"x-api-key": b["grader_token"]}
    rejected = [
        httpx.get(f"{free.url}/api/rollouts/{b['id']}/calls", headers=agent_a),
        httpx.get(f"{free.url}/api/rollouts/{b['id']}/events", headers=agent_a),
        httpx.post(
            f"{free.url}/api/rollouts/{b['id']}/events", headers=agent_a, json={"kind": "x"}
        ),
        httpx.post(
            f"{free.url}/api/rollouts/{b['id']}/reward", headers=agent_a, json={"reward": 1}
        ),
        # has a grader
        httpx.post(
            f"{free.url}/api/rollouts/{b['id']}/reward", headers=agent_b, json={"reward": 1}
        ),
        httpx.post(
            f"{free.url}/api/rollouts/{b['id']}/status", headers=agent_b, json={"status": "running"}
        ),
        httpx.get(f"{free.url}/api/rollouts", headers=agent_a),
        httpx.post(f"{free.url}/api/pause", headers=agent_a),
        httpx.post(
            f"{free.url}/v1/chat/completions",
            headers=grader_b,
            json={"messages": [{"role": "user", "content": "x"}]},
        ),
    ]
    assert [r.status_code for r in rejected] == [403] * 9
    assert (
        httpx.post(
            f"{free.url}/api/rollouts/{b['id']}/reward", headers=grader_b, json={"reward": 0.5}
        ).status_code
        == 200
    )
    assert (
        httpx.post(
            f"{free.url}/api/rollouts/{a['id']}/reward", headers=agent_a, json={"reward": 1}
        ).status_code
        == 200
    )
    assert (
        httpx.post(
            f"{free.url}/api/rollouts/{a['id']}/events", headers=agent_a, json={"kind": "step"}
        ).status_code
        == 200
    )
    assert free.admin.get(f"/api/rollouts/{b['id']}").json()["reward"] == 0.5
    c = free.rollout()
    assert free.admin.post(f"/api/rollouts/{c['id']}/reward", json={"reward": 0}).status_code == 200
    # who posted the reward
    for rollout, source in ((a, "agent token"), (b, "grader token"), (c, "admin")):
        events = free.admin.get(f"/api/rollouts/{rollout['id']}/events").json()
        assert [e["data"]["source"] for e in events if e["kind"] == "reward"] == [source]
    for headers in ({}, {"Authorization": "Bearer nope"}, {"x-api-key": ADMIN + "x"}):
        assert httpx.get(f"{free.url}/api/rollouts", headers=headers).status_code in (401, 403)
        assert httpx.post(
            f"{free.url}/api/rollouts", headers=headers, json={"group": "g"}
        ).status_code in (401, 403)


def test_a_rollouts_token_may_start_and_end_it_but_not_retry_or_cancel_it(free: Stack):
    """What an applied Job's reporter (`controller/report.py`) does: the token that posts the reward
    posts the end."""
    a, b = free.rollout(), free.rollout(grader=True)
    agent_a, grader_b = (
        {"Authorization": f"Bearer {a['agent_token']}"},
        {"x-api-key": b["grader_token"]},
    )

    def post(rollout: dict, headers: dict, **body: object) -> httpx.Response:
        return httpx.post(
            f"{free.url}/api/rollouts/{rollout['id']}/status", headers=headers, json=body
        )

    assert post(a, agent_a, status="cancelled").status_code == 403
    assert post(a, agent_a, status="succeeded").status_code == 409  # queued: it must start first
    assert post(a, agent_a, status="running", attempt=1).json()["status"] == "running"
    # no retries of its own
    assert post(a, agent_a, status="queued", failure_kind="infra").status_code == 403
    # a stale attempt's report
    assert post(a, agent_a, status="running", attempt=2).status_code == 409
    ended = post(a, agent_a, status="failed", failure_kind="task", reason="harness exited with 3")
    assert (ended.json()["status"], ended.json()["failure_kind"]) == ("failed", "task")
    # the token died with its rollout
    assert post(a, agent_a, status="succeeded").status_code == 403
    # the grader's to post
    assert post(b, {"x-api-key": b["agent_token"]}, status="running").status_code == 403
    assert post(b, grader_b, status="running").status_code == 200
    assert post(b, grader_b, status="timed_out").json()["status"] == "timed_out"
    reasons = [
        e["data"].get("reason") for e in free.admin.get(f"/api/rollouts/{a['id']}/events").json()
    ]
    assert "harness exited with 3" in reasons


def test_token_dies_with_its_rollout(free: Stack):
    r = free.rollout()
    client = free.openai_client(r["agent_token"], max_retries=0)
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    free.admin.post(
        f"/api/rollouts/{r['id']}/status", json={"status": "succeeded"}
    ).raise_for_status()
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
    assert len(free.admin.get(f"/api/rollouts/{r['id']}/calls").json()) == 1


def test_admin_api_lifecycle(free: Stack):
    r = free.rollout(group="g7", mode="val", metadata={"k": 1})
    got = free.admin.get(f"/api/rollouts/{r['id']}").json()
    assert (got["group"], got["mode"], got["status"], got["metadata"]) == (
        "g7",
        "val",
        "queued",
        {"k": 1},
    )
    assert (
        free.admin.post(f"/api/rollouts/{r['id']}/status", json={"status": "running"}).json()[
            "status"
        ]
        == "running"
    )
    bad = free.admin.post(f"/api/rollouts/{r['id']}/status", json={"status": "queued"})
    assert bad.status_code == 409 and "infra" in bad.json()["error"]["message"]
    free.admin.post(f"/api/rollouts/{r['id']}/reward", json={"reward": 1.0}).raise_for_status()
    free.admin.post(
        f"/api/rollouts/{r['id']}/status", json={"status": "succeeded"}
    ).raise_for_status()
    ended = free.admin.get("/api/rollouts", params={"after": 0}).json()
    assert [x["id"] for x in ended] == [r["id"]] and ended[0]["reward"] == 1.0
    assert [
        x["id"] for x in free.admin.get("/api/rollouts", params={"status": "succeeded"}).json()
    ] == [r["id"]]
    assert free.admin.post("/api/models", json={"version": 1, "path": "/ckpt/1"}).status_code == 200
    assert free.admin.post("/api/models", json={"version": 1}).status_code == 400
    assert free.admin.get("/api/state").json()["latest_model"]["version"] == 1
    assert free.admin.get("/api/rollouts/missing").status_code == 404
    assert httpx.get(free.url + "/healthz").json()["ok"] is True
    metrics = free.admin.get("/metrics").text
    assert 'agl_rollouts{status="succeeded"} 1.0' in metrics and "agl_paused 0.0" in metrics
    assert Status(got["status"]) is Status.QUEUED


def test_an_agent_that_always_asks_for_32k_tokens_is_fitted_to_the_room_left(
    tiny_path: Path, tmp_path: Path
):
    """Claude Code asks for 32,000 output tokens on every call, even a title; on a 32k context each
    was refused. With `fit_max_tokens`, max_tokens is lowered to the room left (recorded as an
    event) when at least that many tokens are left; a prompt that leaves less is still refused."""
    with stack(tiny_path, tmp_path, context_length=300, fit_max_tokens=50) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        out = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=32_000
        )
        assert out.choices[0].finish_reason in ("stop", "length")
        (lowered,) = [
            e
            for e in s.admin.get(f"/api/rollouts/{r['id']}/events").json()
            if e["kind"] == "max_tokens_lowered"
        ]
        (call,) = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
        # sglang's room: the context less the prompt, less 2 (its longest request is the
        # context less 1, and the new tokens stop one short of it)
        assert lowered["data"] == {"asked": 32_000, "to": 300 - 2 - len(call["prompt_ids"])}
        with pytest.raises(openai.BadRequestError) as e:  # fewer than 50 tokens left
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x " * 260}], max_tokens=32_000
            )
        assert e.value.code == "context_length_exceeded"


def test_every_error_answered_to_a_harness_is_counted_and_an_access_log_names_no_token(
    tiny_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    with stack(tiny_path, tmp_path, access_log=True) as s:
        r = s.rollout()
        with caplog.at_level(logging.INFO, logger="gateway.app"):
            ok = httpx.post(
                f"{s.url}/r/{r['agent_token']}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
            )
            refused = httpx.post(
                f"{s.url}/v1/chat/completions", headers={"Authorization": "Bearer nope"}, json={}
            )
        assert (ok.status_code, refused.status_code) == (200, 401)
        metrics = httpx.get(s.url + "/metrics").text
        # no rollout to blame
        assert 'agl_call_errors_total{kind="authentication_error",status="401"} 1.0' in metrics
        lines = [rec.getMessage() for rec in caplog.records if rec.name == "gateway.app"]
        assert "POST /v1/chat/completions 200" in lines[0] and lines[0].endswith(
            f"rollout_id={r['id']}"
        )
        assert "POST /v1/chat/completions 401" in lines[1] and lines[1].endswith("rollout_id=-")
        assert not any(r["agent_token"] in line or "nope" in line for line in lines)
