"""Checks 4 to 6 on plain data: an engine's replies, read as the gateway reads them.

- Owns judging the context a `/v1/models` reply serves against the config's; a `/generate`
  reply's output ids, logprobs and finish (`parse_generation`); a stream's chunks
  (`parse_stream`) and the cadence sglang sends them at under `stream_interval`.
- Makes no HTTP call: `probes` sends the requests, and `checkup.Doctor` hands their replies here.
"""

import dataclasses
import math
from typing import Any

from trainer.doctor.report import CheckFailed


class MalformedReply(ValueError):
    """A `/generate` reply the gateway could not record."""


@dataclasses.dataclass(frozen=True)
class Sampled:
    """What a `/generate` reply says was sampled."""

    output_ids: list[int]
    logprobs: list[float]
    finish: str


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
