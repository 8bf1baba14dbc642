"""How an attempt ended: one named constructor per way it ends, and the status each records.

- Every path that ends an attempt builds its outcome here, and nowhere else: the local launcher
  (its wrapper's exit codes, its kill at the deadline, a stop, a grader that cannot start), a Job's
  status and pods (`manifests.py`), the Kubernetes launcher (a deleted Job), the reconcile loop
  (a launch that failed, a run lost in a restart, the final reward, a gateway restart, retry or
  end) and a rendered Job's reporter (`report.py`).
- The reporter runs in the pod with the standard library only: `manifests.reporter_program` puts
  this file's source ahead of `report.py`'s. So it imports nothing but the standard library, and
  names statuses by their values in `agl.types` (`Status` and `FailureKind` are string enums:
  they compare equal).
- A time-out is always the policy's failure (`task`): the store refuses a `timed_out` of another
  kind, and no constructor here asks for one.
- It knows no processes, pods or gateway, and decides no backoff: the loop says whether an
  attempt is left (`retry_or_end`).
"""

from dataclasses import dataclass

QUEUED = "queued"
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
    """How an attempt ended: a status and failure kind for the store, and a reason for people.

    Built only by the constructors below (and this module's functions); `reason` is for logs and
    events, never read back to decide anything."""

    status: str
    failure_kind: str | None = None
    reason: str = ""

    @classmethod
    def failed(cls, reason: str) -> "Outcome":
        """The policy's failure (the harness exited non-zero, or ended without a final reward):
        a real outcome, trained on, not retried."""
        return cls(status=FAILED, failure_kind=TASK, reason=reason)

    @classmethod
    def timed_out(cls, reason: str) -> "Outcome":
        """The harness ran past its time limit: the policy's failure, recorded as `timed_out`."""
        return cls(status=TIMED_OUT, failure_kind=TASK, reason=reason)

    @classmethod
    def launch_failed(cls, reason: str, *, permanent: bool = False) -> "Outcome":
        """The attempt, or its grader, could not start. `permanent`: the spec is at fault (a bad
        spec, a manifest the API refuses), a task failure; else infra (an image pull, a missing
        program, an API that did not answer), retried."""
        if permanent:
            return cls(status=FAILED, failure_kind=TASK, reason=reason)
        return cls(status=FAILED, failure_kind=INFRA, reason=reason)

    @classmethod
    def grader_failed(cls, reason: str) -> "Outcome":
        """The grader exited non-zero or ran past its time limit: not the policy's doing, retried."""
        return cls(status=FAILED, failure_kind=INFRA, reason=reason)

    @classmethod
    def lost(cls, reason: str) -> "Outcome":
        """The run ended, or vanished, and left no word of how: no exit code, a deleted or evicted
        Job, a lost node, a run not found after a restart. Infra, retried."""
        return cls(status=FAILED, failure_kind=INFRA, reason=reason)

    @classmethod
    def stopped(cls, reason: str) -> "Outcome":
        """The controller stopped the run: its rollout ended elsewhere (a cancel). Infra; the store
        keeps the end that came first."""
        return cls(status=FAILED, failure_kind=INFRA, reason=reason)


RAN = Outcome(status=SUCCEEDED, reason="ran to the end")


def exited(harness: int | None, grader: int | None = None, *, graded: bool = False) -> Outcome:
    """How the harness and, if `graded`, its grader ended, from their exit codes (None: none was
    written: it never started, or it was lost). The grader runs only after the harness exited 0."""
    if harness is None:
        return Outcome.lost("the harness left no exit code: it did not start, or it was lost")
    if harness in TIMEOUT_EXITS:
        return Outcome.timed_out(f"the harness ran past its timeout (exit {harness})")
    if harness in NOT_STARTED_EXITS:
        return Outcome.launch_failed(f"the harness could not start (exit {harness})")
    if harness != 0:
        return Outcome.failed(f"harness exited with {harness}")
    if not graded:
        return RAN
    if grader is None:
        return Outcome.lost("the grader left no exit code: it did not start, or it was lost")
    if grader in TIMEOUT_EXITS:
        return Outcome.grader_failed(f"the grader ran past its timeout (exit {grader})")
    if grader != 0:
        return Outcome.grader_failed(f"grader exited with {grader}")
    return RAN


def rewarded(outcome: Outcome, reward: float | None) -> Outcome:
    """The outcome once the final reward is known: a run that ran to the end without one failed,
    and that is the policy's doing."""
    if outcome.status == SUCCEEDED and reward is None:
        return Outcome.failed("the run ended without a final reward")
    return outcome


def across_restart(outcome: Outcome) -> Outcome:
    """The outcome of a run the gateway restarted under: a task failure (a time-out too) may be
    the gateway's doing, so it becomes infra, retried; any other outcome stands."""
    if outcome.failure_kind != TASK:
        return outcome
    reason = f"{outcome.reason}; the gateway restarted during the run"
    return Outcome(status=FAILED, failure_kind=INFRA, reason=reason)


def retry_or_end(outcome: Outcome, *, attempts_left: bool) -> Outcome:
    """What the controller records for an ended attempt: an infra failure with `attempts_left`
    goes back to `queued` as the next attempt; any other outcome ends the rollout as it says."""
    if outcome.failure_kind == INFRA and attempts_left:
        return Outcome(status=QUEUED, failure_kind=INFRA, reason=outcome.reason)
    return outcome
