"""Domain records shared by every agl component: rollouts, calls, events, model versions.

- Standard library only, so that anything (harness-side helpers too) imports it cheaply.
- Wire schemas (pydantic, in the gateway) and table rows (SQLAlchemy, `agl.store`) convert to and
  from these explicitly; no I/O here.
- Token arrays are `array.array`s typed as `ARRAYS` says (int32 IDs, float32 logprobs): numpy
  views them without a copy.
- The rules every component shares: the rollout state machine (`TRANSITIONS`), which rollouts are
  trained on (`Rollout.counts`), and the kinds of prefix break (`PrefixBreak`).
"""

from __future__ import annotations  # array[int] is not subscriptable at run time before Python 3.12

import enum
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

JSON = dict[str, Any]
# A Call's token arrays: their array typecodes.
ARRAYS = {"prompt_ids": "i", "response_ids": "i", "logprobs": "f"}


class Status(enum.StrEnum):
    """Lifecycle of a rollout: queued -> running -> succeeded | failed | timed_out | cancelled."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the rollout has ended: no way out of this status."""
        return not TRANSITIONS[self]


# The rollout state machine. `queued` is reachable again only as a retry after an infra
# failure (a new attempt of the same rollout); terminal states (no way out) are final.
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.QUEUED: frozenset({Status.QUEUED, Status.RUNNING, Status.FAILED, Status.CANCELLED}),
    Status.RUNNING: frozenset(
        {Status.QUEUED, Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT, Status.CANCELLED}
    ),
} | dict.fromkeys(
    (Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT, Status.CANCELLED), frozenset()
)


class FailureKind(enum.StrEnum):
    """Why a rollout failed: `task` is a real RL outcome; `infra` is never trained on."""

    TASK = "task"
    INFRA = "infra"


class Mode(enum.StrEnum):
    """What a rollout is for: training, or validation."""

    TRAIN = "train"
    VAL = "val"


class PrefixBreak(enum.StrEnum):
    """Why a call's prompt does not extend an earlier call of its rollout (its sample splits there).

    - The gateway tells from the messages it renders: `new_chain`, `context_rewritten`,
      `template_edit`, `retokenized_boundary` (a `prefix_mismatch` event's `class`).
    - The adapter tells from one agent's recorded tokens: `new_chain`, `retokenized`, `rewritten`,
      `overflow` (its `mismatch_KIND` counts).
    """

    # the conversation starts differently from every earlier one: a sub-agent, a side request
    NEW_CHAIN = "new_chain"
    # gateway: same first message, but the harness changed its history (a summary, a truncation)
    CONTEXT_REWRITTEN = "context_rewritten"
    # gateway: the earlier messages render differently now, even with reasoning stripped
    TEMPLATE_EDIT = "template_edit"
    # gateway, prefix preservation off: the prompt tokenized afresh does not start with the
    # sampled IDs
    RETOKENIZED_BOUNDARY = "retokenized_boundary"
    # adapter: the prompt repeats the agent's last prompt but not the tokens sampled after it (a
    # re-rendered reply, changed whitespace, a token boundary)
    RETOKENIZED = "retokenized"
    # adapter: the prompt diverges within the agent's last prompt (an edited context)
    REWRITTEN = "rewritten"
    # adapter: merging the call would make the sample longer than `max_length`
    OVERFLOW = "overflow"


@dataclass(frozen=True)
class Rollout:
    """One harness run on one task. `attempt` counts from 1; only the last attempt's calls count."""

    id: str
    task: JSON
    group: str
    mode: Mode
    status: Status
    attempt: int = 1
    reward: float | None = None
    failure_kind: FailureKind | None = None
    has_grader: bool = False
    metadata: JSON = field(default_factory=dict)
    created_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    end_seq: int | None = None  # position in the order rollouts ended; cursor for the trainer

    @property
    def counts(self) -> bool:
        """The trained-on rule: whether the rollout ended with an outcome of the policy's own (a
        success or a task failure). Only these are trained on and counted in a mean reward
        (validation, the SWE probe); an infra failure or a cancel is not the policy's doing."""
        return (
            self.status.terminal
            and self.failure_kind is not FailureKind.INFRA
            and self.status is not Status.CANCELLED
        )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Self:
        """From a JSON object or a row's values; keys that name no field are ignored."""
        fields = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        fields["mode"] = Mode(fields["mode"])
        fields["status"] = Status(fields["status"])
        fields["failure_kind"] = None
        if values.get("failure_kind"):
            fields["failure_kind"] = FailureKind(values["failure_kind"])
        return cls(**fields)


@dataclass(frozen=True)
class Call:
    """One model call as the engine saw it (the gateway-adapter contract): `prompt_ids` is exactly
    what was fed, `response_ids` exactly what was sampled, `logprobs` their log-probabilities as
    sampled, at `temperature`."""

    rollout_id: str
    prompt_ids: array[int]
    response_ids: array[int]
    logprobs: array[float]
    attempt: int = 1
    seq: int = -1  # assigned by the store, 0-based within the rollout
    agent: str = ""
    model_version: int = 0
    finish_reason: str = "stop"
    latency_ms: float = 0.0
    temperature: float | None = 1.0  # 0: greedy; None: not recorded (a call from before it was)
    request: JSON = field(default_factory=dict)
    response: JSON = field(default_factory=dict)
    id: int | None = None
    created_at: float = 0.0
    gateway: str | None = None  # the gateway that recorded it; None: before it was recorded


@dataclass(frozen=True)
class Event:
    """An append-only log entry of a rollout: lifecycle, reward, harness-posted, flag, error."""

    rollout_id: str
    kind: str
    data: JSON = field(default_factory=dict)
    attempt: int = 1
    id: int | None = None
    created_at: float = 0.0


@dataclass(frozen=True)
class ModelVersion:
    """A version of the policy that the engines serve: its weights' `path`, the engines' URLs."""

    version: int
    path: str = ""
    endpoints: list[str] = field(default_factory=list)
    metadata: JSON = field(default_factory=dict)
    created_at: float = 0.0


@dataclass(frozen=True)
class Fleet:
    """What every gateway on one store follows: whether new calls are held (`paused`), the number
    of the latest pause (`epoch`), and the model version served (None: the latest registered).
    `serial` counts its changes: a gateway that read an older state than one it follows ignores it."""

    paused: bool = False
    epoch: int = 0
    version: int | None = None
    serial: int = 0


@dataclass(frozen=True)
class Gateway:
    """A gateway process serving from the store, as it registered: alive while its heartbeat is
    recent; `drained_epoch` is the latest pause it has drained its calls for."""

    id: str
    address: str
    pid: int
    started_at: float
    heartbeat_at: float
    drained_epoch: int = 0


@dataclass(frozen=True)
class Charge:
    """What a write counts against its rollout's storage budget: `size` bytes (the request body
    that made it), refused past `budget` bytes in all."""

    size: int
    budget: int
