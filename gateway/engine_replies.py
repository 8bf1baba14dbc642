"""What the engine's replies mean to the gateway, read into its own records and errors.

- Owns: the errors the engine client raises (`EngineError` and its kinds: unavailable, a
  retryable failure; rejected, the request's fault; aborted, the generation given up); reading
  sglang's replies against the protocol: a `/generate` reply into a `Generation` (a finish
  reason, one logprob per output token), a stream chunk into the `Piece` it adds (whether sglang
  streams each chunk whole so far or only the new tokens), an abort (status 400: the request
  refused, else the generation given up), an error body into its message (cut to `BODY_CUT`),
  and what the engine says of itself into an `EngineInfo`.
- Does not: send requests, choose replicas, retry or abort generations (`gateway/engines.py`),
  nor map errors to HTTP statuses (`gateway/errors.py`).
"""

import contextlib
from dataclasses import dataclass
from typing import Any

import orjson

BODY_CUT = 500  # characters of an engine's error body kept in messages and logs


class EngineError(Exception):
    """Base of the engine client's errors; also a reply that breaks the protocol."""


class EngineUnavailable(EngineError):
    """Every attempt failed with a transport error, a timeout or a 5xx reply (temporary: retry later)."""


class EngineRejected(EngineError):
    """The engine answered 4xx: the request itself is wrong (permanent: do not retry it)."""


class EngineAborted(EngineUnavailable):
    """The engine aborted the generation (sglang: a 200 whose finish reason is `abort`, with the
    partial output, as when a request is aborted to update weights, or waited too long): nothing
    to record; the harness may retry the call."""


@dataclass(frozen=True)
class Generation:
    """One `/generate` reply: what was sampled, with the logprob of each output token."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" (an abort raises `EngineAborted`)
    replica: str


@dataclass(frozen=True)
class Piece:
    """What one chunk of a streamed `/generate` adds: the tokens sampled since the last chunk,
    their logprobs, and on the last chunk why the generation ended ("stop" | "length")."""

    output_ids: list[int]
    logprobs: list[float]
    replica: str
    finish_reason: str | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What the gateway learns of its engine at start: `/model_info`, and the model card of `/v1/models`."""

    model_path: str
    tokenizer_path: str
    weight_version: str
    context_length: int | None  # the card's `max_model_len`; sglang's `/model_info` has none
    owned_by: str  # the card's `owned_by`: "sglang", or "agl" for the embedded engine
    pool_tokens: int | None = None  # `/v1/loads`' `max_total_num_tokens`: the KV cache's tokens


def read_engine_info(info: Any, models: Any, *, pool_tokens: int | None) -> EngineInfo:
    """What `/model_info` and the model card of `/v1/models` say of the engine; `pool_tokens`: the
    KV cache's tokens (`read_pool_tokens`)."""
    try:
        card = models["data"][0]
        context = card.get("max_model_len")
        return EngineInfo(
            model_path=str(info["model_path"]),
            tokenizer_path=str(info.get("tokenizer_path") or info["model_path"]),
            weight_version=str(info.get("weight_version")),
            context_length=int(context) if context else None,
            owned_by=str(card.get("owned_by", "")),
            pool_tokens=pool_tokens,
        )
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise EngineError(
            f"malformed /model_info or /v1/models reply: {info!r:.200} {models!r:.200}"
        ) from e


def read_pool_tokens(loads: Any) -> int:
    """The fewest tokens a data-parallel rank's KV cache holds: `/v1/loads`'
    `max_total_num_tokens`."""
    try:
        return min(int(load["max_total_num_tokens"]) for load in loads["loads"])
    except (KeyError, TypeError, ValueError) as e:
        raise EngineError(f"malformed /v1/loads reply: {loads!r:.200}") from e


def read_generation(reply: Any, url: str) -> Generation:
    """An unstreamed `/generate` reply of replica `url`: its tokens, with one logprob each."""
    try:
        meta = reply["meta_info"]
        reason = _finish_reason(meta, url)
        if reason is None:
            raise ValueError("a reply without a finish reason")
        output_ids = [int(t) for t in reply["output_ids"]]
        pairs = meta["output_token_logprobs"]
        logprobs = [float(p[0]) for p in pairs]
        if [int(p[1]) for p in pairs] != output_ids:
            raise ValueError("output_token_logprobs do not match output_ids")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise EngineError(f"malformed /generate reply from {url}: {str(reply)[:BODY_CUT]}") from e
    return Generation(output_ids=output_ids, logprobs=logprobs, finish_reason=reason, replica=url)


def read_chunk(event: bytes, url: str) -> Any:
    """A streamed event's JSON."""
    try:
        return orjson.loads(event)
    except orjson.JSONDecodeError as e:
        raise EngineError(f"{url}/generate streamed invalid JSON: {e}") from e


def ends_generation(chunk: Any) -> bool:
    """Whether a streamed chunk ends the generation: an error, or a finish reason."""
    if not isinstance(chunk, dict):
        return False
    if "error" in chunk:
        return True
    meta = chunk.get("meta_info")
    return isinstance(meta, dict) and meta.get("finish_reason") is not None


def read_piece(chunk: Any, seen: int, url: str) -> Piece:
    """What a streamed chunk adds to the `seen` tokens before it. sglang sends each chunk whole
    so far by default and only the new tokens with `--incremental-streaming-output`; either way
    `meta_info.completion_tokens` counts all so far, so the new tokens are the chunk's last
    `completion_tokens - seen`, whichever mode the engine runs in. An abort is read before the
    tokens: one from the waiting queue carries only the last output id."""
    if isinstance(chunk, dict) and "error" in chunk:
        error = chunk["error"]
        message = str(error.get("message", error) if isinstance(error, dict) else error)
        raise EngineRejected(f"the engine failed the generation mid-stream: {message[:BODY_CUT]}")
    try:
        meta = chunk["meta_info"]
        finish = _finish_reason(meta, url)
        new = int(meta["completion_tokens"]) - seen
        output_ids = chunk["output_ids"]
        pairs = meta["output_token_logprobs"]
        if not 0 <= new <= min(len(output_ids), len(pairs)):
            raise ValueError(f"{new} new tokens in a chunk of {len(output_ids)}")
        ids = [int(t) for t in output_ids[len(output_ids) - new :]]
        pairs = pairs[len(pairs) - new :]
        if [int(p[1]) for p in pairs] != ids:
            raise ValueError("output_token_logprobs do not match output_ids")
        logprobs = [float(p[0]) for p in pairs]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise EngineError(f"malformed /generate chunk from {url}: {str(chunk)[:BODY_CUT]}") from e
    return Piece(output_ids=ids, logprobs=logprobs, replica=url, finish_reason=finish)


def _finish_reason(meta: Any, url: str) -> str | None:
    """The finish reason of a reply's or chunk's `meta_info`: "stop" | "length", or None while a
    stream goes on; an abort raises (sglang: `{"type": "abort", "message", "status_code"}`): with
    status 400 the engine refused the request (`EngineRejected`: never retried), else it gave up
    the generation (`EngineAborted`)."""
    reason = meta["finish_reason"]
    if reason is None:
        return None
    if not isinstance(reason, dict):
        reason = {"type": reason}
    if reason.get("type") != "abort":
        return str(reason["type"])
    message = str(reason.get("message", ""))[:BODY_CUT]
    if reason.get("status_code") == 400:
        raise EngineRejected(f"engine rejected the request: {message}")
    raise EngineAborted(f"{url} aborted the generation: {message}")


def error_message(text: str, reason: str) -> str:
    """The error message of an sglang reply (`{"error": {"message"}}`, `{"message"}`) or its body,
    cut."""
    found = None
    with contextlib.suppress(ValueError, AttributeError):  # not JSON, or not an object
        data = orjson.loads(text)
        inner = data.get("error")
        if isinstance(inner, dict):
            found = inner.get("message")
        else:
            found = inner or data.get("message")
    return str(found or text or reason)[:BODY_CUT]
