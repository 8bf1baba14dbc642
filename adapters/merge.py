"""Recorded calls -> token-faithful samples of one rollout (DESIGN.md section 6.1).

Owns the merge rule: in trajectory mode a call joins an open sample of the same agent when that
sample's full token sequence is a prefix of the call's prompt IDs (the tokens in between are
fed, mask 0; the response is sampled, mask 1, with its recorded logprobs); otherwise it opens a
new sample, and the reason is classified. Transition mode makes one sample per call. Calls of
agents that are not trained, and calls sampled at another temperature than the trained one, are
left out (their tokens reach later calls' samples as fed context).

A sample is kept as a list of segments (numpy views of the calls' arrays, no copies) and is
concatenated once, for the whole batch, by `adapters.batch`. This module computes no
advantages or weights and never re-tokenizes or edits a token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from adapters.settings import AdapterError, AdapterSettings
from agl.types import Call

MISMATCHES = ("new_chain", "retokenized", "rewritten", "overflow")


@dataclass(eq=False, slots=True)
class Segment:
    """A run of tokens of one call: fed (`logprobs` is None, mask 0) or sampled (mask 1)."""

    ids: np.ndarray
    logprobs: np.ndarray | None
    seq: int
    version: int


@dataclass(eq=False, slots=True)
class Chain:
    """A sample being built. Its full sequence is always `last_prompt + last_response`."""

    agent: str
    segments: list[Segment] = field(default_factory=list)
    length: int = 0
    trained: int = 0
    last_prompt: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    last_response: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))

    def add(self, call: Call, prompt: np.ndarray, response: np.ndarray, logprobs: np.ndarray) -> None:
        self.segments.append(Segment(prompt[self.length :], None, call.seq, call.model_version))
        self.segments.append(Segment(response, logprobs, call.seq, call.model_version))
        self.length = len(prompt) + len(response)
        self.trained += len(response)
        self.last_prompt, self.last_response = prompt, response

    def is_prefix_of(self, prompt: np.ndarray) -> bool:
        p, r = self.last_prompt, self.last_response
        n = len(p) + len(r)  # compare the short response part first: it is where mismatches show
        return len(prompt) >= n and bool((prompt[len(p) : n] == r).all()) and bool((prompt[: len(p)] == p).all())

    def common_prefix(self, prompt: np.ndarray) -> int:
        done = 0
        for part in (self.last_prompt, self.last_response):
            m = min(len(part), len(prompt) - done)
            diff = np.flatnonzero(part[:m] != prompt[done : done + m])
            if diff.size or m < len(part):
                return done + int(diff[0] if diff.size else m)
            done += m
        return done


def _arrays(call: Call, rollout_id: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if call.rollout_id != rollout_id:
        raise AdapterError(f"rollout {rollout_id} call seq {call.seq}: the call belongs to rollout {call.rollout_id}")
    if len(call.response_ids) != len(call.logprobs):
        raise AdapterError(
            f"rollout {rollout_id} call seq {call.seq}: {len(call.response_ids)} response IDs "
            f"but {len(call.logprobs)} logprobs"
        )
    try:
        return (
            np.frombuffer(call.prompt_ids, dtype=np.int32),
            np.frombuffer(call.response_ids, dtype=np.int32),
            np.frombuffer(call.logprobs, dtype=np.float32),
        )
    except (TypeError, ValueError) as e:
        raise AdapterError(f"rollout {rollout_id} call seq {call.seq}: token arrays must be int32/float32: {e}") from e


def merge(
    rollout_id: str, calls: Sequence[Call], settings: AdapterSettings, stats: Counter[str], attempt: int = 1
) -> list[Chain]:
    """The samples of one rollout's calls (its `attempt`, in `seq` order); counts merges and mismatches in `stats`."""
    chains: list[Chain] = []
    open_chains: list[Chain] = []
    last_seq = -1
    for call in calls:
        prompt, response, logprobs = _arrays(call, rollout_id)
        if call.attempt != attempt or call.seq <= last_seq:
            raise AdapterError(
                f"rollout {rollout_id} call seq {call.seq}: expected the calls of attempt {attempt} in seq order, "
                f"got attempt {call.attempt} after seq {last_seq}"
            )
        last_seq = call.seq
        stats["calls"] += 1
        if settings.trained_agents is not None and call.agent not in settings.trained_agents:
            stats["calls_untrained"] += 1
            continue
        if settings.temperature is not None and call.temperature != settings.temperature:
            stats["calls_temperature_mismatch"] += 1  # its log-probs are of another distribution: fed, not trained
            continue
        chain = None
        if settings.mode == "trajectory":
            same_agent = [c for c in reversed(open_chains) if c.agent == call.agent]
            chain = next((c for c in same_agent if c.is_prefix_of(prompt)), None)
            if chain is not None and len(prompt) + len(response) > settings.max_length:
                stats["mismatch_overflow"] += 1
                open_chains.remove(chain)
                chain = None
            elif chain is None and open_chains:
                stats[f"mismatch_{_classify(same_agent, prompt)}"] += 1
            elif chain is not None:
                stats["calls_merged"] += 1
        if chain is None:
            chain = Chain(call.agent)
            chains.append(chain)
            open_chains.append(chain)
            if len(prompt) + len(response) > settings.max_length:
                stats["overlong_samples"] += 1
        chain.add(call, prompt, response, logprobs)
    return chains


def _classify(same_agent: list[Chain], prompt: np.ndarray) -> str:
    """Why a call extends none of its agent's open samples (compared with the most recent one).

    new_chain: the agent has no open sample (a sub-agent starting). retokenized:
    the prompt repeats the last call's prompt but not the tokens sampled after it (a re-rendered
    reply, changed whitespace, a token boundary). rewritten: it diverges earlier (a summarized
    or otherwise edited context).
    """
    if not same_agent:
        return "new_chain"
    last = same_agent[0]
    return "retokenized" if last.common_prefix(prompt) >= len(last.last_prompt) else "rewritten"
