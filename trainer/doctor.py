"""`agl doctor CONFIG [key=value ...]`: a preflight of the training stack, before a long GPU run.

It takes the config and overrides `agl train` takes and runs eight checks in order, each relying
on the ones before, prints a table and, for the first failure, what to do; it stops there:
- versions: the installed versions against agl's pins (the `gpu` extra on `trainer.device: cuda`,
  `train` on `cpu`);
- cuda: CUDA sees the GPUs the config asks for;
- backend: it starts (Ray, verl's worker group and, on cuda, verl's sglang servers);
- v1/models: each engine serves the context the config names;
- generate: one `/generate` with logprobs comes back as the gateway records it;
- stream: a streamed `/generate` chunks at the cadence the config gives sglang (on cuda), and
  `/abort_request` ends another by its rid, as the gateway ends a stream it leaves;
- left stream: a stream left without an abort (a harness gone behind a gateway that
  crashed), then the trainer's sleep and wake: the sequence that killed sglang on an H200;
- weight push: one push through the trainer's own path (sleep, push, wake) reaches every engine.
`--skip-versions` skips the first check, for an install that leaves a pin out on purpose
(bench/gpu_kit's bundle, without flash-attn).

The checks are about the stack, not the model's size: a small model of the same architecture
family (`actor_rollout_ref.model.path=...`) checks a large run's stack in minutes. It never reads
`/server_info` (sglang answers 500 there on the servers verl launches). It trains nothing and
leaves nothing behind: the pushed weights go to `trainer.default_local_dir/doctor`, removed at the
end, and on `cpu` the engine at `agl.engine` is given back the weights and version it served.
"""

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import uuid4

import httpx
from omegaconf import DictConfig
from packaging.requirements import Requirement

from trainer.config import AglConfig, ConfigError, load_config
from trainer.engines import base_model_path, engine_http, wait_idle

if TYPE_CHECKING:
    from trainer.backend import Backend

log = logging.getLogger(__name__)

OK = "ok"
FAIL = "FAIL"
SKIPPED = "skipped"
NOT_RUN = "not run"
CHECKS = (
    "versions",
    "cuda",
    "backend",
    "v1/models",
    "generate",
    "stream",
    "left stream",
    "weight push",
)
SMALL_MODEL = (
    "The checks are about the stack, not the model's size: for a large model pass a small one of "
    "the same architecture family, e.g. actor_rollout_ref.model.path=Qwen/Qwen3.5-0.8B for "
    "Qwen3.5-9B."
)
PROMPT = [{"role": "user", "content": "Say hello in three words."}]
SAMPLING = {"max_new_tokens": 16, "temperature": 1.0, "top_k": -1, "top_p": 1.0}
STREAMED = {"max_new_tokens": 20, "temperature": 1.0, "ignore_eos": True}
LONG_TOKENS = 4096  # a stream that outlasts sglang's 2 s before it aborts a gone client
LEFT_AFTER = 5  # chunks a harness reads before it leaves (the H200's crash)
PUSHED_VERSION = 1
FIXES = {  # for what a check did not foresee (its traceback is in the log) or an HTTP error
    "versions": "Reinstall agl with its extra, as the README's Install section does.",
    "cuda": "Check the NVIDIA driver (nvidia-smi) and that torch is a CUDA build "
    "(python -c 'import torch; print(torch.version.cuda)').",
    "backend": "Read the traceback above: Ray must start (`ray stop --force` clears a stale one), "
    "nothing else may hold the GPUs (nvidia-smi), and the model must load. " + SMALL_MODEL,
    "v1/models": "An engine did not answer /v1/models: read its log (on cuda, Ray's worker logs).",
    "generate": "An engine's /generate failed: read its log; check 1 names the sglang it needs.",
    "stream": "An engine's streamed /generate or /abort_request failed: read its log; check 1 "
    "names the sglang it needs.",
    "left stream": "The engine did not survive a stream left before the trainer's sleep: "
    "read its log (sglang: 'should be called only when server is idle' means it slept busy).",
    "weight push": "The trainer's weights did not reach the engines: read the traceback above (on "
    "cpu the engine loads them from trainer.default_local_dir, which it must be able to read).",
}


class CheckFailed(Exception):
    """A check found a problem: what it found, and the fix in one or two sentences."""

    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.fix = fix


class Skipped(Exception):
    """A check that does not apply to this config; the message says why."""


class MalformedReply(ValueError):
    """A `/generate` reply the gateway could not record."""


@dataclasses.dataclass(frozen=True)
class Result:
    """One row of the table."""

    check: str
    status: str  # OK, FAIL, SKIPPED or NOT_RUN
    detail: str
    fix: str = ""


@dataclasses.dataclass(frozen=True)
class Sampled:
    """What a `/generate` reply says was sampled."""

    output_ids: list[int]
    logprobs: list[float]
    finish: str


# ------------------------------------------------------------------ checks on plain data


def extra_for(device: str) -> str:
    """The extra whose pins an install for `trainer.device` must hold."""
    if device == "cpu":
        return "train"
    return "gpu"


def agl_requirements() -> list[str]:
    """The requirement lines of the installed `agl` distribution, with their extras' markers."""
    return requires("agl") or []


def pins(extra: str, lines: Iterable[str]) -> list[Requirement]:
    """The requirements an install of `agl[extra]` must hold: agl's own and those of `extra`."""
    wanted = []
    for line in lines:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            wanted.append(req)
    return wanted


def installed(name: str) -> str | None:
    """The installed version of distribution `name`, or None if it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def check_versions(
    extra: str, wanted: list[Requirement], have: Callable[[str], str | None] = installed
) -> str:
    """Each requirement installed at a version it allows, else the pip command that fixes it."""
    wrong = []
    found = []
    for req in wanted:
        got = have(req.name)
        if got is None:
            found.append(f"{req.name} missing (want {req.specifier or 'any'})")
            wrong.append(req)
        elif not req.specifier.contains(got, prereleases=True):
            found.append(f"{req.name} {got} (want {req.specifier})")
            wrong.append(req)
    if not wrong:
        return f"{len(wanted)} requirements of agl[{extra}] hold"
    specs = " ".join(f"'{pip_spec(req)}'" for req in wrong)
    # flash-attn compiles against the installed torch (README, Install)
    isolation = "--no-build-isolation " if extra == "gpu" else ""
    command = f"pip install {isolation}{specs}"
    raise CheckFailed(", ".join(found), f"Install the pinned versions: {command}")


def pip_spec(req: Requirement) -> str:
    """The requirement as pip takes it on a command line: extras and versions, no marker."""
    bare = Requirement(str(req))
    bare.marker = None
    return str(bare)


def check_cuda(available: bool, count: int, wanted: int) -> str:
    """CUDA sees at least the `wanted` GPUs (`trainer.n_gpus_per_node`)."""
    if not available or count == 0:
        raise CheckFailed(
            "no CUDA device visible: this machine cannot run the GPU path; "
            "run agl doctor on the GPU node",
            "Run agl doctor on the GPU node (there, check nvidia-smi and CUDA_VISIBLE_DEVICES); "
            "on a machine without GPUs, trainer.device=cpu checks the CPU path.",
        )
    if count < wanted:
        raise CheckFailed(
            f"{count} CUDA devices visible, trainer.n_gpus_per_node asks for {wanted}",
            f"Set trainer.n_gpus_per_node={count}, or free the GPUs CUDA_VISIBLE_DEVICES hides.",
        )
    return f"{count} CUDA devices visible, {wanted} used"


def served_context(reply: Any) -> int:
    """`max_model_len` of the first model card of a `/v1/models` reply."""
    return int(reply["data"][0]["max_model_len"])


def check_context(served: dict[str, int], configured: int | None, device: str) -> str:
    """Each engine serves the context `actor_rollout_ref.rollout.max_model_len` names, if any."""
    for url, context in served.items():
        if configured is None or context == configured:
            continue
        fix = (
            f"Set actor_rollout_ref.rollout.max_model_len={context}, what agl.engine serves."
            if device == "cpu"
            else (
                "Give sglang the same context: actor_rollout_ref.rollout.engine_kwargs.sglang."
                "context_length=${actor_rollout_ref.rollout.max_model_len}, as "
                "examples/gpu/qwen3.5-9b-8gpu.yaml does."
            )
        )
        detail = (
            f"{url} serves max_model_len {context}, "
            f"actor_rollout_ref.rollout.max_model_len is {configured}"
        )
        raise CheckFailed(detail, fix)
    lengths = ", ".join(sorted({str(c) for c in served.values()}))
    if configured is None:
        return f"{len(served)} engine(s), max_model_len {lengths} (the config sets none)"
    return f"{len(served)} engine(s), max_model_len {lengths} as configured"


def parse_generation(reply: Any) -> Sampled:
    """A `/generate` reply as the gateway records it: `output_ids`; one `[logprob, id, ...]` per
    output token in `meta_info.output_token_logprobs`, with those ids; finite logprobs <= 0; and a
    stop or length finish. Raises `MalformedReply` saying what is wrong."""
    try:
        output_ids = [int(t) for t in reply["output_ids"]]
        meta = reply["meta_info"]
        pairs = meta["output_token_logprobs"]
        logprobs = [float(p[0]) for p in pairs]
        ids = [int(p[1]) for p in pairs]
        finish = meta["finish_reason"]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise MalformedReply(f"not a reply with logprobs ({e!r}): {str(reply)[:200]}") from e
    if isinstance(finish, dict):  # sglang: {"type": "stop", "matched": ...}
        finish = finish.get("type")
    if not output_ids:
        raise MalformedReply("output_ids is empty")
    if ids != output_ids:
        raise MalformedReply(
            f"output_token_logprobs' ids {ids[:8]} differ from output_ids {output_ids[:8]}"
        )
    bad = [x for x in logprobs if not (math.isfinite(x) and x <= 0)]
    if bad:
        raise MalformedReply(f"logprobs must be finite and <= 0, got {bad[:4]}")
    if finish not in ("stop", "length"):
        raise MalformedReply(f"finish_reason {finish!r}, not stop or length")
    return Sampled(output_ids=output_ids, logprobs=logprobs, finish=str(finish))


def stream_cadence(total: int, interval: int) -> list[int]:
    """The token counts at which sglang sends a stream's chunks under `--stream-interval`: at 1,
    1 + interval, 1 + 2 x interval ... (every token at 1), and at the end (sglang's
    scheduler_components/output_streamer.py; on an H200, 20 tokens at 8 came as 1, 9, 17, 20)."""
    if interval > 1:
        counts = [c for c in range(1, total) if c % interval == 1]
    else:
        counts = list(range(1, total))
    return [*counts, total]


def parse_stream(chunks: list[Any]) -> tuple[list[int], str]:
    """A streamed `/generate`'s chunks as the gateway reads them: each chunk's
    `meta_info.completion_tokens` (the tokens so far, in either of sglang's streaming modes) and
    the last chunk's finish reason; each chunk's logprob pairs name its output ids. Raises
    `MalformedReply` saying what is wrong."""
    counts = []
    finish: Any = None
    for chunk in chunks:
        try:
            meta = chunk["meta_info"]
            ids = [int(t) for t in chunk["output_ids"]]
            pairs = [int(p[1]) for p in meta["output_token_logprobs"]]
            counts.append(int(meta["completion_tokens"]))
            finish = meta["finish_reason"]
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise MalformedReply(f"not a chunk with logprobs ({e!r}): {str(chunk)[:200]}") from e
        if ids and pairs[-len(ids) :] != ids:
            raise MalformedReply(f"a chunk's logprob ids {pairs[:8]} differ from {ids[:8]}")
    if not counts or counts != sorted(counts):
        raise MalformedReply(f"completion_tokens do not grow chunk by chunk: {counts[:12]}")
    if isinstance(finish, dict):
        finish = finish.get("type")
    return counts, str(finish)


def check_cadence(counts: list[int], interval: int) -> str:
    """A stream's chunks came at sglang's cadence for `stream_interval` = `interval`."""
    wanted = stream_cadence(counts[-1], interval)
    if counts != wanted:
        raise CheckFailed(
            f"chunks at {counts} tokens; stream_interval {interval} sends them at {wanted}",
            "verl passes actor_rollout_ref.rollout.engine_kwargs.sglang to sglang's server: set "
            "stream_interval there (and incremental_streaming_output), as "
            "examples/gpu/qwen3.5-9b-8gpu.yaml does.",
        )
    return f"chunks at {counts} tokens (stream_interval {interval})"


def prompt_ids(tokenizer: Any) -> list[int]:
    """A short chat prompt as the gateway sends one: the chat template's text, tokenized."""
    text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


# ------------------------------------------------------------------ the checks that start things


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

    def get(self, url: str, route: str, check: str) -> Any:
        """A GET's JSON; an answer other than a 200 fails `check`."""
        reply = self.http.get(url.rstrip("/") + route)
        if reply.status_code != 200:
            detail = f"{url}{route}: {reply.status_code} {reply.text[:200]}"
            raise CheckFailed(detail, FIXES[check])
        return reply.json()

    def models(self) -> str:
        """Check 4: each engine's `/v1/models` serves the context the config names."""
        served = {}
        for url in self.endpoints():
            served[url] = served_context(self.get(url, "/v1/models", "v1/models"))
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
        sampled = [self.generate_one(url, body) for url in self.endpoints()]
        tokens = "/".join(sorted({str(len(s.output_ids)) for s in sampled}))
        finishes = "/".join(sorted({s.finish for s in sampled}))
        logprobs = [x for s in sampled for x in s.logprobs]
        return (
            f"{len(sampled)} engine(s): {tokens} tokens, logprobs {min(logprobs):.2f} to "
            f"{max(logprobs):.2f}, finish {finishes}"
        )

    def streamed(self, max_new_tokens: int, rid: str) -> dict[str, Any]:
        """A streamed `/generate` body of the doctor's prompt, named `rid`."""
        sampling = {**STREAMED, "max_new_tokens": max_new_tokens}
        return {
            "input_ids": self.prompt(),
            "sampling_params": sampling,
            "return_logprob": True,
            "stream": True,
            "rid": rid,
        }

    def stream(self) -> str:
        """Check 6: on each engine, a streamed `/generate` of 20 tokens whose chunks add up, at
        the cadence the config gives sglang (`engine_kwargs.sglang.stream_interval`; on cpu the
        engine's own); then `/abort_request` ends a long stream by its rid, and the engine is idle
        at once, as when the gateway leaves a stream."""
        interval = int(self.engine_kwargs().get("stream_interval") or 1)
        details = []
        for url in self.endpoints():
            counts, finish = parse_stream(self.read_stream(url, self.streamed(20, uuid4().hex)))
            if finish != "length" or counts[-1] != 20:
                raise CheckFailed(f"{url}: {counts[-1]} tokens, finish {finish}", FIXES["stream"])
            detail = f"chunks at {counts} tokens"
            if self.device != "cpu":
                detail = check_cadence(counts, interval)
            details.append(detail)
            self.abort_one(url)
        return f"{'; '.join(sorted(set(details)))}; an abort by rid ended a stream at once"

    def abort_one(self, url: str) -> None:
        """A long stream on `url`, aborted by its rid after its first chunk and read to its end:
        its last chunk says it was aborted, and the engine runs nothing after it."""
        rid = uuid4().hex
        chunks = self.read_stream(url, self.streamed(self.long_tokens(), rid), abort_after=1)
        _, finish = parse_stream(chunks)
        if finish != "abort":
            detail = f"{url}: a stream aborted by its rid ended with finish {finish!r}"
            raise CheckFailed(detail, FIXES["stream"])
        wait_idle(self.http, [url], timeout_s=5)

    def read_stream(
        self, url: str, body: dict[str, Any], abort_after: int | None = None
    ) -> list[Any]:
        """A streamed `/generate`'s chunks, read to `[DONE]`; after `abort_after` chunks,
        `/abort_request` names its rid (the stream still read to its end)."""
        chunks: list[Any] = []
        with self.http.stream("POST", url + "/generate", json=body) as reply:
            if reply.status_code != 200:
                reply.read()
                detail = f"{url}/generate: {reply.status_code} {reply.text[:200]}"
                raise CheckFailed(detail, FIXES["stream"])
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunks.append(json.loads(line.removeprefix("data: ")))
                if len(chunks) == abort_after:
                    self.http.post(url + "/abort_request", json={"rid": body["rid"]})
        return chunks

    def leave(self, url: str) -> None:
        """A long stream on `url` left after `LEFT_AFTER` chunks, without an abort."""
        body = self.streamed(self.long_tokens(), uuid4().hex)
        seen = 0
        with self.http.stream("POST", url + "/generate", json=body) as reply:
            for line in reply.iter_lines():
                seen += line.startswith("data: ")
                if seen == LEFT_AFTER:
                    break

    def leave_then_sleep(self) -> str:
        """Check 7: the sequence that killed sglang on an H200: a stream left without an abort,
        then the trainer's sleep. The sleep waits until every engine is idle (sglang aborts a
        gone client 2 s later, and dies if its memory is released before); then the wake, and
        `/generate` still answers."""
        assert self.backend is not None
        engine = self.backend.engine
        for url in self.endpoints():
            self.leave(url)
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

    def long_tokens(self) -> int:
        """A long stream's `max_new_tokens`: `LONG_TOKENS`, as far as the context has room."""
        return min(LONG_TOKENS, self.context - len(self.prompt()) - 8)

    def engine_kwargs(self) -> dict[str, Any]:
        """What the config passes to sglang's server (`engine_kwargs.sglang`)."""
        rollout = self.cfg.actor_rollout_ref.rollout
        kwargs = rollout.get("engine_kwargs") or {}
        return dict(kwargs.get("sglang") or {})

    def generate_one(self, url: str, body: dict[str, Any]) -> Sampled:
        """One engine's `/generate` reply, as the gateway would record it."""
        reply = self.http.post(url + "/generate", json=body)
        if reply.status_code != 200:
            detail = f"{url}/generate: {reply.status_code} {reply.text[:200]}"
            raise CheckFailed(detail, FIXES["generate"])
        try:
            return parse_generation(reply.json())
        except MalformedReply as e:
            fix = (
                "The engine must answer as sglang 0.5.13 does, one [logprob, id] per output token: "
                "check that the sglang installed is the pinned one (check 1), and its log."
            )
            raise CheckFailed(f"{url}/generate: {e}", fix) from e

    def push(self) -> str:
        """Check 6: the trainer's weights to every engine (sleep, push, wake), as after each
        update."""
        assert self.backend is not None
        engine = self.backend.engine
        if self.device == "cpu":
            self.served = self.get(self.agl.engine, "/model_info", "weight push")
        started = time.monotonic()
        self.asleep = True
        engine.sleep()
        engine.push(None, PUSHED_VERSION)
        engine.wake()
        self.asleep = False
        took = time.monotonic() - started
        for url in self.endpoints():
            served = self.get(url, "/model_info", "weight push").get("weight_version")
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


def attempt(name: str, check: Callable[[], str]) -> Result:
    """One check's row: ok with its detail, skipped, or failed with its fix. A failure the check
    did not foresee gets its traceback logged and the check's general fix."""
    try:
        detail = check()
    except Skipped as e:
        return Result(check=name, status=SKIPPED, detail=str(e))
    except CheckFailed as e:
        return Result(check=name, status=FAIL, detail=e.detail, fix=e.fix)
    except Exception as e:
        log.exception("doctor: check %s raised", name)
        first_line = (str(e).strip().splitlines() or [""])[0][:300]
        detail = f"{type(e).__name__}: {first_line}"
        return Result(check=name, status=FAIL, detail=detail, fix=FIXES[name])
    return Result(check=name, status=OK, detail=detail)


def table(results: list[Result]) -> str:
    """The rows under a header and, for the first failure, its fix."""
    width = max(len(name) for name in ("check", *CHECKS))
    lines = [f"{'check':<{width}}  {'result':<7}  detail"]
    for r in results:
        lines.append(f"{r.check:<{width}}  {r.status:<7}  {r.detail}")
    failed = [r for r in results if r.status == FAIL]
    if failed:
        lines.append("")
        lines.append(f"fix ({failed[0].check}): {failed[0].fix}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`agl doctor`'s command line: the table printed; 1 if a check failed."""
    parser = argparse.ArgumentParser(
        prog="agl doctor", description=__doc__.split("\n")[0], epilog=SMALL_MODEL
    )
    parser.add_argument("config", help="the YAML `agl train` takes")
    parser.add_argument("overrides", nargs="*", help="key=value (Hydra syntax), as `agl train`'s")
    parser.add_argument(
        "--skip-versions",
        action="store_true",
        help="skip check 1, for an install that leaves a pin out on purpose (bench/gpu_kit's "
        "bundle has no flash-attn)",
    )
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per engine call otherwise
    try:
        cfg, agl = load_config(args.config, args.overrides)
    except ConfigError as e:
        parser.error(str(e))
    results = Doctor(cfg, agl, skip_versions=args.skip_versions).run()
    print(table(results))
    if any(r.status == FAIL for r in results):
        return 1
    return 0
