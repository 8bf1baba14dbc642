"""How an attempt ended: the one rule from exit codes and final reward to a status and a failure kind.

Every path that ends an attempt applies it: the local launcher (exit codes its wrapper wrote), a
Job's outcome (its containers' exit codes, `manifests.py`), the reconcile loop (the final reward,
`loop.py`) and a rendered Job's reporter, which runs in the pod with the standard library only:
`manifests.reporter_program` puts this file's source ahead of `report.py`'s. So it imports nothing
but the standard library, and names statuses by their values in `agl.types` (`Status` and
`FailureKind` are string enums: they compare equal). It knows no processes, pods or gateway.
"""

from dataclasses import dataclass

SUCCEEDED = "succeeded"
FAILED = "failed"
TIMED_OUT = "timed_out"
TASK = "task"  # the policy's failure: trained on
INFRA = "infra"  # not the policy's: retried, never trained on

# `timeout` ended it: 124 after SIGTERM, 137 (128 + SIGKILL) when it ignored SIGTERM; the local
# launcher's kill at the deadline is a SIGKILL too (`KILLED`).
TIMEOUT_EXITS = (124, 137)
KILLED = 137
# The shell could not run it: 126 not executable, 127 not found (not in the image, a typo).
NOT_STARTED_EXITS = (126, 127)


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended. `succeeded` means it ran to the end; `rewarded` still checks the reward."""

    status: str
    failure_kind: str | None = None
    reason: str = ""

    @classmethod
    def infra(cls, reason: str) -> "Outcome":
        """A failure that is not the policy's: the attempt is retried."""
        return cls(status=FAILED, failure_kind=INFRA, reason=reason)

    @classmethod
    def task(cls, reason: str) -> "Outcome":
        """A failure of the policy (or of its spec): a real outcome, not retried."""
        return cls(status=FAILED, failure_kind=TASK, reason=reason)


RAN = Outcome(status=SUCCEEDED, reason="ran to the end")


def exited(harness: int | None, grader: int | None = None, *, graded: bool = False) -> Outcome:
    """How the harness and, if `graded`, its grader ended, from their exit codes (None: none was
    written: it never started, or it was lost). The grader runs only after the harness exited 0."""
    if harness is None:
        return Outcome.infra("the harness left no exit code: it did not start, or it was lost")
    if harness in TIMEOUT_EXITS:
        return Outcome(
            status=TIMED_OUT,
            failure_kind=TASK,
            reason=f"the harness ran past its timeout (exit {harness})",
        )
    if harness in NOT_STARTED_EXITS:
        return Outcome.infra(f"the harness could not start (exit {harness})")
    if harness != 0:
        return Outcome.task(f"harness exited with {harness}")
    if not graded:
        return RAN
    if grader is None:
        return Outcome.infra("the grader left no exit code: it did not start, or it was lost")
    if grader in TIMEOUT_EXITS:
        return Outcome.infra(f"the grader ran past its timeout (exit {grader})")
    if grader != 0:
        return Outcome.infra(f"grader exited with {grader}")
    return RAN


def rewarded(outcome: Outcome, reward: float | None) -> Outcome:
    """The outcome once the final reward is known: a run that ran to the end without one failed,
    and that is the policy's doing."""
    if outcome.status == SUCCEEDED and reward is None:
        return Outcome.task("the run ended without a final reward")
    return outcome
