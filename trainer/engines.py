"""The rollout engines a backend drives around each update: sleep, push the new weights, wake.

- `DiskEngine` loads weights from disk over sglang's HTTP API (`agl engine`'s embedded engine, or
  an sglang server of its own): the CPU backends use it.
- `Collocated` is verl's hybrid-engine sglang replicas on the trainer's GPUs, whose weights move
  in GPU memory.
- Both wait until their engines are idle (`wait_idle`) before they sleep and before they push
  weights: sglang asserts it, and its scheduler dies otherwise.
- `base_model_path` reads which model an engine serves, for a config that names none.
Neither engine trains anything or knows the trainer's loop.
"""

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from omegaconf import DictConfig

PLACEHOLDER = "~/models"  # verl's default `actor_rollout_ref.model.path` lies under it


def engine_http(timeout_s: float) -> httpx.Client:
    """A client for the embedded engine, with its key (`AGL_ENGINE_API_KEY`, as the engine reads
    it) if it has one."""
    key = os.environ.get("AGL_ENGINE_API_KEY")
    headers: dict[str, str] | None = None
    if key:
        headers = {"Authorization": f"Bearer {key}"}
    return httpx.Client(timeout=timeout_s, headers=headers)


def base_model_path(
    configured: str, engine: str, http: httpx.Client, *, known: str = ""
) -> str | None:
    """The model a run trains from when its config names none (`configured` empty, or verl's
    placeholder under `~/models`) and `engine` is set: `known` if given (what the engine served
    when the run began: a restarted run's engine serves trained weights), else the model the
    engine serves now, from its `/model_info`. None when the config's model stands. Raises
    `httpx.HTTPError` when the engine does not answer with a 200."""
    if not engine or (configured and not configured.startswith(PLACEHOLDER)):
        return None
    if known:
        return known
    reply = http.get(engine.rstrip("/") + "/model_info")
    reply.raise_for_status()
    return str(reply.json()["model_path"])


class EngineCallError(RuntimeError):
    """An engine refused a memory or weight command."""


class EngineBusy(EngineCallError):
    """An engine still ran requests when it had to be idle: before sleep or a weight push."""


def wait_idle(
    client: httpx.Client, urls: list[str], timeout_s: float, poll_s: float = 0.05
) -> None:
    """Returns once every engine at `urls` runs and holds no request (`GET /v1/loads`, each
    data-parallel rank's `num_running_reqs + num_waiting_reqs`). sglang releases memory and loads
    weights only when idle (managers/scheduler_components/weight_updater.py asserts it); the
    gateway, paused and drained, has aborted what it sent, but a request can outlive its call (a
    gateway that crashed mid-stream: sglang aborts it 2 s later). Raises `EngineBusy` past
    `timeout_s`, naming the engine and its requests."""
    deadline = time.monotonic() + timeout_s
    for url in urls:
        while (busy := _requests(client, url)) != (0, 0):
            if time.monotonic() > deadline:
                running, waiting = busy
                raise EngineBusy(
                    f"{url} still runs {running} and holds {waiting} waiting request(s) after "
                    f"{timeout_s:g} s; nothing may run while it sleeps or loads weights "
                    "(agl.idle_s bounds the wait)"
                )
            time.sleep(poll_s)


def _requests(client: httpx.Client, url: str) -> tuple[int, int]:
    """The requests an engine runs and holds waiting, over its data-parallel ranks."""
    reply = client.get(url + "/v1/loads")
    if reply.status_code != 200:
        raise EngineCallError(f"{url}/v1/loads: {reply.status_code} {reply.text[:300]}")
    loads = reply.json()["loads"]
    running = sum(int(load["num_running_reqs"]) for load in loads)
    waiting = sum(int(load["num_waiting_reqs"]) for load in loads)
    return running, waiting


def _post(client: httpx.Client, url: str, body: dict[str, Any] | None = None) -> None:
    """A command that succeeds with a 200, whose body is `{"success": true, ...}` or, for sglang's
    memory commands, `null` (sglang/srt/entrypoints/http_server.py: those routes return nothing)."""
    reply = client.post(url, json=body or {})
    try:
        answer = reply.json()
    except ValueError:  # not JSON: only the status tells
        answer = None
    refused = isinstance(answer, dict) and answer.get("success") is False
    if reply.status_code != 200 or refused:
        raise EngineCallError(f"{url}: {reply.status_code} {reply.text[:300]}")


def set_weight_version(client: httpx.Client, url: str, version: int) -> None:
    """Tell an sglang server which version its weights are, and check that it says so."""
    _post(
        client,
        url + "/update_weight_version",
        {"new_version": str(version), "abort_all_requests": False},
    )
    served = client.get(url + "/model_info").json().get("weight_version")
    if served != str(version):
        raise EngineCallError(f"{url} reports weight version {served!r} after loading {version}")


class DiskEngine:
    """One engine at `url` that loads pushed weights from a Hugging Face folder. A push without a
    checkpoint has `save` write them to `weights_dir/v{version}/model`, keeping the previous
    version's (maybe loading).

    The weights load on `wake`, after the engine's memory is back: sglang loads
    `/update_weights_from_disk` at once, even while its memory is released
    (sglang/srt/managers/tokenizer_manager.py). Sleep and the load each wait up to `idle_s` for
    the engine to be idle (`wait_idle`)."""

    def __init__(
        self, url: str, weights_dir: Path, save: Callable[[Path], None], idle_s: float = 30.0
    ) -> None:
        self.url = url.rstrip("/")
        self.weights = weights_dir
        self.save = save
        self.idle_s = idle_s
        self.http = engine_http(600)
        # the `/update_weights_from_disk` body `wake` sends
        self.pushed: dict[str, str] | None = None

    def endpoints(self) -> list[str]:
        """The URL the gateway sends this engine's calls to."""
        return [self.url]

    def sleep(self) -> None:
        """The engine's memory released (weights and KV cache) while the trainer updates, once it
        is idle."""
        wait_idle(self.http, [self.url], self.idle_s)
        _post(self.http, self.url + "/release_memory_occupation")

    def push(self, path: Path | None, version: int) -> None:
        """Serve the weights saved at `path/model` (else saved now) as `version`, from the next
        `wake`."""
        if path is None:
            path = self.weights / f"v{version}"
            self.save(path / "model")
            for old in self.weights.glob("v*"):
                if old != path and old.name != f"v{version - 1}":
                    shutil.rmtree(old, ignore_errors=True)
        self.pushed = {"model_path": str(path / "model"), "weight_version": str(version)}

    def wake(self) -> None:
        """Memory back, then the pushed weights loaded once the engine is idle."""
        _post(self.http, self.url + "/resume_memory_occupation")
        if self.pushed is not None:
            wait_idle(self.http, [self.url], self.idle_s)
            _post(self.http, self.url + "/update_weights_from_disk", self.pushed)
            self.pushed = None

    def close(self) -> None:
        """The HTTP client closed."""
        self.http.close()


class Collocated:
    """verl's sglang replicas in hybrid mode on the GPUs of worker group `wg` (docs/architecture.md,
    "Collocated async RL"). They start with dummy weights, so the first wake loads the actor's.
    Sleep frees weights and KV cache; wake is verl's `CheckpointEngineManager.update_weights`
    (resume, push in GPU memory, flush the cache, resume the KV cache), then setting the served
    weight version, which sglang leaves at its start-up one on in-memory pushes. Sleep and the
    push each wait up to `idle_s` for the replicas to be idle (`wait_idle`)."""

    def __init__(self, cfg: DictConfig, wg: Any, pool: Any, idle_s: float = 30.0) -> None:
        from verl.checkpoint_engine.base import CheckpointEngineManager
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.rollout.llm_server import LLMServerManager

        self.servers = LLMServerManager.create(
            config=cfg, worker_group=wg, rollout_resource_pool=pool
        )
        engine_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout.checkpoint_engine)
        engine_cfg.backend = "naive"  # collocated: weights move inside each GPU
        self.weights = CheckpointEngineManager(
            config=engine_cfg, actor_wg=wg, replicas=self.servers.get_replicas()
        )
        self.http = engine_http(600)
        self.idle_s = idle_s
        self.version = 0
        self.sleep()
        self.wake()

    def endpoints(self) -> list[str]:
        """The replicas' URLs, for the gateway."""
        return [a if a.startswith("http") else f"http://{a}" for a in self.servers.get_addresses()]

    def sleep(self) -> None:
        """The replicas' weights and KV cache freed for the update, once they are idle."""
        wait_idle(self.http, self.endpoints(), self.idle_s)
        self.weights.sleep_replicas()

    def push(self, path: Path | None, version: int) -> None:
        """Only remembered: the weights move (in GPU memory) on `wake`."""
        self.version = version

    def wake(self) -> None:
        """The actor's weights into the replicas once they are idle, and their version set."""
        wait_idle(self.http, self.endpoints(), self.idle_s)
        self.weights.update_weights(self.version)
        for url in self.endpoints():  # no request is in flight: the gateway is paused and drained
            set_weight_version(self.http, url, self.version)

    def close(self) -> None:
        """The HTTP client closed."""
        self.http.close()
