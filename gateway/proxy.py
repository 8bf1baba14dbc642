"""The recording path every harness call takes, whatever its wire format.

- Owns: serving each call under one model version (held by `gateway/gate.py`'s `Gate` while
  paused), and recording it before its reply goes out, so every answered call is durable and a
  retry of a reply cut off by a crash gets the recorded one, not a new sample; a rollout's
  storage budget (`charge`); its `prefix_mismatch` and `not_honoured` events (request fields the
  model could not be shown); what it keeps of a rollout between calls: one record
  (`gateway/rollouts.py`), forgotten when the rollout ends; with replicas, the calls another
  gateway recorded, caught up on.
- Uses: `gateway/sampling.py` for the token budget, sampling parameters and stop strings;
  `gateway/air.py` for AIR's rewards; `gateway/metrics.py` for what `/metrics` counts.
- Does not: parse wire formats, authenticate or render templates (`wire/`, `auth.py`,
  `render.py`), nor speak the engine's HTTP (`engines.py`).
"""

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

from agl.store import Store
from agl.types import JSON, Call, Charge, Rollout, Status
from gateway.air import Air
from gateway.engine_replies import EngineError, Generation
from gateway.engines import EngineClient, Room
from gateway.gate import Gate
from gateway.metrics import Metrics
from gateway.render import Prompt, Renderer
from gateway.reply_parsing import TOOL_MARKERS, parse_reply
from gateway.rollouts import RolloutState, RolloutStates
from gateway.sampling import Sampler
from gateway.settings import GatewaySettings
from gateway.stream import Detokenizer, Shown
from gateway.types import (
    Ask,
    Completion,
    Live,
    Message,
    Params,
    Peers,
    RenderError,
    TooLarge,
)

log = logging.getLogger(__name__)
RequestParser = Callable[[str, JSON], tuple[list[Message], list[JSON], Params]]
INLINE_CHARS = 16_000  # prompts shorter than this render on the event loop (a few ms at most)


@dataclass(frozen=True)
class Served:
    """One choice of a call, recorded: its completion, the token IDs sampled, and their text
    before any stop string cut (None for a replayed call, whose text was not kept)."""

    completion: Completion
    response_ids: list[int]
    sampled_text: str | None


class Proxy:
    """Serves harness calls: gate, render, check, sample, record."""

    def __init__(
        self,
        store: Store,
        engines: EngineClient,
        renderer: Renderer,
        settings: GatewaySettings,
        *,
        room: Room,
        honours_seed: bool,
        parse_request: RequestParser,
        peers: Peers,
    ) -> None:
        """`room`: what the engine takes of one request; `honours_seed`: whether the engines use
        a request's seed (sglang: only in deterministic mode); `parse_request`: a recorded request
        of a wire format ("chat", "responses", "messages") parsed as when it came in (the proxy
        does not parse wire formats); `peers`: the other live gateways on the store, which
        `gateway/fleet.py` counts."""
        self.store = store
        self.engines = engines
        self.renderer = renderer
        self.settings = settings
        self.sampler = Sampler(renderer, room, settings, store, honours_seed=honours_seed)
        self.air = Air(settings, store)
        self.parse_request = parse_request
        self.peers = peers
        # The version served: the latest registered until a resume names one.
        latest = store.latest_model()
        self.version = 0
        if latest:
            self.version = latest.version
        self.gate = Gate()
        self.metrics = Metrics(self.gate)
        self.id = uuid.uuid4().hex  # this gateway's, recorded on its calls
        self.started = time.time()
        self.rollouts = RolloutStates(since=self.started)

    # ------------------------------------------------------------------ pause, resume, forget

    async def pause(self) -> float:
        """Holds new calls, and returns once no call is in flight: the seconds that took."""
        started = time.monotonic()
        await self.gate.pause()
        return time.monotonic() - started

    def resume(self, version: int | None = None) -> None:
        """Serves the held calls and new ones, under model `version` from now on, if given."""
        if version is not None:
            self.serve_version(version)
        self.gate.resume()

    def serve_version(self, version: int) -> None:
        """Serves model `version` from the next call on (a call in flight keeps its own)."""
        self.version = version

    def state(self) -> JSON:
        """Whether calls are held, the model version served, and the calls in flight and held."""
        gate = self.gate
        return {
            "paused": gate.paused,
            "version": self.version,
            "inflight": gate.inflight,
            "waiting": gate.waiting,
        }

    def moved(self, rollout: Rollout) -> None:
        """Follows a rollout's change of status: one that ended or went back to the queue is
        forgotten."""
        if rollout.status.terminal or rollout.status is Status.QUEUED:
            self.forget(rollout.id)

    def forget(self, rollout_id: str) -> None:
        """The rollout ended or went back to the queue: its next call starts afresh."""
        self.rollouts.forget(rollout_id)

    # ------------------------------------------------------------------ calls

    async def charge(self, rollout: Rollout, size: int) -> Charge:
        """Counts a body a rollout's token sent against the rollout's storage budget, or refuses it
        (413) past `rollout_max_bytes`: the charge to record with what the body makes. This count
        is this gateway's, and counts refused requests too; the store's, which a call or event
        passes in its own transaction, counts what every replica recorded. Starts from the
        store's count for a rollout older than its record (`_sent_before`)."""
        state = self.rollouts.of(rollout.id)
        if state.sent_bytes is None:
            stored = await self._sent_before(rollout)
            # a concurrent request of the rollout may have read it meanwhile
            if state.sent_bytes is None:
                state.sent_bytes = stored
        budget = self.settings.rollout_max_bytes
        if state.sent_bytes + size > budget:
            self.metrics.over_budget.inc()
            raise TooLarge(
                f"rollout {rollout.id} has sent {state.sent_bytes} bytes; {size} more would pass "
                f"its storage budget of {budget} (AGL_GATEWAY_ROLLOUT_MAX_BYTES)"
            )
        state.sent_bytes += size
        return Charge(size=size, budget=budget)

    async def _sent_before(self, rollout: Rollout) -> int:
        """What a rollout has sent before its record was made: nothing if it is a first attempt
        made since no record was dropped (`RolloutStates.whole_since`), else what the store
        holds of it (a rollout older than this gateway, retried, or whose record was dropped)."""
        if rollout.attempt == 1 and rollout.created_at >= self.rollouts.whole_since:
            return 0
        return await asyncio.to_thread(self.store.sent_bytes, rollout.id)

    async def chat(
        self,
        ask: Ask,
        messages: list[Message],
        tools: list[JSON],
        params: Params,
        live: Live | None = None,
    ) -> list[Completion]:
        """The replies to a chat call, on the rollout's transcripts; the prompt is classified,
        the transcript kept and AIR's reward of the tool results it sends back posted once the
        calls are recorded. `live`: the reply's text is put there as it is sampled (one choice)."""
        penalty = await self.air.penalty(ask, messages)  # before this call is recorded
        state = self.rollouts.of(ask.rollout.id)
        recent = await self._recent(ask.rollout, state, params.n)
        await self._catch_up(state, recent)
        prompt = await self._render(state, messages, tools, params)
        served = await self._serve(ask, state, prompt.ids, params, recent, parse=True, live=live)
        self._classify(ask, prompt)
        self._not_honoured(ask, state, params)
        # Bookkeeping runs once the reply is on its way. Still before this rollout's next call: a
        # request's task starts from a callback queued after this one.
        asyncio.get_running_loop().call_soon(self._remember, state, prompt, served[0])
        # Once the call is recorded: a refused request changes nothing stored.
        if penalty is not None:
            await self.air.post(ask.rollout.id, penalty)
        return [s.completion for s in served]

    async def complete(
        self, ask: Ask, prompt_ids: list[int], params: Params, live: Live | None = None
    ) -> list[Completion]:
        """The replies to a Completions call, whose prompt is token IDs (text tokenized as is);
        `live` as `chat`'s."""
        if not prompt_ids:
            raise RenderError("the prompt must not be empty")
        if max(prompt_ids) >= len(self.renderer.tokenizer) or min(prompt_ids) < 0:
            raise RenderError("the prompt has token IDs outside the vocabulary")
        state = self.rollouts.of(ask.rollout.id)
        recent = await self._recent(ask.rollout, state, params.n)
        served = await self._serve(ask, state, prompt_ids, params, recent, parse=False, live=live)
        self._not_honoured(ask, state, params)
        return [s.completion for s in served]

    async def _recent(self, rollout: Rollout, state: RolloutState, n: int) -> list[Call]:
        """The rollout's last `n` calls, in order, for `_catch_up` and `_replayed`: with replicas
        on every call, alone only until a call of the rollout was checked for a replay, and not
        for a rollout every call of which this gateway served (`_only_here`); else none (no
        read). Each is read through its chain back to the last call this gateway recorded or
        read (`RolloutState.last_call`; `Store.last_calls`): a link or two, whatever the
        conversation's length."""
        if self.peers.count == 0 and (state.replay_checked or self._only_here(rollout)):
            return []
        return await asyncio.to_thread(self.store.last_calls, rollout.id, n, known=state.last_call)

    def _only_here(self, rollout: Rollout) -> bool:
        """Whether every call of the rollout was served by this gateway: it was made since this
        gateway started, on a store that serves one gateway process (SQLite). Then no other
        gateway recorded a call a retry could be after."""
        return self.store.single_process and rollout.created_at >= self.started

    async def _catch_up(self, state: RolloutState, recent: list[Call]) -> None:
        """With replicas: the rollout's last call (the last of `recent`), if another gateway
        recorded it, becomes one of its transcripts here, so that the next prompt is built on the
        tokens that call sampled (prefix preservation whichever replica a call reaches): its
        request parsed as when it came in, its prompt IDs and sampled IDs as recorded. The call
        this gateway records next is stored as its extension (`Store.append_call`'s `follows`)."""
        if self.peers.count == 0 or not recent:
            return
        call = recent[-1]
        if call.gateway == self.id or call.seq == state.caught_up:
            return
        state.caught_up = call.seq
        state.last_call = call
        api = call.response.get("api", "")
        if api == "completions":
            return  # token IDs in, no conversation to continue
        messages, tools, params = self.parse_request(api, call.request)
        recorded = partial(
            self.renderer.recorded, messages, tools, call.prompt_ids, template=params.template
        )
        prompt = await self._off_loop_if_long(recorded, messages, tools, params)
        reply = self._completion(call, parse=True).reply
        state.transcripts = self.renderer.remember(
            state.transcripts, prompt, list(call.response_ids), reply
        )

    async def _render(
        self, state: RolloutState, messages: list[Message], tools: list[JSON], params: Params
    ) -> Prompt:
        """The prompt, built on the rollout's transcripts."""
        render = partial(
            self.renderer.prompt,
            state.transcripts,
            messages,
            tools,
            preserve=self.settings.prefix_preserving,
            template=params.template,
        )
        return await self._off_loop_if_long(render, messages, tools, params)

    async def _off_loop_if_long(
        self,
        render: Callable[[], Prompt],
        messages: list[Message],
        tools: list[JSON],
        params: Params,
    ) -> Prompt:
        """`render()`'s prompt of these messages. A long prompt is rendered and tokenized off the
        event loop (the tokenizer releases the GIL): it takes seconds at megabytes. A short one is
        not worth two thread switches, each a wait for a busy core."""
        size = sum(len(m.content) for m in messages) + len(json.dumps([tools, params.template]))
        if size < INLINE_CHARS:
            return render()
        return await asyncio.to_thread(render)

    def _classify(self, ask: Ask, prompt: Prompt) -> None:
        """Counts how the prompt extends the rollout's calls; a break is recorded as an event,
        without waiting: a classification, not something a client was promised."""
        if prompt.extended:
            kind = "extended"
        else:
            kind = prompt.mismatch or "first"
        self.metrics.prefix.labels(kind).inc()
        if prompt.mismatch:
            data = {"class": prompt.mismatch, "agent": ask.agent}
            self.store.append_event(ask.rollout.id, "prefix_mismatch", data)

    def _remember(self, state: RolloutState, prompt: Prompt, served: Served) -> None:
        """Keeps the transcript a call made in the rollout's record."""
        state.transcripts = self.renderer.remember(
            state.transcripts,
            prompt,
            served.response_ids,
            served.completion.reply,
            served.sampled_text,
        )

    def _not_honoured(self, ask: Ask, state: RolloutState, params: Params) -> None:
        """Names, once per rollout, the request's fields the model could not be shown or the
        engine does not honour, in a `not_honoured` event. Once the call is recorded: a refused
        request stores only its error."""
        asked = set(params.not_honoured)
        if params.seed is not None and not self.sampler.honours_seed:
            asked.add("seed")
        fresh = sorted(asked - state.not_honoured)
        if not fresh:
            return
        state.not_honoured.update(fresh)
        self.store.append_event(ask.rollout.id, "not_honoured", {"fields": fresh})
        for name in fresh:
            self.metrics.count_not_honoured(name)

    async def _serve(
        self,
        ask: Ask,
        state: RolloutState,
        prompt: Sequence[int],
        params: Params,
        recent: list[Call],
        *,
        parse: bool,
        live: Live | None,
    ) -> list[Served]:
        """`params.n` replies, each one recorded call. A retry after a crash gets the recorded
        ones (`recent`: the rollout's last calls, as `_recent` read them). `live`: the first
        reply's text as it is sampled."""
        replayed = await self._replayed(ask, state, recent, params.n)
        if replayed is not None:
            return [
                Served(
                    completion=self._completion(c, parse),
                    response_ids=list(c.response_ids),
                    sampled_text=None,
                )
                for c in replayed
            ]
        out: list[Served] = []
        for i in range(params.n):
            shown_to = live if i == 0 else None
            out.append(
                await self._sample(ask, state, prompt, params, i, parse=parse, live=shown_to)
            )
        return out

    async def _replayed(
        self, ask: Ask, state: RolloutState, recent: list[Call], n: int
    ) -> list[Call] | None:
        """The calls a retry of a reply cut off by a crash gets: the rollout's last `n` calls if
        another gateway recorded them (a replica, or this one before a restart) with this very
        request; the gateway that recorded them may have died before its reply left. Alone, a
        gateway looks on its first call of each rollout since it started; with replicas, on
        every call (a harness's retry may reach any of them): `_recent` reads `recent` then."""
        state.replay_checked = True
        if len(recent) < n:
            return None
        if not all(c.gateway != self.id and c.request == ask.body for c in recent):
            return None
        log.info("rollout_id=%s: replayed %d call(s) another gateway recorded", ask.rollout.id, n)
        return recent

    async def _sample(
        self,
        ask: Ask,
        state: RolloutState,
        prompt: Sequence[int],
        params: Params,
        index: int,
        *,
        parse: bool,
        live: Live | None,
    ) -> Served:
        """One sampled, recorded reply. `live`: its text as it is sampled."""
        max_tokens = self.sampler.max_tokens(ask, len(prompt), params)
        sampling = self.sampler.sampling(ask, params, max_tokens, index)
        started = time.monotonic()
        await self.gate.enter(self.settings.max_hold_s)
        try:
            version = self.version
            if live is None:
                generation = await self.engines.generate(
                    prompt, sampling, rollout_id=ask.rollout.id
                )
            else:
                generation = await self._generate_live(ask, prompt, sampling, params, live, parse)
            sampled = self.sampler.through_stop(generation, params.stop)
            response = {
                "text": sampled.text,
                "api": ask.api,
                "index": index,
                "stop": sampled.stop_sequence,
            }
            call = Call(
                rollout_id=ask.rollout.id,
                prompt_ids=prompt,  # type: ignore[arg-type]
                response_ids=sampled.ids,  # type: ignore[arg-type]
                logprobs=sampled.logprobs,  # type: ignore[arg-type]
                agent=ask.agent,
                model_version=version,
                finish_reason=sampled.finish_reason,
                latency_ms=(time.monotonic() - started) * 1000,
                temperature=sampling["temperature"],
                request=ask.body,
                response=response,
                gateway=self.id,
            )
            appended = self._record(ask, state, call, index)
            # The reply is built while the call commits, and returned once it has.
            completion = self._completion(call, parse)
            recorded = await asyncio.wrap_future(appended)
        finally:
            self.gate.leave()
        if self.peers.count:  # what a later read of this rollout's calls stops at (`_recent`)
            state.last_call = recorded
        latency_s = time.monotonic() - started
        asyncio.get_running_loop().call_soon(
            self.metrics.count_call, ask.agent, ask.api, len(prompt), len(sampled.ids), latency_s
        )
        return Served(
            completion=completion, response_ids=sampled.ids, sampled_text=sampled.sampled_text
        )

    def _record(self, ask: Ask, state: RolloutState, call: Call, index: int) -> "Future[Call]":
        """Records a sampled call, charged with the request's body if it is its first choice (the
        body counts once, whatever its choices), as the extension of the call `_catch_up` read
        if it read one since this gateway last recorded one."""
        charge = None
        if index == 0:
            charge = ask.charge
        return self.store.append_call(call, charge, follows=state.last_call)

    async def _generate_live(
        self,
        ask: Ask,
        prompt: Sequence[int],
        sampling: JSON,
        params: Params,
        live: Live,
        parse: bool,
    ) -> Generation:
        """A generation streamed from the engine, the text a harness may see put on `live` as it
        comes (`Shown`); a stop string ends it at once (the engine aborts the rest)."""
        tool_marker = ""
        if parse and ask.body.get("tools"):
            tool_marker = TOOL_MARKERS[self.renderer.tool_parser]
        thinking = parse and self.renderer.opens_thinking(prompt)
        shown = Shown(stops=params.stop, tool_marker=tool_marker, thinking=thinking)
        text = Detokenizer(self.renderer.decode)
        live.prompt_tokens = len(prompt)
        ids: list[int] = []
        logprobs: list[float] = []
        finish = None
        replica = ""
        pieces = self.engines.stream(prompt, sampling, rollout_id=ask.rollout.id)
        async with contextlib.aclosing(pieces):
            async for piece in pieces:
                ids += piece.output_ids
                logprobs += piece.logprobs
                finish = piece.finish_reason
                replica = piece.replica
                visible = [t for t in piece.output_ids if t not in self.renderer.end_ids]
                for part in shown.add(text.add(visible)):
                    live.parts.put_nowait(part)
                if shown.stopped:
                    finish = "stop"
                    break
        if finish is None:
            raise EngineError(f"{replica}: the generation's stream ended without a finish reason")
        return Generation(output_ids=ids, logprobs=logprobs, finish_reason=finish, replica=replica)

    def _completion(self, call: Call, parse: bool) -> Completion:
        """The reply of a recorded call; `parse`: split off its reasoning, and its tool calls if
        tools were offered (the request's `tools`, in every wire format; a call of a tool not
        offered is returned as parsed)."""
        text = call.response["text"]
        if parse:
            tool_parser = self.renderer.tool_parser if call.request.get("tools") else "none"
            thinking = self.renderer.opens_thinking(call.prompt_ids)
            reply = parse_reply(text, tool_parser, thinking=thinking)
        else:
            reply = Message(role="assistant", content=text)
        tokens = []
        if call.request.get("logprobs"):
            tokens = [self.renderer.decode([t]) for t in call.response_ids]
        return Completion(
            reply=reply,
            prompt_tokens=len(call.prompt_ids),
            completion_tokens=len(call.response_ids),
            finish_reason=call.finish_reason,
            stop_sequence=call.response.get("stop", ""),
            logprobs=call.logprobs,
            tokens=tokens,
        )
