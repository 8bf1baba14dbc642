"""The gateway's client for its engine replicas, over sglang's native HTTP API.

What it relies on, and what sglang does differently, is in docs/architecture.md, "Engines".

Owns replica choice, retries, the engine's wire format (the embedded engine speaks it too) and
how much a request may ask of it:
- a rollout sticks to one replica (a hash of its id, for sglang's prefix cache) unless it is
  down, then goes to the least-loaded one up;
- transport errors, timeouts and 5xx replies mark a replica down for `down_s` and are retried with
  jittered backoff; a 4xx, or an abort with status 400, raises `EngineRejected` at once;
- every `/generate` carries a `rid`; one the gateway stops reading early (a stop string, a harness
  gone, a time-out) is aborted by it, and its stream read to the end, so no generation runs on
  behind a call that has left (sglang would abort it only 2 s later, and asserts it is idle before
  a weight update);
- `Room` sizes a request as sglang does.
It does not read what a reply means (`gateway/engine_replies.py`: a generation, a stream chunk's
tokens, an abort, an error body), tokenize, render, store calls or map errors to HTTP statuses,
and imports no torch.
"""

import asyncio
import contextlib
import logging
import random
import time
import uuid
import zlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import orjson

from agl.client import KEEPALIVE_S  # sglang and uvicorn keep an idle connection 5 s
from gateway.engine_replies import (
    BODY_CUT,
    EngineError,
    EngineInfo,
    EngineRejected,
    EngineUnavailable,
    Generation,
    Piece,
    ends_generation,
    error_message,
    read_chunk,
    read_engine_info,
    read_generation,
    read_piece,
    read_pool_tokens,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
RESERVED_TOKENS = 5  # sglang's managers/tp_worker.py: max_req_input_len = max_req_len - 5
UNTIMED = aiohttp.ClientTimeout()  # a stream's body is read within a deadline of its own


class _ServerError(Exception):
    """A 5xx reply: the replica's fault, retried."""


class TransportError(Exception):
    """A replica could not be reached, or its reply was cut off or was not HTTP."""


class _Unanswered(TransportError):
    """The engine closed a kept connection without replying (its keep-alive ran out): resent at
    once, free."""


@dataclass(frozen=True)
class Room:
    """How long a request the engine takes, sized as sglang sizes it: its longest request is
    `min(context - 1, pool - 1)` tokens (managers/tp_worker.py); a prompt must be shorter than that
    less 5 (managers/utils.py `validate_input_length`, else an abort with status 400); the new
    tokens fit the context and the longest request less one (managers/tokenizer_manager.py
    `_validate_one_request`, managers/scheduler.py `init_req_max_new_tokens`)."""

    context_length: int
    pool_tokens: int | None = None  # the KV cache's tokens (`/v1/loads`), if the engine says

    @property
    def longest(self) -> int:
        """sglang's `max_req_len`: the most tokens of one request, prompt and output."""
        if self.pool_tokens is None:
            return self.context_length - 1
        return min(self.context_length - 1, self.pool_tokens - 1)

    @property
    def max_prompt(self) -> int:
        """The longest prompt the engine takes."""
        return self.longest - RESERVED_TOKENS - 1

    def completion(self, prompt_tokens: int) -> int:
        """The most new tokens a prompt of `prompt_tokens` leaves room for (page size 1)."""
        room = min(self.context_length, self.longest - 1) - prompt_tokens
        if self.pool_tokens is not None:
            room = min(room, self.pool_tokens - 2 - prompt_tokens)
        return room


@dataclass
class _Replica:
    url: str
    inflight: int = 0
    down_until: float = 0.0
    streams_whole: bool = False  # its stream chunks carry everything so far (said once, in the log)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine URL {self.url!r}: expected http(s)://host[:port][/prefix]")


class EngineClient(contextlib.AbstractAsyncContextManager["EngineClient"]):
    """Async client for one or more engine replicas. Use as `async with EngineClient([...]) as engines:`."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout_s: float = 600.0,
        attempts: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        down_s: float = 10.0,
        abort_s: float = 10.0,
        api_key: str = "",
    ) -> None:
        """Seconds: `timeout_s` bounds a request (a whole generation); a failing replica sits out
        `down_s`; retry k waits `min(max_backoff_s, backoff_s * 2**(k-1))`, jittered by x0.5-1;
        an aborted generation's stream may take `abort_s` to end (then its connection is closed).
        `attempts`: tries in all. `api_key`: the engines' own key (sglang's --api-key), if they
        have one."""
        if not urls or attempts < 1:
            raise ValueError("an engine client needs at least one replica URL and one attempt")
        self.replicas = [_Replica(u.rstrip("/")) for u in urls]
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._down_s = down_s
        self._timeout_s = timeout_s
        self._abort_s = abort_s
        self._auth: dict[str, str] = {}
        if api_key:
            self._auth = {"Authorization": f"Bearer {api_key}"}
        self._http: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        """Made on first use, inside the event loop that uses it."""
        if self._http is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
            timeout = aiohttp.ClientTimeout(total=self._timeout_s)
            headers = {"Content-Type": "application/json"} | self._auth
            self._http = aiohttp.ClientSession(
                connector=connector, timeout=timeout, headers=headers
            )
        return self._http

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()

    # ------------------------------------------------------------------ generation

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: dict[str, Any],
        *,
        rollout_id: str | None = None,
    ) -> Generation:
        """Sample a continuation of `input_ids`, on the rollout's replica when it is up. A try that
        times out or is cancelled is aborted on its engine before it is retried or given up."""
        # a rendered prompt (an int32 `array`) is viewed, not copied
        ids = np.asarray(input_ids, np.int32)

        async def once(r: _Replica) -> Any:
            rid = uuid.uuid4().hex
            body = {
                "input_ids": ids,
                "sampling_params": sampling_params,
                "return_logprob": True,
                "rid": rid,
            }
            r.inflight += 1
            try:
                return await self._once(r, "POST", "/generate", body)
            except (TimeoutError, asyncio.CancelledError):
                await _uncancelled(self._abort(r, rid))
                raise
            finally:
                r.inflight -= 1

        replica, reply = await self._retried("/generate", rollout_id, once)
        return read_generation(reply, replica.url)

    async def stream(
        self,
        input_ids: Sequence[int],
        sampling_params: dict[str, Any],
        *,
        rollout_id: str | None = None,
    ) -> AsyncGenerator[Piece, None]:
        """Sample a continuation of `input_ids` as `generate` does, a `Piece` at a time as the
        engine streams it; the last piece has a finish reason.
        - Tried again on another replica only until the engine answers; a failure after that
          raises `EngineUnavailable` (or `EngineRejected`, `EngineAborted`) mid-stream.
        - Left early (the loop broken, the task cancelled, `timeout_s` passed, a failure), the
          generation is aborted by its `rid` and its stream read to its end before the generator
          closes: the engine no longer runs it once the caller goes on."""
        rid = uuid.uuid4().hex
        body = {
            "input_ids": np.asarray(input_ids, np.int32),
            "sampling_params": sampling_params,
            "return_logprob": True,
            "stream": True,
            "rid": rid,
        }
        data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
        replica, reply = await self._open_stream(data, rollout_id)
        events = _Events(reply.content)
        seen = 0  # tokens received so far
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        try:
            while (event := await self._next_event(events, deadline, replica)) != b"[DONE]":
                chunk = read_chunk(event, replica.url)
                events.finished = ends_generation(chunk)
                piece = read_piece(chunk, seen, replica.url)
                whole = len(chunk["output_ids"]) > len(piece.output_ids)
                if whole and not replica.streams_whole:
                    _say_streams_whole(replica)
                seen += len(piece.output_ids)
                yield piece
            events.done = True
        finally:
            await _uncancelled(self._close_stream(replica, reply, events, rid))

    async def _next_event(self, events: "_Events", deadline: float, replica: _Replica) -> bytes:
        """The stream's next event, by `deadline` (the event loop's clock)."""
        try:
            async with asyncio.timeout_at(deadline):
                event = await events.next()
        except TimeoutError as e:
            raise EngineUnavailable(
                f"{replica.url}/generate: no whole generation within {self._timeout_s:g} s"
            ) from e
        except (aiohttp.ClientError, OSError) as e:
            raise EngineUnavailable(f"{replica.url}/generate: the stream broke: {e!r}") from e
        if event is None:
            raise EngineUnavailable(f"{replica.url}/generate: the stream ended without [DONE]")
        return event

    async def _close_stream(
        self, r: _Replica, reply: aiohttp.ClientResponse, events: "_Events", rid: str
    ) -> None:
        """A stream's end: read to `[DONE]`, its connection is kept for the next request; left
        early, its generation is aborted (unless its last chunk came) and the stream read to its
        end, within `abort_s`, else its connection is closed."""
        try:
            if events.done:
                reply.release()
                return
            if not events.finished:
                await self._abort(r, rid)
            try:
                async with asyncio.timeout(self._abort_s):
                    while await events.next() is not None:
                        pass
                reply.release()
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                log.warning("engine %s: generation %s did not end once aborted: %r", r.url, rid, e)
                reply.close()
        finally:
            r.inflight -= 1

    async def _abort(self, r: _Replica, rid: str) -> None:
        """`/abort_request` of the generation `rid` on replica `r`; a failure is logged."""
        data = orjson.dumps({"rid": rid})
        try:
            async with asyncio.timeout(self._abort_s):
                status, _, raw = await self._exchange(r, "POST", "/abort_request", data)
        except (TransportError, TimeoutError) as e:
            log.warning("engine %s: could not abort generation %s: %r", r.url, rid, e)
            return
        if status != 200:
            log.warning("engine %s: abort of %s answered %d: %r", r.url, rid, status, raw[:200])

    async def _open_stream(
        self, data: bytes, rollout_id: str | None
    ) -> tuple[_Replica, aiohttp.ClientResponse]:
        """A streamed `/generate` whose engine answered 200, on `pick(rollout_id)`'s replica, with
        `call`'s retries; the replica counts it in flight until the caller releases it."""

        async def once(r: _Replica) -> aiohttp.ClientResponse:
            r.inflight += 1
            try:
                try:
                    return await self._start(r, data)
                except _Unanswered:
                    return await self._start(r, data)
            except BaseException:
                r.inflight -= 1
                raise

        return await self._retried("/generate", rollout_id, once)

    async def _start(self, r: _Replica, data: bytes) -> aiohttp.ClientResponse:
        """The engine's answer to a streamed `/generate`, once its status is 200 (its body still to
        read, with no time limit of the session's: `stream` keeps its own); raises as `_once`
        does for an error status."""
        try:
            async with asyncio.timeout(self._timeout_s):
                reply = await self.http.post(r.url + "/generate", data=data, timeout=UNTIMED)
        except aiohttp.ServerDisconnectedError as e:
            raise _Unanswered(f"{r.url}/generate: {e!r}") from e
        except aiohttp.ClientConnectorError as e:
            raise TransportError(f"cannot connect to {r.url}: {e!r}") from e
        except (aiohttp.ClientError, OSError) as e:
            raise TransportError(f"{r.url}/generate: {e!r}") from e
        if reply.status < 400:
            return reply
        async with reply:
            raw = await reply.read()
        message = error_message(raw.decode(errors="replace"), reply.reason or "")
        if reply.status >= 500:
            raise _ServerError(f"engine answered {reply.status}: {message}")
        raise EngineRejected(f"engine rejected the request ({reply.status}): {message}")

    async def model_info(self) -> EngineInfo:
        """What the first replica that answers says of itself. The context length comes from `/v1/models`:
        sglang's `/model_info` has none, and its `/server_info` answers 500 on every server verl launches.
        The KV cache's size comes from `/v1/loads`, where the engine serves it."""
        _, info = await self.call("GET", "/model_info")
        _, models = await self.call("GET", "/v1/models")
        return read_engine_info(info, models, pool_tokens=await self.pool_tokens())

    async def pool_tokens(self) -> int | None:
        """The fewest tokens a data-parallel rank's KV cache holds (`/v1/loads`'
        `max_total_num_tokens`), or None where the engine does not serve `/v1/loads`."""
        try:
            _, loads = await self.call("GET", "/v1/loads")
        except EngineRejected:
            return None
        return read_pool_tokens(loads)

    # ------------------------------------------------------------------ plumbing

    def pick(self, rollout_id: str | None = None) -> _Replica:
        """The rollout's own replica if up, else the least-loaded one up (if none is, the one back
        soonest)."""
        now = time.monotonic()
        up = [r for r in self.replicas if r.down_until <= now]
        if rollout_id is not None:
            home = self.replicas[zlib.crc32(rollout_id.encode()) % len(self.replicas)]
            if home in up:
                return home
        if not up:
            return min(self.replicas, key=lambda r: r.down_until)
        return min(up, key=lambda r: r.inflight)

    async def call(
        self, method: str, path: str, body: Any = None, *, rollout_id: str | None = None
    ) -> tuple[_Replica, Any]:
        """One request, on `pick(rollout_id)`'s replica, with retries: (the replica that answered,
        its reply)."""

        async def once(r: _Replica) -> Any:
            r.inflight += 1
            try:
                return await self._once(r, method, path, body)
            finally:
                r.inflight -= 1

        return await self._retried(path, rollout_id, once)

    async def _retried(
        self, path: str, rollout_id: str | None, once: Callable[[_Replica], Awaitable[T]]
    ) -> tuple[_Replica, T]:
        """`once` on `pick(rollout_id)`'s replica, tried again with jittered backoff while a replica
        fails (a transport error, a timeout, a 5xx: it sits out `down_s`): (the replica that
        answered, what `once` returned)."""
        last: Exception | None = None
        for attempt in range(self._attempts):
            if attempt:
                delay = min(self._max_backoff_s, self._backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            r = self.pick(rollout_id)
            try:
                reply = await once(r)
            except (_ServerError, TransportError, TimeoutError) as e:
                # the replica's fault: retried
                last = e
                r.down_until = time.monotonic() + self._down_s
                n = f"{attempt + 1}/{self._attempts}"
                log.warning(
                    "engine %s%s failed (attempt %s) rollout_id=%s: %r",
                    r.url,
                    path,
                    n,
                    rollout_id,
                    e,
                )
                continue
            r.down_until = 0.0
            return r, reply
        reason = f"{type(last).__name__}: {last}"
        raise EngineUnavailable(
            f"{path} failed on any replica after {self._attempts} attempts: {reason}"
        ) from last

    async def _once(self, r: _Replica, method: str, path: str, body: Any) -> Any:
        data = None
        if body is not None:
            data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
        try:
            status, reason, raw = await self._exchange(r, method, path, data)
        except _Unanswered:
            status, reason, raw = await self._exchange(r, method, path, data)
        if status >= 400:
            message = error_message(raw.decode(errors="replace"), reason)
            if status >= 500:
                raise _ServerError(f"engine answered {status}: {message}")
            raise EngineRejected(f"engine rejected the request ({status}): {message}")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise EngineError(f"{r.url}{path} answered invalid JSON: {raw[:BODY_CUT]!r}") from e

    async def _exchange(
        self, r: _Replica, method: str, path: str, data: bytes | None
    ) -> tuple[int, str, bytes]:
        """One HTTP exchange: (status, reason phrase, body)."""
        try:
            async with self.http.request(method, r.url + path, data=data) as reply:
                return reply.status, reply.reason or "", await reply.read()
        except aiohttp.ServerDisconnectedError as e:
            raise _Unanswered(f"{r.url}{path}: {e!r}") from e
        except TimeoutError as e:
            raise TimeoutError(
                f"{r.url}{path}: no complete reply within {self._timeout_s:g} s"
            ) from e
        except aiohttp.ClientConnectorError as e:
            raise TransportError(f"cannot connect to {r.url}: {e!r}") from e
        except (aiohttp.ClientError, OSError) as e:
            raise TransportError(f"{r.url}{path}: {e!r}") from e


def _say_streams_whole(replica: _Replica) -> None:
    """Log, once per replica, that its stream chunks carry everything so far (sglang's default),
    and what makes streaming cheaper."""
    replica.streams_whole = True
    log.info(
        "engine %s streams each chunk whole so far: a streamed call costs the gateway about 4x "
        "the CPU of an unstreamed one; sglang's --incremental-streaming-output and "
        "--stream-interval 8 bring that to about 1.2x (docs/gpu.md)",
        replica.url,
    )


class _Events:
    """The server-sent events of a streamed reply (`data: ...` then a blank line), one at a time,
    and how far the stream got. A cumulative chunk can pass aiohttp's line limit, so the stream is
    split here, each byte looked at once; a read cancelled midway loses nothing."""

    def __init__(self, content: aiohttp.StreamReader) -> None:
        self.content = content
        self.buffer = bytearray()
        self.scanned = 0  # no separator starts before this offset of `buffer`
        self.finished = False  # a chunk that ends the generation came
        self.done = False  # `[DONE]` came

    async def next(self) -> bytes | None:
        """The next event's data; None at the end of the body."""
        while True:
            end = self.buffer.find(b"\n\n", self.scanned)
            if end == -1:
                self.scanned = max(len(self.buffer) - 1, 0)  # a separator may straddle two reads
                data = await self.content.readany()
                if not data:
                    return None
                self.buffer += data
                continue
            event = bytes(self.buffer[:end])
            del self.buffer[: end + 2]
            self.scanned = 0
            if event.startswith(b"data: "):
                return event[len(b"data: ") :]


async def _uncancelled(work: Awaitable[None]) -> None:
    """`work` run to its end even if the task awaiting it is cancelled meanwhile (the cancellation
    is raised once it has ended): what cleans up after a call must not be cut short by it."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    task.result()
