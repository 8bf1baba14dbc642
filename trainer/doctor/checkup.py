"""The eight checks against one composed config, in order: what starts the stack and probes it.

- Owns `Doctor`: each check as a method, the state the checks share (the backend, the prompt, the
  shortest context served, whether the engines sleep), and the shutdown that leaves nothing
  behind: the backend and Ray down, the pushed weights removed, on cpu `agl.engine` given back the
  weights and version it served.
- Judges nothing on plain data itself (`install`, `replies`), sends no request of its own making
  (`probes`), and neither names the checks nor prints their table (`report`).
"""

import contextlib
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import uuid4

import httpx
from omegaconf import DictConfig

from trainer.config import AglConfig
from trainer.doctor.install import agl_requirements, check_cuda, check_versions, extra_for, pins
from trainer.doctor.probes import (
    LEFT_AFTER,
    LONG_TOKENS,
    SAMPLING,
    abort_one,
    generate_one,
    get_json,
    leave,
    prompt_ids,
    read_stream,
    streamed,
)
from trainer.doctor.replies import check_cadence, check_context, parse_stream, served_context
from trainer.doctor.report import (
    CHECKS,
    FAIL,
    FIXES,
    NOT_RUN,
    CheckFailed,
    Result,
    Skipped,
    attempt,
)
from trainer.engines import base_model_path, engine_http

if TYPE_CHECKING:
    from trainer.backend import Backend

log = logging.getLogger(__name__)

PUSHED_VERSION = 1


class Doctor:
    """The eight checks against one composed config; `run` runs them in order, then shuts down.
    The config's `trainer.default_local_dir` becomes its `doctor` folder (the pushed weights)."""

    def __init__(self, cfg: DictConfig, agl: AglConfig, skip_versions: bool = False) -> None:
        self.cfg = cfg
        self.agl = agl
        self.skip_versions = skip_versions
        self.device = str(cfg.trainer.device)
        self.workdir = Path(cfg.trainer.default_local_dir) / "doctor"
        self.made_parent = not self.workdir.parent.exists()  # then removed too, if left empty
        cfg.trainer.default_local_dir = str(self.workdir)
        self.http = engine_http(120)
        self.backend: Backend | None = None
        self.ray_started = False
        self.prompt_ids: list[int] | None = None  # `prompt()`'s
        self.context = 0  # the shortest context an engine serves (check 4)
        self.asleep = False  # between a check's sleep and its wake
        self.served: dict[str, Any] | None = None  # cpu: what agl.engine served before the push

    def run(self) -> list[Result]:
        """Each check's row, in order; after a failure, the rest are not run."""
        checks = [
            self.versions,
            self.cuda,
            self.start,
            self.models,
            self.generate,
            self.stream,
            self.leave_then_sleep,
            self.push,
        ]
        results: list[Result] = []
        try:
            for name, check in zip(CHECKS, checks, strict=True):
                results.append(attempt(name, check))
                log.info("doctor: %s: %s %s", name, results[-1].status, results[-1].detail)
                if results[-1].status == FAIL:
                    break
        finally:
            self.close()
        for name in CHECKS[len(results) :]:
            results.append(Result(check=name, status=NOT_RUN, detail="an earlier check failed"))
        return results

    def versions(self) -> str:
        """Check 1: the installed versions hold agl's pins for the device (unless skipped)."""
        if self.skip_versions:
            raise Skipped("--skip-versions")
        extra = extra_for(self.device)
        return check_versions(extra, pins(extra, agl_requirements()))

    def cuda(self) -> str:
        """Check 2: CUDA sees the GPUs the config asks for (skipped on cpu)."""
        if self.device == "cpu":
            raise Skipped("trainer.device=cpu")
        import torch

        wanted = int(self.cfg.trainer.n_gpus_per_node)
        return check_cuda(torch.cuda.is_available(), torch.cuda.device_count(), wanted)

    def start(self) -> str:
        """Check 3: the backend, as `agl train` starts it: Ray, verl's workers, on cuda its sglang
        servers."""
        from trainer.backend import Backend  # verl, Ray, torch: only once the cheap checks pass

        model = self.model_path()
        started = time.monotonic()
        self.ray_started = True
        self.backend = Backend(self.cfg, self.agl)
        took = time.monotonic() - started
        engines = self.backend.engine.endpoints()
        serving = (
            f"the engine at {engines[0]}"
            if self.device == "cpu"
            else f"{len(engines)} sglang server(s)"
        )
        ranks = self.backend.dp_size
        return f"verl's worker group ({ranks} rank(s)) and {serving} in {took:.0f} s; model {model}"

    def model_path(self) -> str:
        """The actor's model as `agl train` picks it: the config's, else what `agl.engine`
        serves."""
        model = self.cfg.actor_rollout_ref.model
        configured = str(model.get("path") or "")
        engine = self.agl.engine
        try:
            served = base_model_path(configured, engine, self.http)
        except httpx.HTTPStatusError as e:
            reply = e.response
            detail = f"{engine}/model_info: {reply.status_code} {reply.text[:200]}"
            raise CheckFailed(detail, FIXES["backend"]) from e
        except httpx.HTTPError as e:
            fix = "Start the engine (agl engine), or set agl.engine to its URL."
            raise CheckFailed(f"agl.engine {engine} does not answer: {e}", fix) from e
        if served is None:
            return configured
        model.path = served
        return served

    def endpoints(self) -> list[str]:
        """The backend's engines' URLs, without a trailing slash."""
        assert self.backend is not None
        return [url.rstrip("/") for url in self.backend.engine.endpoints()]

    def models(self) -> str:
        """Check 4: each engine's `/v1/models` serves the context the config names."""
        served = {}
        for url in self.endpoints():
            served[url] = served_context(get_json(self.http, url, "/v1/models", "v1/models"))
        self.context = min(served.values())
        configured = self.cfg.actor_rollout_ref.rollout.get("max_model_len")
        if configured is not None:
            configured = int(configured)
        return check_context(served, configured, self.device)

    def prompt(self) -> list[int]:
        """A chat prompt the model's tokenizer made, as the gateway sends one (made once)."""
        if self.prompt_ids is None:
            from transformers import AutoTokenizer

            model = self.cfg.actor_rollout_ref.model
            tokenizer = AutoTokenizer.from_pretrained(
                model.get("tokenizer_path") or model.path,
                trust_remote_code=bool(model.get("trust_remote_code", False)),
            )
            self.prompt_ids = prompt_ids(tokenizer)
        return self.prompt_ids

    def generate(self) -> str:
        """Check 5: one `/generate` with logprobs on each engine, of a chat prompt the model's
        tokenizer made."""
        body = {"input_ids": self.prompt(), "sampling_params": SAMPLING, "return_logprob": True}
        sampled = [generate_one(self.http, url, body) for url in self.endpoints()]
        tokens = "/".join(sorted({str(len(s.output_ids)) for s in sampled}))
        finishes = "/".join(sorted({s.finish for s in sampled}))
        logprobs = [x for s in sampled for x in s.logprobs]
        return (
            f"{len(sampled)} engine(s): {tokens} tokens, logprobs {min(logprobs):.2f} to "
            f"{max(logprobs):.2f}, finish {finishes}"
        )

    def stream(self) -> str:
        """Check 6: on each engine, a streamed `/generate` of 20 tokens whose chunks add up, at
        the cadence the config gives sglang (`engine_kwargs.sglang.stream_interval`; on cpu the
        engine's own); then `/abort_request` ends a long stream by its rid, and the engine is idle
        at once, as when the gateway leaves a stream."""
        interval = int(self.engine_kwargs().get("stream_interval") or 1)
        details = []
        for url in self.endpoints():
            body = streamed(self.prompt(), 20, uuid4().hex)
            counts, finish = parse_stream(read_stream(self.http, url, body))
            if finish != "length" or counts[-1] != 20:
                raise CheckFailed(f"{url}: {counts[-1]} tokens, finish {finish}", FIXES["stream"])
            detail = f"chunks at {counts} tokens"
            if self.device != "cpu":
                detail = check_cadence(counts, interval)
            details.append(detail)
            abort_one(self.http, url, self.long_stream())
        return f"{'; '.join(sorted(set(details)))}; an abort by rid ended a stream at once"

    def leave_then_sleep(self) -> str:
        """Check 7: the sequence that killed sglang on an H200: a stream left without an abort,
        then the trainer's sleep. The sleep waits until every engine is idle (sglang aborts a
        gone client 2 s later, and dies if its memory is released before); then the wake, and
        `/generate` still answers."""
        assert self.backend is not None
        engine = self.backend.engine
        for url in self.endpoints():
            leave(self.http, url, self.long_stream())
        started = time.monotonic()
        self.asleep = True
        engine.sleep()
        waited = time.monotonic() - started
        engine.wake()
        self.asleep = False
        self.generate()
        return (
            f"streams left after {LEFT_AFTER} chunks; the sleep waited {waited:.1f} s for the "
            "engines to be idle; awake, /generate works"
        )

    def long_stream(self) -> dict[str, Any]:
        """A long streamed `/generate` body with a fresh rid: `LONG_TOKENS` tokens, as far as the
        context has room."""
        tokens = min(LONG_TOKENS, self.context - len(self.prompt()) - 8)
        return streamed(self.prompt(), tokens, uuid4().hex)

    def engine_kwargs(self) -> dict[str, Any]:
        """What the config passes to sglang's server (`engine_kwargs.sglang`)."""
        rollout = self.cfg.actor_rollout_ref.rollout
        kwargs = rollout.get("engine_kwargs") or {}
        return dict(kwargs.get("sglang") or {})

    def push(self) -> str:
        """Check 8: the trainer's weights to every engine (sleep, push, wake), as after each
        update."""
        assert self.backend is not None
        engine = self.backend.engine
        if self.device == "cpu":
            self.served = get_json(self.http, self.agl.engine, "/model_info", "weight push")
        started = time.monotonic()
        self.asleep = True
        engine.sleep()
        engine.push(None, PUSHED_VERSION)
        engine.wake()
        self.asleep = False
        took = time.monotonic() - started
        for url in self.endpoints():
            served = get_json(self.http, url, "/model_info", "weight push").get("weight_version")
            if served != str(PUSHED_VERSION):
                detail = f"{url} reports weight_version {served!r} after pushing {PUSHED_VERSION}"
                raise CheckFailed(detail, FIXES["weight push"])
        self.generate()
        return (
            f"sleep, push, wake in {took:.1f} s; weight_version {PUSHED_VERSION} on every engine; "
            "/generate works after it"
        )

    def close(self) -> None:
        """`agl.engine` as it was (cpu); the backend and Ray down; the pushed weights removed."""
        self.restore_engine()
        if self.backend is not None:
            self.backend.close()
        elif self.ray_started:  # the backend failed after Ray started
            import ray

            ray.shutdown()
        self.http.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.made_parent:
            with contextlib.suppress(OSError):  # not empty, or never made
                self.workdir.parent.rmdir()

    def restore_engine(self) -> None:
        """cpu: `agl.engine` awake and serving the weights and version it served before the push."""
        if self.served is None:
            return
        url = self.agl.engine.rstrip("/")
        body = {
            "model_path": self.served["model_path"],
            "weight_version": str(self.served["weight_version"]),
        }
        try:
            if self.asleep:
                self.http.post(url + "/resume_memory_occupation").raise_for_status()
            self.http.post(url + "/update_weights_from_disk", json=body).raise_for_status()
        except httpx.HTTPError as e:
            log.warning("%s could not load %s back: %s", url, body["model_path"], e)
