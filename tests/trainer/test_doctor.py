"""`agl doctor`: each check's logic on plain data, and the whole preflight on the CPU path.

sglang and GPUs cannot run here. The end-to-end tests run `agl doctor` with `trainer.device=cpu`:
the real backend (Ray, verl's worker group on verl's `cpu` platform) against a scripted sglang
stand-in serving the tiny model (tests/sglang.py); a stand-in broken in one way shows the doctor
stopping at that check. On cuda, this GPU-less machine must be told so before Ray starts.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tests.sglang import SglangStandIn
from trainer import doctor
from trainer.config import load_config
from trainer.doctor import checkup
from trainer.doctor.install import (
    agl_requirements,
    check_cuda,
    check_versions,
    extra_for,
    pins,
    pip_spec,
)
from trainer.doctor.probes import SAMPLING
from trainer.doctor.replies import (
    MalformedReply,
    check_cadence,
    check_context,
    parse_generation,
    parse_stream,
    stream_cadence,
)
from trainer.doctor.report import CheckFailed, Result, attempt, table

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "calculator" / "train.yaml"
GPU = ROOT / "examples" / "gpu" / "qwen3.5-9b-8gpu.yaml"
REQUIRES = [  # as importlib.metadata.requires("agl") lists them
    "numpy>=1.26",
    "psycopg[binary]>=3.2",
    'torch==2.13.0; extra == "train"',
    'torch==2.11.0; extra == "gpu"',
    'sglang==0.5.13; extra == "gpu"',
    'pytest>=8; extra == "dev"',
]


# ------------------------------------------------------------------ versions


def test_pins_are_agls_own_and_the_extras() -> None:
    assert [str(r) for r in pins("gpu", REQUIRES)] == [
        "numpy>=1.26",
        "psycopg[binary]>=3.2",
        'torch==2.11.0; extra == "gpu"',
        'sglang==0.5.13; extra == "gpu"',
    ]
    assert [r.name for r in pins("train", REQUIRES)] == ["numpy", "psycopg", "torch"]


def test_versions_hold_with_a_local_build_label() -> None:
    have = {"numpy": "2.1.0", "psycopg": "3.2.1", "torch": "2.13.0+cpu"}
    assert check_versions("train", pins("train", REQUIRES), have.get) == (
        "3 requirements of agl[train] hold"
    )


def test_a_different_or_missing_pin_fails_with_the_pip_command() -> None:
    have = {"numpy": "2.1.0", "psycopg": "3.1.0", "torch": "2.13.0+cpu"}
    with pytest.raises(CheckFailed) as failed:
        check_versions("gpu", pins("gpu", REQUIRES), have.get)
    assert failed.value.detail == (
        "psycopg 3.1.0 (want >=3.2), torch 2.13.0+cpu (want ==2.11.0), "
        "sglang missing (want ==0.5.13)"
    )
    assert failed.value.fix == (
        "Install the pinned versions: pip install --no-build-isolation "
        "'psycopg[binary]>=3.2' 'torch==2.11.0' 'sglang==0.5.13'"
    )
    assert pip_spec(pins("gpu", REQUIRES)[2]) == "torch==2.11.0"  # no marker


def test_this_machines_install_holds_the_train_extras_pins() -> None:
    extra = extra_for("cpu")
    assert "agl[train] hold" in check_versions(extra, pins(extra, agl_requirements()))


# ------------------------------------------------------------------ cuda, context, replies


def test_cuda_needs_a_device_and_enough_of_them() -> None:
    with pytest.raises(CheckFailed, match="no CUDA device visible: this machine cannot run"):
        check_cuda(False, 0, 8)
    with pytest.raises(CheckFailed) as fewer:
        check_cuda(True, 4, 8)
    assert "trainer.n_gpus_per_node=4" in fewer.value.fix
    assert check_cuda(True, 8, 8) == "8 CUDA devices visible, 8 used"


def test_context_must_be_the_configured_one() -> None:
    served = {"http://a": 32768, "http://b": 32768}
    assert check_context(served, None, "cuda") == (
        "2 engine(s), max_model_len 32768 (the config sets none)"
    )
    assert check_context(served, 32768, "cuda").endswith("as configured")
    with pytest.raises(CheckFailed) as gpu:
        check_context({"http://a": 4096}, 32768, "cuda")
    assert gpu.value.detail == (
        "http://a serves max_model_len 4096, actor_rollout_ref.rollout.max_model_len is 32768"
    )
    assert "engine_kwargs.sglang.context_length" in gpu.value.fix
    with pytest.raises(CheckFailed) as cpu:
        check_context({"http://a": 4096}, 32768, "cpu")
    assert "max_model_len=4096" in cpu.value.fix


def reply(ids: list[int], logprobs: list[float], finish: Any = None) -> dict[str, Any]:
    """A /generate reply as sglang sends it with `skip_tokenizer_init`."""
    meta = {
        "finish_reason": finish or {"type": "stop", "matched": 7},
        "output_token_logprobs": [[x, t, None] for x, t in zip(logprobs, ids, strict=True)],
    }
    return {"output_ids": ids, "meta_info": meta}


def test_a_generate_reply_as_the_gateway_records_it() -> None:
    sampled = parse_generation(reply([5, 6, 7], [-0.1, -2.0, 0.0], {"type": "length"}))
    assert sampled.output_ids == [5, 6, 7]
    assert sampled.logprobs == [-0.1, -2.0, 0.0]
    assert sampled.finish == "length"
    assert parse_generation(reply([5], [-0.1], "stop")).finish == "stop"  # a plain string too


@pytest.mark.parametrize(
    "broken, problem",
    [
        (reply([], []), "output_ids is empty"),
        ({**reply([5, 6], [-0.1, -0.2]), "output_ids": [5, 9]}, "differ from output_ids"),
        (reply([5, 6], [-0.1, 0.3]), "finite and <= 0"),
        (reply([5, 6], [-0.1, math.nan]), "finite and <= 0"),
        (reply([5, 6], [-0.1, -0.2], {"type": "abort"}), "'abort', not stop or length"),
        ({"output_ids": [5], "meta_info": {"finish_reason": "stop"}}, "not a reply with logprobs"),
        ({"error": {"message": "too long"}}, "not a reply with logprobs"),
    ],
)
def test_a_broken_generate_reply_says_what_is_wrong(broken: Any, problem: str) -> None:
    with pytest.raises(MalformedReply, match=problem):
        parse_generation(broken)


EVIDENCE = json.loads((ROOT / "tests" / "evidence" / "sglang-0.5.13.json").read_text())


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_the_cadence_is_the_one_sglang_streamed_on_an_h200(mode: str) -> None:
    """20 tokens: a chunk per token at `stream_interval` 1; 1, 8, 8 and 3 at 8."""
    real = EVIDENCE[mode]
    lengths = real["stream_output_ids_lens"]
    interval = real["server_args"]["stream_interval"]
    counts = lengths if mode == "cumulative" else list(itertools.accumulate(lengths))
    assert stream_cadence(20, interval) == counts
    assert check_cadence(counts, interval).startswith(f"chunks at {counts} tokens")


def test_another_cadence_fails_with_where_verl_takes_it() -> None:
    with pytest.raises(CheckFailed) as e:
        check_cadence(list(range(1, 21)), 8)
    assert "stream_interval 8 sends them at [1, 9, 17, 20]" in e.value.detail
    assert "engine_kwargs.sglang" in e.value.fix


def test_a_stream_is_read_as_the_gateway_reads_it() -> None:
    """Cumulative or incremental alike: the tokens so far, and the last chunk's finish reason."""
    pair = [-0.5, 7, None]
    chunks = [
        {
            "output_ids": [7],
            "meta_info": {
                "completion_tokens": 1,
                "finish_reason": None,
                "output_token_logprobs": [pair],
            },
        },
        {
            "output_ids": [7, 7],
            "meta_info": {
                "completion_tokens": 2,
                "finish_reason": {"type": "length"},
                "output_token_logprobs": [pair, pair],
            },
        },
    ]
    assert parse_stream(chunks) == ([1, 2], "length")
    with pytest.raises(MalformedReply, match="logprob ids"):
        parse_stream([{**chunks[0], "output_ids": [8]}])


def test_the_table_gives_the_first_failures_fix() -> None:
    results = [
        Result(check="versions", status="ok", detail="3 requirements of agl[gpu] hold"),
        Result(check="cuda", status="FAIL", detail="no CUDA device visible", fix="Go to the GPUs."),
        Result(check="backend", status="not run", detail="an earlier check failed"),
    ]
    assert table(results).splitlines() == [
        "check        result   detail",
        "versions     ok       3 requirements of agl[gpu] hold",
        "cuda         FAIL     no CUDA device visible",
        "backend      not run  an earlier check failed",
        "",
        "fix (cuda): Go to the GPUs.",
    ]


# ------------------------------------------------------------------ the command


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_on_a_machine_without_gpus_stops_before_ray(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The GPU config's pins cannot hold here: the versions check is given pins that do."""
    monkeypatch.setattr(checkup, "agl_requirements", lambda: ['torch>=2; extra == "gpu"'])
    started = []

    def start(self: doctor.Doctor) -> str:
        started.append(self)
        return "started"

    monkeypatch.setattr(doctor.Doctor, "start", start)
    code = doctor.main([str(GPU), "agl.admin_key=k", f"trainer.default_local_dir={tmp_path}"])
    rows = printed_table(capsys.readouterr().out)
    assert code == 1
    assert started == []
    assert rows[1].split() == ["versions", "ok", "1", "requirements", "of", "agl[gpu]", "hold"]
    assert rows[2].startswith("cuda         FAIL     no CUDA device visible: this machine cannot")
    assert "run agl doctor on the GPU node" in rows[2]
    assert rows[3].startswith("backend      not run")
    assert rows[-1].startswith("fix (cuda): Run agl doctor on the GPU node")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_skip_versions_skips_only_the_versions_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Pins that cannot hold here are not read: the cuda check still runs, and fails."""
    monkeypatch.setattr(checkup, "agl_requirements", lambda: ['no-such-package==1; extra == "gpu"'])
    args = ["--skip-versions", str(GPU), "agl.admin_key=k", f"trainer.default_local_dir={tmp_path}"]
    code = doctor.main(args)
    rows = printed_table(capsys.readouterr().out)
    assert code == 1
    assert rows[1].split() == ["versions", "skipped", "--skip-versions"]
    assert rows[2].startswith("cuda         FAIL     no CUDA device visible")


def printed_table(out: str) -> list[str]:
    """The table's lines, after what Ray's workers printed on the same stdout."""
    lines = out.splitlines()
    return lines[lines.index("check        result   detail") :]


def run_doctor(url: str, model: Path, out: Path, *overrides: str) -> int:
    common = [
        "agl.admin_key=k",
        f"agl.engine={url}",
        "agl.threads=1",
        f"trainer.default_local_dir={out}",
        f"actor_rollout_ref.model.path={model}",
    ]
    return doctor.main([str(DEMO), *common, *overrides])


@pytest.mark.slow
def test_every_check_passes_on_the_cpu_path_and_the_engine_is_left_as_it_was(
    tiny_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sglang = SglangStandIn(
        tiny_path, ["Hello there, friend."], context_len=2048, token_delay_s=0.002
    )
    with sglang.served() as url:
        max_len = "actor_rollout_ref.rollout.max_model_len=2048"
        code = run_doctor(url, tiny_path, tmp_path / "out", max_len)
    rows = printed_table(capsys.readouterr().out)
    print("\n".join(rows))  # for whoever reads the test's output
    out = "\n".join(rows)
    assert code == 0
    assert [(row[:11].strip(), row[13:20].strip()) for row in rows[1:]] == [
        ("versions", "ok"),
        ("cuda", "skipped"),
        ("backend", "ok"),
        ("v1/models", "ok"),
        ("generate", "ok"),
        ("stream", "ok"),
        ("left stream", "ok"),
        ("weight push", "ok"),
    ]
    assert rows[-1].startswith("weight push  ok       sleep, push, wake in")
    assert "1 engine(s), max_model_len 2048 as configured" in out
    assert "/server_info" not in sglang.log.paths()
    assert sglang.log.loaded_while_released == []
    generated = [body for path, body in sglang.log.requests if path == "/generate"]
    unstreamed = [body for body in generated if not body.get("stream")]
    streamed = [body for body in generated if body.get("stream")]
    assert len(unstreamed) == 3  # check 5, after the left stream's wake, after the push
    assert unstreamed[0]["sampling_params"] == SAMPLING
    assert unstreamed[0]["return_logprob"] is True
    # 20 tokens; one aborted by its rid; one left (its 2,000 tokens outlast sglang's 2 s)
    assert [body["sampling_params"]["max_new_tokens"] for body in streamed[:1]] == [20]
    assert all(body["sampling_params"]["max_new_tokens"] > 2000 for body in streamed[1:])
    aborted = [body["rid"] for path, body in sglang.log.requests if path == "/abort_request"]
    assert aborted == [streamed[1]["rid"]] and streamed[2]["rid"] in sglang.aborted
    left = next(row for row in rows if row.startswith("left stream"))
    waited = float(left.split("the sleep waited ")[1].split(" s")[0])
    assert 1.5 <= waited < 10 and sglang.died is None
    # the engine serves the weights and version it served before, and the pushed weights are gone
    assert (sglang.model_path, sglang.weight_version) == (str(tiny_path), "default")
    assert not (tmp_path / "out").exists()  # the doctor's folder, and the one it made for it


def test_a_context_other_than_the_configured_one_fails_the_models_check(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    """The check against a stand-in serving 4096 tokens, behind a backend that started nothing."""
    sglang = SglangStandIn(tiny_path, context_len=4096)
    with sglang.served() as url:
        overrides = [
            "agl.admin_key=k",
            f"agl.engine={url}",
            f"trainer.default_local_dir={tmp_path}",
            "actor_rollout_ref.rollout.max_model_len=2048",
        ]
        preflight = doctor.Doctor(*load_config(DEMO, overrides))
        preflight.backend = SimpleNamespace(engine=SimpleNamespace(endpoints=lambda: [url]))
        result = attempt("v1/models", preflight.models)
        preflight.backend = None
        preflight.close()
    assert result.status == "FAIL"
    assert result.detail == (
        f"{url} serves max_model_len 4096, actor_rollout_ref.rollout.max_model_len is 2048"
    )
    assert result.fix == "Set actor_rollout_ref.rollout.max_model_len=4096, what agl.engine serves."
    assert sglang.log.paths() == ["/v1/models"]


class WrongLogprobIds(SglangStandIn):
    """Answers /generate with logprobs whose token ids are not the output's."""

    async def generate(self, body: dict[str, Any], request: Request) -> Response:
        answer = await super().generate(body, request)
        data = json.loads(bytes(answer.body))
        for pair in data["meta_info"]["output_token_logprobs"]:
            pair[1] += 1
        return JSONResponse(data)


@pytest.mark.slow
def test_a_broken_generate_reply_stops_the_doctor_with_its_fix(
    tiny_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import ray

    sglang = WrongLogprobIds(tiny_path, ["Hello."])
    with sglang.served() as url:
        code = run_doctor(url, tiny_path, tmp_path)
    rows = printed_table(capsys.readouterr().out)
    print("\n".join(rows))
    assert code == 1
    assert rows[4].startswith("v1/models    ok       1 engine(s), max_model_len 2048 (the config")
    assert rows[5].startswith(f"generate     FAIL     {url}/generate: output_token_logprobs' ids")
    assert rows[6].startswith("stream       not run")
    assert rows[8].startswith("weight push  not run")
    assert rows[-1].startswith("fix (generate): The engine must answer as sglang 0.5.13 does")
    assert not ray.is_initialized()
    assert "/release_memory_occupation" not in sglang.log.paths()
