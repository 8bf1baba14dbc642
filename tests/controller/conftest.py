"""Fixtures for the controller's tests: a real gateway stack, a controller in a thread, harness scripts."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agl.client import GatewayClient
from controller.launcher import Launcher, LocalLauncher
from controller.loop import Controller, ControllerSettings
from controller.spec import Spec, parse_spec
from tests.gateway.stack import ADMIN, Stack, stack

TERMINAL = {"succeeded", "failed", "timed_out", "cancelled"}

# A harness: its environment saved, one model call with the injected OpenAI settings, an optional
# sleep (HARNESS_SLEEP_<attempt>), a reward
# posted with the agent token (the status code of that post is saved too), then HARNESS_EXIT.
HARNESS = """
import json, os, sys, time, httpx
from openai import OpenAI
out = os.environ["HARNESS_OUT"] + "." + os.environ["AGL_ATTEMPT"]
json.dump(dict(os.environ), open(out + ".env", "w"))
print("harness says hello", flush=True)
messages = [{"role": "user", "content": "hi"}]
reply = OpenAI().chat.completions.create(model="agl", messages=messages, max_tokens=4)
open("answer.txt", "w").write(reply.choices[0].message.content or "-")
open(out + ".called", "w").write("1")
time.sleep(float(os.environ.get("HARNESS_SLEEP_" + os.environ["AGL_ATTEMPT"], "0")))
url = os.environ["AGL_GATEWAY_URL"] + "/api/rollouts/" + os.environ["AGL_ROLLOUT_ID"] + "/reward"
auth = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
r = httpx.post(url, json={"reward": 1.0}, headers=auth)
open(out + ".reward", "w").write(str(r.status_code))
sys.exit(int(os.environ.get("HARNESS_EXIT", "0")))
"""

GRADER = """
import json, os, httpx
json.dump(dict(os.environ), open(os.environ["GRADER_OUT"], "w"))
answer = open("answer.txt").read()
url = os.environ["AGL_GATEWAY_URL"] + "/api/rollouts/" + os.environ["AGL_ROLLOUT_ID"] + "/reward"
auth = {"Authorization": "Bearer " + os.environ["AGL_GRADER_TOKEN"]}
r = httpx.post(url, json={"reward": 0.5, "source": "grader"}, headers=auth)
r.raise_for_status()
"""


@pytest.fixture
def gateway(tiny_path: Path, tmp_path: Path) -> Iterator[Stack]:
    with stack(tiny_path, tmp_path) as s:
        yield s


def script(tmp_path: Path, name: str, text: str) -> list[str]:
    path = tmp_path / name
    path.write_text(text)
    return [sys.executable, str(path)]


def harness_spec(tmp_path: Path, **harness: Any) -> dict:
    env = {"HARNESS_OUT": str(tmp_path / "harness")} | harness.pop("env", {})
    return {"harness": {"command": script(tmp_path, "harness.py", HARNESS), "env": env, **harness}}


def settings(gateway: Stack, tmp_path: Path, **fields: Any) -> ControllerSettings:
    return ControllerSettings(
        gateway=gateway.url,
        admin_key=ADMIN,
        state_dir=str(tmp_path / "state"),
        poll_s=0.1,
        **fields,
    )


@contextmanager
def controller(
    gateway: Stack,
    tmp_path: Path,
    spec: dict | Spec | None,
    runner: Launcher | None = None,
    **fields: Any,
) -> Iterator[Controller]:
    """A controller running in a thread with its own event loop; stopped (runs left alive) on exit."""
    cfg = settings(gateway, tmp_path, **fields)
    parsed = parse_spec(spec) if isinstance(spec, dict) else spec
    launcher = runner or LocalLauncher(tmp_path / "state")
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        box["loop"] = asyncio.get_running_loop()
        box["stop"] = asyncio.Event()
        async with GatewayClient(cfg.gateway, cfg.admin_key) as gw:
            box["controller"] = Controller(gw, launcher, parsed, cfg)
            ready.set()
            await box["controller"].run(box["stop"])

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001  (surfaced by the test below)
            box["error"] = e
            ready.set()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    ready.wait(30)
    try:
        assert "error" not in box, box.get("error")
        yield box["controller"]
    finally:
        if thread.is_alive():
            box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)
    assert "error" not in box, repr(box.get("error"))


def wait_status(
    gateway: Stack, rollout_id: str, want: set[str] = TERMINAL, timeout: float = 60
) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        rollout = gateway.admin.get(f"/api/rollouts/{rollout_id}").json()
        if rollout["status"] in want:
            return rollout
        assert time.monotonic() < deadline, f"rollout stayed {rollout['status']}: {rollout}"
        time.sleep(0.1)


def reasons(gateway: Stack, rollout_id: str) -> list[str]:
    events = gateway.admin.get(f"/api/rollouts/{rollout_id}/events").json()
    return [json.dumps(e["data"]) for e in events if e["kind"] == "lifecycle"]
