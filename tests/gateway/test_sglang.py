"""The gateway in front of sglang 0.5.13 as verl 0.9.1 launches it, played by the scripted stand-in.

sglang needs a GPU; `tests/sglang.py` answers as its source does (each behaviour names its file). The
clients are the real openai SDK; the gateway and its store are real.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.gateway.stack import Stack, sglang_stack, stack
from tests.sglang import Reply, SglangStandIn, fake_logprob

MESSAGES = [{"role": "user", "content": "hello"}]


def generate_bodies(sglang: SglangStandIn) -> list[dict]:
    return [body for path, body in sglang.log.requests if path == "/generate"]


def events(s: Stack, rollout_id: str, kind: str) -> list[dict]:
    return [
        e["data"]
        for e in s.admin.get(f"/api/rollouts/{rollout_id}/events").json()
        if e["kind"] == kind
    ]


def test_the_gateway_starts_and_records_what_sglang_sampled(
    tiny_path: Path, tmp_path: Path
) -> None:
    """`/server_info` answers 500 on verl's servers: the gateway reads the context from `/v1/models`."""
    sglang = SglangStandIn(tiny_path, ["Hi there."], context_len=1024)
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        out = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=32)
        (call,) = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
        too_long = client.chat.completions.with_raw_response.create
        with pytest.raises(openai.BadRequestError, match="maximum context length is 1024"):
            too_long(model="m", messages=MESSAGES, max_tokens=2000)
    assert out.choices[0].message.content == "Hi there." and out.choices[0].finish_reason == "stop"
    (sent,) = generate_bodies(sglang)
    assert call["prompt_ids"] == sent["input_ids"]
    assert call["response_ids"][-1] == sglang.end_id  # the matched stop token is in output_ids
    assert call["logprobs"] == pytest.approx(
        [fake_logprob(i) for i in range(len(call["response_ids"]))]
    )


def test_top_k_0_is_sent_as_minus_1_from_the_harness_and_from_the_rollout(
    tiny_path: Path, tmp_path: Path
) -> None:
    """sglang refuses top_k 0 (sampling/sampling_params.py); OpenAI-style APIs mean "no top-k" by it."""
    sglang = SglangStandIn(tiny_path, ["one", "two"])
    with sglang_stack(sglang, tmp_path) as s:
        for r, extra in ((s.rollout(), {"top_k": 0}), (s.rollout(sampling={"top_k": 0}), {})):
            client = s.openai_client(r["agent_token"], max_retries=0)
            client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=8, extra_body=extra
            )
    assert [b["sampling_params"]["top_k"] for b in generate_bodies(sglang)] == [-1, -1]


def test_a_seed_is_not_sent_to_sglang_and_is_named_not_honoured(
    tiny_path: Path, tmp_path: Path
) -> None:
    """sglang uses `sampling_seed` only in deterministic mode (sampling/sampling_batch_info.py), where the
    flashinfer sampler asserts on it (layers/sampler.py); the embedded engine honours it."""
    sglang = SglangStandIn(tiny_path, ["one", "two"])
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        for _ in range(2):
            client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, seed=7)
        named = events(s, r["id"], "not_honoured")
    assert all("sampling_seed" not in b["sampling_params"] for b in generate_bodies(sglang))
    assert named == [{"fields": ["seed"]}]  # once per rollout

    sglang = SglangStandIn(tiny_path, ["one"])
    (tmp_path / "honoured").mkdir()
    with sglang_stack(
        sglang, tmp_path / "honoured", seed_honoured=True
    ) as s:  # deterministic sglang
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, seed=7)
        assert events(s, r["id"], "not_honoured") == []
    assert generate_bodies(sglang)[0]["sampling_params"]["sampling_seed"] == 7


def test_the_embedded_engine_honours_a_seed(tiny_path: Path, tmp_path: Path) -> None:
    with stack(tiny_path, tmp_path) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        first = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, seed=7)
        again = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, seed=7)
        assert events(s, r["id"], "not_honoured") == []
    assert first.choices[0].message.content == again.choices[0].message.content


def test_an_aborted_generation_is_a_retryable_503_and_is_not_recorded(
    tiny_path: Path, tmp_path: Path
) -> None:
    """sglang answers an abort with 200, `finish_reason {"type": "abort"}` and the partial output
    (managers/tokenizer_manager.py): recording it would train on a reply that never ended."""
    sglang = SglangStandIn(tiny_path, [Reply("cut short here", abort_after=2), "Whole."])
    with sglang_stack(sglang, tmp_path) as s:
        r = s.rollout()
        client = s.openai_client(r["agent_token"], max_retries=0)
        with pytest.raises(openai.InternalServerError, match="aborted") as refused:
            client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=32)
        assert s.admin.get(f"/api/rollouts/{r['id']}/calls").json() == []
        retried = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=32)
        (call,) = s.admin.get(f"/api/rollouts/{r['id']}/calls").json()
    assert refused.value.status_code == 503
    assert retried.choices[0].message.content == "Whole." and call["response"]["text"] == "Whole."
