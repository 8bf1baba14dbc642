"""The recording path every harness call takes, whatever its wire format.

Owns: the pause gate (new calls wait, in-flight calls finish, `pause()` returns when none is in
flight, so each call is served under one model version), the context-length check, sampling
through the engine client, stop strings (applied here, since engines see token IDs only), and
writing each call to the store before its reply is returned, so that every answered call is
durable; after a restart, a harness retrying a call whose reply the crash cut off gets the
recorded reply instead of a second sample. Also the counters `/metrics` exposes.

It does not parse or format any wire format (`gateway/wire.py`), authenticate (`gateway/app.py`)
or render templates (`gateway/render.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agl.store import Store
from agl.types import JSON, Call, Rollout
from gateway.engines import EngineClient
from gateway.render import Message, Renderer, RenderError, parse_reply

log = logging.getLogger(__name__)


class ContextOverflow(RenderError):
    """The prompt plus the requested completion does not fit in the engine's context."""


class HeldTooLong(Exception):
    """A call waited out the pause's maximum hold time."""


class Gate:
    """Pause/resume with drain: `enter`/`leave` around each call; `pause` waits for in-flight calls."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self.inflight = 0
        self.waiting = 0

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def enter(self, max_hold_s: float) -> None:
        if not self._open.is_set():
            self.waiting += 1
            try:
                await asyncio.wait_for(self._open.wait(), max_hold_s)
            except TimeoutError as e:
                raise HeldTooLong(f"the gateway has been paused for more than {max_hold_s:.0f} s") from e
            finally:
                self.waiting -= 1
        self.inflight += 1
        self._drained.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._drained.set()

    async def pause(self) -> None:
        self._open.clear()
        await self._drained.wait()

    def resume(self) -> None:
        self._open.set()


@dataclass
class Params:
    """Sampling parameters after each wire format's names are mapped."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    """One sampled reply, as recorded."""

    reply: Message
    text: str  # visible text, stop string excluded
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "stop_sequence"
    stop_sequence: str
    logprobs: list[float]
    tokens: list[str]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter("agl_calls", "Recorded model calls", ["agent", "api"], registry=r)
        self.errors = Counter("agl_call_errors", "Harness calls answered with an error", ["kind"], registry=r)
        self.tokens = Counter("agl_tokens", "Tokens of recorded calls", ["kind"], registry=r)
        self.latency = Histogram(
            "agl_call_latency_seconds",
            "Time from receiving a call to recording it",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.inflight = Gauge("agl_inflight_calls", "Calls being served", registry=r)
        self.paused = Gauge("agl_paused", "1 while the gateway is paused", registry=r)
        self.rollouts = Gauge("agl_rollouts", "Rollouts by status", ["status"], registry=r)
        self.prefix = Counter(
            "agl_prefix", "Prompts by how they relate to the rollout's earlier calls", ["kind"], registry=r
        )


class Proxy:
    """Serves harness calls: gate, render, check, sample, record."""

    def __init__(
        self,
        store: Store,
        engines: EngineClient,
        renderer: Renderer,
        *,
        context_length: int,
        default_max_tokens: int,
        max_hold_s: float,
        prefix_preserving: bool = True,
        version: int = 0,
    ) -> None:
        self.store, self.engines, self.renderer = store, engines, renderer
        self.context_length = context_length
        self.default_max_tokens = default_max_tokens
        self.max_hold_s = max_hold_s
        self.prefix_preserving = prefix_preserving
        self.version = version
        self.gate = Gate()
        self.metrics = Metrics()
        self.started = time.time()
        self.seen: set[str] = set()  # rollouts called since this gateway started

    async def chat(
        self,
        rollout: Rollout,
        agent: str,
        api: str,
        messages: list[Message],
        tools: list[JSON],
        params: Params,
        n: int,
        request: JSON,
    ) -> list[Completion]:
        """Sample `n` replies to a conversation; each is one recorded call."""
        prompt = self.renderer.prompt(rollout.id, messages, tools, preserve=self.prefix_preserving)
        kind = "extended" if prompt.extended else (prompt.mismatch or "first")
        self.metrics.prefix.labels(kind).inc()
        if prompt.mismatch:  # recorded without waiting: a classification, not something a client was promised
            self.store.append_event(rollout.id, "prefix_mismatch", {"class": prompt.mismatch, "agent": agent})
        out = await self._replay(rollout, request, n, parse=True)
        for i in range(len(out), n):
            out.append(await self._sample(rollout, agent, api, prompt.ids, params, i, request, parse=True))
        first, ids, sampled_text = out[0]
        # Bookkeeping runs once the reply is on its way. Still before this rollout's next call: a
        # request's task starts from a callback queued after this one.
        asyncio.get_running_loop().call_soon(self.renderer.remember, rollout.id, prompt, ids, first.reply, sampled_text)
        return [c for c, _, _ in out]

    async def complete(
        self, rollout: Rollout, agent: str, prompt_ids: list[int], params: Params, n: int, request: JSON
    ) -> list[Completion]:
        """Plain completions of a token prompt."""
        if not prompt_ids:
            raise RenderError("the prompt must not be empty")
        if max(prompt_ids) >= len(self.renderer.tokenizer) or min(prompt_ids) < 0:
            raise RenderError("the prompt has token IDs outside the vocabulary")
        out = [c for c, _, _ in await self._replay(rollout, request, n, parse=False)]
        for i in range(len(out), n):
            done, _, _ = await self._sample(rollout, agent, "completions", prompt_ids, params, i, request, parse=False)
            out.append(done)
        return out

    async def _replay(
        self, rollout: Rollout, request: JSON, n: int, *, parse: bool
    ) -> list[tuple[Completion, list[int], str]]:
        """A harness retrying the call whose reply a crash cut off gets that reply, instead of a
        second sample: on a rollout's first call since this gateway started, when the rollout's
        last `n` calls, recorded before it started, had this very request. Nothing is recorded."""
        if rollout.id in self.seen or rollout.created_at >= self.started:
            return []
        self.seen.add(rollout.id)
        found = await asyncio.to_thread(self.store.last_calls, rollout.id, n)
        if len(found) < n or any(c.request != request or c.created_at >= self.started for c in found):
            return []
        log.info("rollout_id=%s: replayed %d call(s) recorded before a restart", rollout.id, n)
        out = []
        for c in found:
            ids, stop = list(c.response_ids), c.response.get("stop", "")
            args = (c.response["text"], ids, list(c.logprobs), c.finish_reason, stop, len(c.prompt_ids))
            out.append((self._completion(*args, parse, request), ids, self.renderer.reply_text(ids)))
        return out

    async def _sample(
        self,
        rollout: Rollout,
        agent: str,
        api: str,
        prompt: Sequence[int],
        params: Params,
        index: int,
        request: JSON,
        *,
        parse: bool,
    ) -> tuple[Completion, list[int], str]:
        """One sampled, recorded reply: (completion, sampled IDs, their text before any stop string cut)."""
        room = self.context_length - len(prompt)
        max_tokens = params.max_tokens if params.max_tokens is not None else min(self.default_max_tokens, room)
        if max_tokens > room or room <= 0:
            raise ContextOverflow(
                f"This model's maximum context length is {self.context_length} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the completion)."
            )
        sampling: JSON = {
            "max_new_tokens": max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "stop_token_ids": sorted(self.renderer.end_ids),
        }
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed + index
        sampling |= rollout.metadata.get("sampling") or {}  # set by whoever made the rollout (greedy validation)
        started = time.monotonic()
        await self.gate.enter(self.max_hold_s)
        self.metrics.inflight.inc()
        try:
            version = self.version
            gen = await self.engines.generate(prompt, sampling, rollout_id=rollout.id)
            ids, logprobs = gen.output_ids, gen.logprobs
            finish, stop_sequence = ("length" if gen.finish_reason == "length" else "stop"), ""
            if params.stop:
                ids, logprobs, stop_sequence = self._cut_at_stop(ids, logprobs, params.stop)
                if stop_sequence:
                    finish = "stop_sequence"
            sampled_text = text = self.renderer.reply_text(ids)
            if stop_sequence:
                text = text[: text.find(stop_sequence)]
            recorded = asyncio.wrap_future(
                self.store.append_call(
                    Call(
                        rollout_id=rollout.id,
                        prompt_ids=prompt,  # type: ignore[arg-type]
                        response_ids=ids,  # type: ignore[arg-type]
                        logprobs=logprobs,  # type: ignore[arg-type]
                        agent=agent,
                        model_version=version,
                        finish_reason=finish,
                        latency_ms=(time.monotonic() - started) * 1000,
                        temperature=sampling["temperature"],
                        request=request,
                        response={"text": text, "api": api, "index": index, "stop": stop_sequence},
                    )
                )
            )
            completion = self._completion(text, ids, logprobs, finish, stop_sequence, len(prompt), parse, request)
            await recorded  # the reply is built while the call commits, and returned once it has
        finally:
            self.gate.leave()
            self.metrics.inflight.dec()
        asyncio.get_running_loop().call_soon(self._count, agent, api, len(prompt), len(ids), time.monotonic() - started)
        return completion, ids, sampled_text

    def _count(self, agent: str, api: str, prompt_tokens: int, response_tokens: int, latency_s: float) -> None:
        self.metrics.calls.labels(agent, api).inc()
        self.metrics.tokens.labels("prompt").inc(prompt_tokens)
        self.metrics.tokens.labels("response").inc(response_tokens)
        self.metrics.latency.observe(latency_s)

    def _completion(
        self,
        text: str,
        ids: list[int],
        logprobs: list[float],
        finish: str,
        stop_sequence: str,
        prompt_tokens: int,
        parse: bool,
        request: JSON,
    ) -> Completion:
        reply = parse_reply(text, self.renderer.tool_parser) if parse else Message("assistant", text)
        tokens = [self.renderer.decode([t]) for t in ids] if request.get("logprobs") else []
        content = reply.content if parse else text
        return Completion(reply, content, prompt_tokens, len(ids), finish, stop_sequence, logprobs, tokens)

    def _cut_at_stop(
        self, ids: list[int], logprobs: list[float], stops: list[str]
    ) -> tuple[list[int], list[float], str]:
        """Cut the sampled tokens just after the first stop string; the tokens kept are what the
        engine sampled, so the recorded call stays exactly what was sampled up to that point."""
        text = self.renderer.decode(ids)
        found = [(text.find(s), s) for s in stops if s and s in text]
        if not found:
            return ids, logprobs, ""
        pos, stop = min(found)
        end = pos + len(stop)
        lo, hi = 1, len(ids)  # smallest k with the stop string complete in decode(ids[:k])
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.renderer.decode(ids[:mid])) >= end:
                hi = mid
            else:
                lo = mid + 1
        return ids[:lo], logprobs[:lo], stop

    async def pause(self) -> float:
        started = time.monotonic()
        self.metrics.paused.set(1)
        await self.gate.pause()
        return time.monotonic() - started

    def resume(self, version: int | None) -> None:
        if version is not None:
            self.version = version
        self.metrics.paused.set(0)
        self.gate.resume()

    def state(self) -> dict[str, Any]:
        return {
            "paused": self.gate.paused,
            "version": self.version,
            "inflight": self.gate.inflight,
            "waiting": self.gate.waiting,
        }
