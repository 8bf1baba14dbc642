"""The sample adapter's settings and its one error type.

Owns the knobs of the calls -> batch conversion (docs/architecture.md, "From calls to samples"),
each with its unit and the reason for its default. It reads no environment or command line: the
trainer builds these from its own settings.
"""

from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass


class AdapterError(ValueError):
    """Input the adapter cannot turn into samples; the message names the rollout (and call)."""


@dataclass(frozen=True)
class AdapterSettings:
    """How calls become a batch: merging, advantages, loss weights and packing."""

    # trajectory: merge prefix-extending calls into one sample; transition: one sample per call.
    mode: Literal["trajectory", "transition"] = "trajectory"
    # Longest merged sample (tokens). A call that would push its sample past it opens a new one;
    # 32k is a common training context. A single call longer than this is kept whole and counted.
    max_length: int = Field(default=32_768, ge=1)
    # Agent names whose calls are trained (selective optimization); None trains every agent.
    trained_agents: frozenset[str] | None = None
    # The members of a group the advantage is computed over. rollout: one advantage per rollout,
    # shared by all its samples (section 6.2); sample: each sample is its own member, so a rollout
    # split into k samples counts k times (a naive transition-level GRPO), kept for comparison.
    advantage_level: Literal["rollout", "sample"] = "rollout"
    # Advantage estimator, a name in `adapters.advantage.ESTIMATORS`: grpo | rloo | reinforce_pp.
    estimator: str = "grpo"
    # GRPO: divide by the group's std (original GRPO); False is Dr. GRPO's mean-only baseline.
    norm_by_std: bool = True
    # Added to the std before dividing (unitless); verl's default, so both agree.
    eps: float = Field(default=1e-6, ge=0)
    # Groups of fewer than two valid rollouts or with equal rewards carry no signal: drop them
    # (True) or keep them with verl's advantages; counted either way.
    drop_degenerate: bool = True
    # A call's intermediate rewards (posted for it, `final: false`), times this, are added to the
    # advantage of its sampled tokens (unitless); 0: every call gets its rollout's advantage
    # (identical assignment).
    intermediate_coef: float = 0.0
    # Reward used for a rollout that ended without one (a task failure); None makes it an error.
    missing_reward: float | None = 0.0
    # rollout: weight 1/(|M| * T_r) per token (section 6.3); the others are verl's sample-level
    # modes, kept for comparison.
    loss_mode: Literal["rollout", "token-mean", "seq-mean-token-mean"] = "rollout"
    # Drop rollouts whose oldest call is more than this many versions behind the trained version
    # (versions); None keeps every rollout.
    max_staleness: int | None = Field(default=None, ge=0)
    # Data-parallel ranks; each mini-batch is padded with zero-weight samples to a multiple of it.
    dp_size: int = Field(default=1, ge=1)
    # Rollouts per optimizer step (verl's ppo_mini_batch_size, counted in rollouts); None: one step
    # per batch. n trained rollouts take ceil(n / it) steps on consecutive whole rollouts, equal in
    # count (within one).
    minibatch_rollouts: int | None = Field(default=None, ge=1)
    # The sampling temperature the trainer computes log-probs at; calls sampled at another one
    # (their recorded log-probs are of another distribution) are not trained, and counted. None: no
    # check.
    temperature: float | None = None
    # Token ID of the one-token padding samples (any valid ID: they carry no weight).
    pad_token_id: int = 0

    def trains(self, agent: str) -> bool:
        """Whether the calls of `agent` are trained."""
        return self.trained_agents is None or agent in self.trained_agents
