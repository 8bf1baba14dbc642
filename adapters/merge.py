"""Recorded calls -> token-faithful samples of one rollout (docs/architecture.md, "Merge").

- Trajectory mode: a call extends its agent's open sample whose full token sequence prefixes its
  prompt IDs (the tokens between are fed, mask 0; the response is sampled, mask 1, with its
  logprobs), else it opens a new one, the break counted by its `PrefixBreak` kind.
- Transition mode: one sample per call.
- Calls of untrained agents or at another temperature are left out (their tokens reach later
  samples as fed context).
- Samples are segment lists (numpy views, no copies) for `adapters.batch` to concatenate; no
  advantages or weights here, no token re-tokenized.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from adapters.settings import AdapterError, AdapterSettings
from agl.types import Call, PrefixBreak

# The prefix breaks told from recorded tokens: why a call extends none of its agent's open samples.
BREAKS = (
    PrefixBreak.NEW_CHAIN,
    PrefixBreak.RETOKENIZED,
    PrefixBreak.REWRITTEN,
    PrefixBreak.OVERFLOW,
)


@dataclass(eq=False, slots=True)
class Segment:
    """A run of tokens of one call: fed (`logprobs` is None, mask 0) or sampled (mask 1)."""

    ids: np.ndarray
    logprobs: np.ndarray | None
    seq: int


@dataclass(eq=False, slots=True)
class Draft:
    """A sample being built, as segments; its full token sequence is always `last_prompt + last_response`."""

    agent: str
    segments: list[Segment] = field(default_factory=list)
    length: int = 0
    trained: int = 0  # sampled tokens
    last_prompt: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    last_response: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))

    def add(
        self, call: Call, prompt: np.ndarray, response: np.ndarray, logprobs: np.ndarray
    ) -> None:
        """Extend the sample by a call: the prompt tokens it does not hold yet (fed), then the
        response (sampled)."""
        self.segments.append(Segment(ids=prompt[self.length :], logprobs=None, seq=call.seq))
        self.segments.append(Segment(ids=response, logprobs=logprobs, seq=call.seq))
        self.length = len(prompt) + len(response)
        self.trained += len(response)
        self.last_prompt = prompt
        self.last_response = response

    def is_prefix_of(self, prompt: np.ndarray) -> bool:
        """Whether the sample's full token sequence starts `prompt`."""
        p = self.last_prompt
        # compare the short response part first: it is where mismatches show
        return _starts_with(prompt[len(p) :], self.last_response) and _starts_with(prompt, p)


def _starts_with(ids: np.ndarray, prefix: np.ndarray) -> bool:
    return len(ids) >= len(prefix) and bool((ids[: len(prefix)] == prefix).all())


def _arrays(
    call: Call, rollout_id: str, attempt: int, last_seq: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The call's token arrays as numpy views (no copies), once its input is checked."""
    where = f"rollout {rollout_id} call seq {call.seq}"
    if call.rollout_id != rollout_id:
        raise AdapterError(f"{where}: the call belongs to rollout {call.rollout_id}")
    if len(call.response_ids) != len(call.logprobs):
        raise AdapterError(
            f"{where}: {len(call.response_ids)} response IDs but {len(call.logprobs)} logprobs"
        )
    try:
        prompt = np.frombuffer(call.prompt_ids, np.int32)
        response = np.frombuffer(call.response_ids, np.int32)
        logprobs = np.frombuffer(call.logprobs, np.float32)
    except (TypeError, ValueError) as e:
        raise AdapterError(f"{where}: token arrays must be int32/float32: {e}") from e
    if call.attempt != attempt or call.seq <= last_seq:
        expected = f"expected the calls of attempt {attempt} in seq order"
        raise AdapterError(f"{where}: {expected}, got attempt {call.attempt} after seq {last_seq}")
    return prompt, response, logprobs


def merge(
    rollout_id: str,
    calls: Sequence[Call],
    settings: AdapterSettings,
    stats: Counter[str],
    attempt: int = 1,
) -> list[Draft]:
    """The samples of one rollout's calls (its `attempt`, in `seq` order); counts merges and
    mismatches in `stats`."""
    drafts: list[Draft] = []
    # those a later call may still extend
    open_drafts: list[Draft] = []
    last_seq = -1
    for call in calls:
        prompt, response, logprobs = _arrays(call, rollout_id, attempt, last_seq)
        last_seq = call.seq
        stats["calls"] += 1
        if not settings.trains(call.agent):
            stats["calls_untrained"] += 1
            continue
        if settings.temperature is not None and call.temperature != settings.temperature:
            # its log-probs are of another distribution: fed, not trained
            stats["calls_temperature_mismatch"] += 1
            continue
        overlong = len(prompt) + len(response) > settings.max_length
        draft = None
        if settings.mode == "trajectory":
            draft = _extended(open_drafts, call.agent, prompt, overlong, stats)
        if draft is None:
            draft = Draft(agent=call.agent)
            drafts.append(draft)
            open_drafts.append(draft)
            stats["overlong_samples"] += overlong
        draft.add(call, prompt, response, logprobs)
    return drafts


def _extended(
    open_drafts: list[Draft],
    agent: str,
    prompt: np.ndarray,
    overlong: bool,
    stats: Counter[str],
) -> Draft | None:
    """The open sample of `agent` that a call with `prompt` extends (counted as merged), or None
    with the reason counted; a sample the call would make `overlong` is closed."""
    same_agent = [d for d in reversed(open_drafts) if d.agent == agent]
    draft = next((d for d in same_agent if d.is_prefix_of(prompt)), None)
    if draft is None:
        if same_agent:
            # compared with the agent's most recent sample
            if _starts_with(prompt, same_agent[0].last_prompt):
                stats[f"mismatch_{PrefixBreak.RETOKENIZED}"] += 1
            else:
                stats[f"mismatch_{PrefixBreak.REWRITTEN}"] += 1
        elif open_drafts:
            stats[f"mismatch_{PrefixBreak.NEW_CHAIN}"] += 1
        return None
    if overlong:
        stats[f"mismatch_{PrefixBreak.OVERFLOW}"] += 1
        open_drafts.remove(draft)
        return None
    stats["calls_merged"] += 1
    return draft
