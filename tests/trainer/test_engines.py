"""The rollout engines the backends drive: the embedded engine from disk, and sglang's weight
version; and the model a config that names none trains (`base_model_path`).

`DiskEngine` runs against the real embedded engine (tiny model). sglang cannot run here: its
weight-version endpoints are played by a stand-in that answers as sglang 0.5.13's do.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from transformers import AutoModelForCausalLM

from engine.batcher import Engine
from engine.server import create_app
from tests.gateway.conftest import serve
from tests.sglang import SglangStandIn
from trainer.engines import (
    DiskEngine,
    EngineBusy,
    EngineCallError,
    base_model_path,
    set_weight_version,
)


def test_disk_engine_sleeps_loads_a_pushed_version_and_wakes(
    tiny_path: Path, tmp_path: Path
) -> None:
    engine = Engine(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    try:
        with serve(create_app(engine)) as url:
            disk = DiskEngine(url, tmp_path / "weights", model.save_pretrained)
            for version in (1, 2, 3):
                disk.sleep()
                disk.push(None, version)  # saved now, under weights/v{version}
                disk.wake()
                assert httpx.get(url + "/model_info").json()["weight_version"] == str(version)
            # the previous one stays
            assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2", "v3"]
            disk.push(tmp_path / "weights" / "v2", 4)  # a checkpoint's folder: loaded as it is
            disk.wake()
            assert httpx.get(url + "/model_info").json()["model_path"].endswith("v2/model")
            disk.push(tmp_path / "nothing here", 5)
            with pytest.raises(EngineCallError, match="update_weights_from_disk"):
                disk.wake()
            disk.close()
    finally:
        engine.close()


def test_disk_engine_on_sglang_loads_only_once_awake_and_takes_null_replies(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    """sglang's memory commands answer 200 with `null`, and it loads weights from disk at once,
    even while its memory is released (tests/sglang.py): the engine must be awake before the
    load."""
    sglang = SglangStandIn(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    with sglang.served() as url:
        assert httpx.post(url + "/release_memory_occupation").text == "null"
        httpx.post(url + "/resume_memory_occupation")
        sglang.log.requests.clear()
        disk = DiskEngine(url, tmp_path / "weights", model.save_pretrained)
        disk.sleep()
        disk.push(None, 1)
        disk.wake()
        disk.close()
    assert sglang.log.paths() == [
        "/v1/loads",  # idle: it may sleep
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/v1/loads",  # idle: it may load
        "/update_weights_from_disk",
    ]
    assert sglang.log.loaded_while_released == [] and sglang.weight_version == "1"
    assert sglang.model_path == str(tmp_path / "weights" / "v1" / "model")


LONG = "word " * 1000  # about 600 tokens: 6 s at 10 ms a token


def leave_a_stream(url: str) -> float:
    """A streamed `/generate` left after its first chunk by a client that does not abort it (a
    gateway that crashed mid-stream): sglang decodes it 2 s more. When it left."""
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1500}, "stream": True}
    with httpx.stream("POST", url + "/generate", json=body) as reply:
        next(reply.iter_lines())
    return time.monotonic()


def test_disk_engine_sleeps_and_loads_only_once_sglang_is_idle(
    tiny_path: Path, tmp_path: Path
) -> None:
    """sglang asserts it is idle before it releases memory or loads weights, and its scheduler
    dies otherwise (tests/sglang.py). With a request left running (it is aborted 2 s after its
    client went), sleep and the load each wait until `/v1/loads` counts no request."""
    sglang = SglangStandIn(tiny_path, [LONG, LONG], token_delay_s=0.01)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    with sglang.served() as url:
        disk = DiskEngine(url, tmp_path / "weights", model.save_pretrained)
        left = leave_a_stream(url)
        disk.sleep()
        slept_after = time.monotonic() - left
        disk.push(None, 1)
        left = leave_a_stream(url)  # sglang takes a request while its memory is released
        disk.wake()
        loaded_after = time.monotonic() - left
        disk.close()
    assert sglang.died is None and sglang.weight_version == "1"
    assert slept_after >= 2.0 and loaded_after >= 2.0


def test_an_engine_that_stays_busy_fails_the_sleep_naming_it_and_is_not_released(
    tiny_path: Path, tmp_path: Path
) -> None:
    """Past `idle_s` the sleep fails with the engine and its requests named, and sends nothing
    that would kill it."""
    sglang = SglangStandIn(tiny_path, [LONG], token_delay_s=0.01)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    with sglang.served() as url:
        disk = DiskEngine(url, tmp_path / "weights", model.save_pretrained, idle_s=0.3)
        leave_a_stream(url)
        with pytest.raises(EngineBusy, match=f"{url} still runs 1 and holds 0 waiting request"):
            disk.sleep()
        disk.close()
    assert sglang.died is None and "/release_memory_occupation" not in sglang.log.paths()


def sglang_stand_in(accept: bool = True) -> FastAPI:
    """sglang's `/update_weight_version` and `/model_info`; with `accept=False` the version never
    changes."""
    app = FastAPI()
    state = {"weight_version": "default"}

    @app.post("/update_weight_version")
    async def update(body: dict[str, Any]) -> dict[str, Any]:
        assert body["abort_all_requests"] is False  # the gateway has drained: nothing to abort
        if accept:
            state["weight_version"] = body["new_version"]
        return {"success": True, "message": "ok", "new_version": body["new_version"]}

    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": "/m", "weight_version": state["weight_version"]}

    return app


def test_sglangs_weight_version_is_set_after_each_load_and_checked() -> None:
    with serve(sglang_stand_in()) as url, httpx.Client() as client:
        set_weight_version(client, url, 7)
        assert client.get(url + "/model_info").json()["weight_version"] == "7"
    refused = pytest.raises(
        EngineCallError, match="reports weight version 'default' after loading 7"
    )
    with serve(sglang_stand_in(accept=False)) as url, httpx.Client() as client, refused:
        set_weight_version(client, url, 7)


def model_info_client(status: int = 200) -> tuple[httpx.Client, list[str]]:
    """A client whose engine answers `/model_info` with `status` (serving `/served/model` on a
    200), and the URLs it was asked for."""
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return httpx.Response(status, json={"model_path": "/served/model"})

    return httpx.Client(transport=httpx.MockTransport(answer)), asked


@pytest.mark.parametrize("configured", ["", "~/models/deepseek-llm-7b-chat"])
def test_a_config_that_names_no_model_trains_the_one_the_engine_serves(configured: str) -> None:
    client, asked = model_info_client()
    with client:
        assert base_model_path(configured, "http://engine/", client) == "/served/model"
    assert asked == ["http://engine/model_info"]


def test_the_configs_model_stands_and_a_known_base_model_is_not_asked_for_again() -> None:
    client, asked = model_info_client()
    with client:
        assert base_model_path("/my/model", "http://engine", client) is None
        assert base_model_path("", "", client) is None  # no engine to ask
        assert base_model_path("", "http://engine", client, known="/first/model") == "/first/model"
        # a model the config names stands, even over one known
        assert base_model_path("/my/model", "http://engine", client, known="/first") is None
    assert asked == []


def test_an_engine_that_does_not_answer_model_info_raises() -> None:
    client, _ = model_info_client(status=503)
    with client, pytest.raises(httpx.HTTPStatusError):
        base_model_path("", "http://engine", client)
