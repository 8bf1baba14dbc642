"""The recording path every harness call takes, whatever its wire format.

Owns the pause gate (`pause()` returns once no call is in flight: each call is served under one
model version), the context-length check, sampling, stop strings (engines see only token IDs),
the `/metrics` counters, a rollout's `not_honoured` events (request fields the model could not be
shown), and recording each call before its reply goes out, so every answered call is durable and
a retry of a reply cut off by a crash gets the recorded one, not a new sample.
It does not parse wire formats, authenticate or render templates (`wire.py`, `auth.py`, `render.py`).
"""

import asyncio
import bisect
import json
import logging
import time
from collections.abc import Sequence
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agl.store import Store
from agl.types import JSON, Call, Rollout
from gateway.engines import EngineClient
from gateway.render import Renderer, parse_reply
from gateway.settings import GatewaySettings
from gateway.types import Ask, Completion, ContextOverflow, Message, Params, RenderError, TooLarge

log = logging.getLogger(__name__)
MAX_LABELS = 100  # distinct values a label takes from harnesses (agents, tool types); later ones count as "other"
INLINE_CHARS = 16_000  # prompts shorter than this render on the event loop (a few ms at most)
BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
)  # of call latency (seconds)


class HeldTooLong(Exception):
    """A call waited out the pause's maximum hold time."""


class Gate:
    """Pause/resume with drain: `enter`/`leave` around each call; `pause` waits for in-flight calls."""

    def __init__(self) -> None:
        self._open, self._drained = (
            asyncio.Event(),
            asyncio.Event(),
        )  # open; drained: no call in flight
        self._open.set()
        self._drained.set()
        self.inflight = self.waiting = 0  # calls in flight; calls held by a pause

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def enter(self, max_hold_s: float) -> None:
        if not self._open.is_set():
            self.waiting += 1
            try:
                await asyncio.wait_for(self._open.wait(), max_hold_s)
            except TimeoutError as e:
                raise HeldTooLong(
                    f"the gateway has been paused for more than {max_hold_s:.0f} s"
                ) from e
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


class Metrics:
    def __init__(self, gate: Gate) -> None:
        self.registry = r = CollectorRegistry()
        self.calls = Counter("agl_calls", "Recorded model calls", ["agent", "api"], registry=r)
        self.errors = Counter(
            "agl_call_errors",
            "Harness calls answered with an error",
            ["status", "kind"],
            registry=r,
        )
        self.tokens = Counter("agl_tokens", "Tokens of recorded calls", ["kind"], registry=r)
        self.latency = Histogram(
            "agl_call_latency_seconds",
            "Time from receiving a call to recording it",
            buckets=BUCKETS,
            registry=r,
        )
        Gauge("agl_inflight_calls", "Calls being served", registry=r).set_function(
            lambda: gate.inflight
        )
        Gauge("agl_paused", "1 while the gateway is paused", registry=r).set_function(
            lambda: gate.paused
        )
        self.rollouts = Gauge("agl_rollouts", "Rollouts by status", ["status"], registry=r)
        self.prefix = Counter(
            "agl_prefix", "Prompts by how they extend the rollout's calls", ["kind"], registry=r
        )
        self.over_budget = Counter(
            "agl_over_budget", "Requests refused: the rollout's storage budget", registry=r
        )
        about = "Rollouts that asked for what no prompt shows, by request field"
        self.not_honoured = Counter("agl_not_honoured", about, ["field"], registry=r)


class Proxy:
    """Serves harness calls: gate, render, check, sample, record."""

    def __init__(
        self,
        store: Store,
        engines: EngineClient,
        renderer: Renderer,
        settings: GatewaySettings,
        *,
        honours_seed: bool,
    ) -> None:
        self.store, self.engines, self.renderer, self.settings = store, engines, renderer, settings
        self.honours_seed = (
            honours_seed  # the engines use a request's seed (sglang: only in deterministic mode)
        )
        latest = store.latest_model()
        self.version = (
            latest.version if latest else 0
        )  # served: the latest registered until a resume names one
        self.gate = Gate()
        self.metrics = Metrics(self.gate)
        self.started = time.time()
        self.seen: set[str] = set()  # rollouts called since this gateway started
        self.agents: set[str] = set()  # the agent labels in /metrics
        self.fields: set[str] = set()  # the field labels of agl_not_honoured
        self.not_honoured: dict[
            str, set[str]
        ] = {}  # rollout id -> the fields its `not_honoured` events named
        self.sent: dict[str, int] = {}  # rollout id -> bytes its tokens have sent (`charge`)

    async def charge(self, rollout: Rollout, size: int) -> None:
        """Counts a body a rollout's token sent against the rollout's storage budget, or refuses it (413) past
        `rollout_max_bytes`. Starts from what the store holds of a rollout older than this gateway, or retried."""
        if (rid := rollout.id) not in self.sent:
            fresh = rollout.created_at >= self.started and rollout.attempt == 1
            self.sent.setdefault(
                rid, 0 if fresh else await asyncio.to_thread(self.store.stored_bytes, rid)
            )
        if self.sent[rid] + size > (budget := self.settings.rollout_max_bytes):
            self.metrics.over_budget.inc()
            raise TooLarge(
                f"rollout {rid} has sent {self.sent[rid]} bytes; {size} more would pass its "
                f"storage budget of {budget} (AGL_GATEWAY_ROLLOUT_MAX_BYTES)"
            )
        self.sent[rid] += size

    async def chat(
        self, ask: Ask, messages: list[Message], tools: list[JSON], params: Params
    ) -> list[Completion]:
        rollout_id = ask.rollout.id
        # A long prompt is rendered and tokenized off the event loop (the tokenizer releases the GIL): it takes
        # seconds at megabytes. A short one is not worth two thread switches, each a wait for a busy core.
        preserve = self.settings.prefix_preserving
        render = partial(
            self.renderer.prompt,
            rollout_id,
            messages,
            tools,
            preserve=preserve,
            template=params.template,
        )
        size = sum(len(m.content) for m in messages) + len(json.dumps([tools, params.template]))
        prompt = render() if size < INLINE_CHARS else await asyncio.to_thread(render)
        out = await self._serve(ask, prompt.ids, params, parse=True)
        self.metrics.prefix.labels(
            "extended" if prompt.extended else (prompt.mismatch or "first")
        ).inc()  # recorded
        if (
            prompt.mismatch
        ):  # recorded without waiting: a classification, not something a client was promised
            self.store.append_event(
                rollout_id, "prefix_mismatch", {"class": prompt.mismatch, "agent": ask.agent}
            )
        self._not_honoured(ask, params)
        first, ids, sampled_text = out[0]
        # Bookkeeping runs once the reply is on its way. Still before this rollout's next call: a
        # request's task starts from a callback queued after this one.
        asyncio.get_running_loop().call_soon(
            self.renderer.remember, rollout_id, prompt, ids, first.reply, sampled_text
        )
        return [c for c, _, _ in out]

    async def complete(self, ask: Ask, prompt_ids: list[int], params: Params) -> list[Completion]:
        if not prompt_ids:
            raise RenderError("the prompt must not be empty")
        if max(prompt_ids) >= len(self.renderer.tokenizer) or min(prompt_ids) < 0:
            raise RenderError("the prompt has token IDs outside the vocabulary")
        out = await self._serve(ask, prompt_ids, params, parse=False)
        self._not_honoured(ask, params)
        return [c for c, _, _ in out]

    def _not_honoured(self, ask: Ask, params: Params) -> None:
        """Names, once per rollout, the request's fields the model could not be shown or the engine does not
        honour, in a `not_honoured` event. Once the call is recorded: a refused request stores only its error."""
        rollout_id = ask.rollout.id
        asked = set(params.not_honoured)
        if params.seed is not None and not self.honours_seed:
            asked.add("seed")
        fresh = sorted(asked - self.not_honoured.get(rollout_id, set()))
        if not fresh:
            return
        self.not_honoured.setdefault(rollout_id, set()).update(fresh)
        self.store.append_event(rollout_id, "not_honoured", {"fields": fresh})
        for name in fresh:
            self.metrics.not_honoured.labels(self._label(self.fields, name)).inc()

    async def _serve(
        self, ask: Ask, prompt: Sequence[int], params: Params, *, parse: bool
    ) -> list[tuple[Completion, list[int], str | None]]:
        """`params.n` replies, each one recorded call. A retry after a restart gets the recorded ones: on a
        rollout's first call since this gateway started, if its last `n` calls (recorded before) had this request."""
        rollout, n = ask.rollout, params.n
        if rollout.id not in self.seen and rollout.created_at < self.started:
            self.seen.add(rollout.id)
            found = await asyncio.to_thread(self.store.last_calls, rollout.id, n)
            if len(found) >= n and all(
                c.request == ask.body and c.created_at < self.started for c in found
            ):
                log.info(
                    "rollout_id=%s: replayed %d call(s) recorded before a restart", rollout.id, n
                )
                return [(self._completion(c, parse), list(c.response_ids), None) for c in found]
        return [await self._sample(ask, prompt, params, i, parse=parse) for i in range(n)]

    async def _sample(
        self, ask: Ask, prompt: Sequence[int], params: Params, index: int, *, parse: bool
    ) -> tuple[Completion, list[int], str]:
        """One sampled, recorded reply: (completion, sampled IDs, their text before any stop string cut)."""
        room = self.renderer.context_length - len(prompt)
        max_tokens = (
            params.max_tokens
            if params.max_tokens is not None
            else min(self.settings.default_max_tokens, room)
        )
        if max_tokens > room and 0 < self.settings.fit_max_tokens <= room:
            self.store.append_event(
                ask.rollout.id, "max_tokens_lowered", {"asked": max_tokens, "to": room}
            )
            max_tokens = room
        if max_tokens > room or room <= 0:
            raise ContextOverflow(
                f"This model's maximum context length is {self.renderer.context_length} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the completion)."
            )
        sampling: JSON = {
            "max_new_tokens": max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "stop_token_ids": sorted(self.renderer.end_ids),
        }
        if params.seed is not None and self.honours_seed:
            sampling["sampling_seed"] = params.seed + index
        sampling |= (
            ask.rollout.metadata.get("sampling") or {}
        )  # set by whoever made the rollout (greedy validation)
        if (
            sampling["top_k"] == 0
        ):  # "no top-k" in OpenAI-style APIs; sglang refuses 0 and spells it -1
            sampling["top_k"] = -1
        started = time.monotonic()
        await self.gate.enter(self.settings.max_hold_s)
        try:
            version = self.version
            gen = await self.engines.generate(prompt, sampling, rollout_id=ask.rollout.id)
            ids, logprobs = gen.output_ids, gen.logprobs
            finish, stop_sequence = ("length" if gen.finish_reason == "length" else "stop"), ""
            if params.stop:
                kept, stop_sequence = self._stop_at(ids, params.stop)
                ids, logprobs = ids[:kept], logprobs[:kept]
                finish = "stop_sequence" if stop_sequence else finish
            sampled_text = text = self.renderer.reply_text(ids)
            if stop_sequence:
                text = text[: text.find(stop_sequence)]
            call = Call(
                rollout_id=ask.rollout.id,
                prompt_ids=prompt,  # type: ignore[arg-type]
                response_ids=ids,  # type: ignore[arg-type]
                logprobs=logprobs,  # type: ignore[arg-type]
                agent=ask.agent,
                model_version=version,
                finish_reason=finish,
                latency_ms=(time.monotonic() - started) * 1000,
                temperature=sampling["temperature"],
                request=ask.body,
                response={"text": text, "api": ask.api, "index": index, "stop": stop_sequence},
            )
            recorded = asyncio.wrap_future(self.store.append_call(call))
            completion = self._completion(call, parse)
            await recorded  # the reply is built while the call commits, and returned once it has
        finally:
            self.gate.leave()
        asyncio.get_running_loop().call_soon(
            self._count, ask, len(prompt), len(ids), time.monotonic() - started
        )
        return completion, ids, sampled_text

    def _count(self, ask: Ask, prompt_tokens: int, response_tokens: int, latency_s: float) -> None:
        self.metrics.calls.labels(self._label(self.agents, ask.agent), ask.api).inc()
        self.metrics.tokens.labels("prompt").inc(prompt_tokens)
        self.metrics.tokens.labels("response").inc(response_tokens)
        self.metrics.latency.observe(latency_s)

    @staticmethod
    def _label(values: set[str], value: str) -> str:
        """`value` as a metric label: harnesses name agents and tool types, so a label's values are capped."""
        if value not in values and len(values) >= MAX_LABELS:
            return "other"
        values.add(value)
        return value

    def _completion(self, call: Call, parse: bool) -> Completion:
        """The reply of a recorded call; `parse`: split off its reasoning, and its tool calls if tools were offered
        (the request's `tools`, in every wire format; a call of a tool not offered is returned as parsed)."""
        text, ids, stop = call.response["text"], call.response_ids, call.response.get("stop", "")
        tool_parser = self.renderer.tool_parser if call.request.get("tools") else "none"
        reply = parse_reply(text, tool_parser) if parse else Message("assistant", text)
        tokens = [self.renderer.decode([t]) for t in ids] if call.request.get("logprobs") else []
        return Completion(
            reply, len(call.prompt_ids), len(ids), call.finish_reason, stop, call.logprobs, tokens
        )

    def _stop_at(self, ids: list[int], stops: list[str]) -> tuple[int, str]:
        """How many sampled tokens to keep, and the stop string they end with: the fewest whose
        text holds the first stop string whole. The tokens kept are exactly what was sampled."""
        text = self.renderer.decode(ids)
        found = [(text.find(s), s) for s in stops if s and s in text]
        if not found:
            return len(ids), ""
        pos, stop = min(found)
        # The text of ids[:k] grows with k: a binary search for the first k that reaches past the stop string.
        kept = bisect.bisect_left(
            range(len(ids)), pos + len(stop), lo=1, key=lambda k: len(self.renderer.decode(ids[:k]))
        )
        return kept, stop

    def forget(self, rollout_id: str) -> None:
        """The rollout ended or went back to the queue: its next call starts afresh."""
        self.renderer.forget(rollout_id)
        self.seen.discard(rollout_id)
        self.sent.pop(rollout_id, None)
        self.not_honoured.pop(rollout_id, None)

    def state(self) -> JSON:
        gate = self.gate
        return {
            "paused": gate.paused,
            "version": self.version,
            "inflight": gate.inflight,
            "waiting": gate.waiting,
        }
