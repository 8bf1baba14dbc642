"""The doctor's rows and table: the checks' names, how each ended, and the fix for a failure.

- Owns the eight checks' names in order (`CHECKS`), each one's general fix (`FIXES`), the
  exceptions a check raises to fail (`CheckFailed`) or to be skipped (`Skipped`), one check's row
  (`attempt`) and the table of rows (`table`).
- Knows nothing of what a check probes or of its order: `checkup.Doctor` runs the checks.
"""

import dataclasses
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

OK = "ok"
FAIL = "FAIL"
SKIPPED = "skipped"
NOT_RUN = "not run"
CHECKS = (
    "versions",
    "cuda",
    "backend",
    "v1/models",
    "generate",
    "stream",
    "left stream",
    "weight push",
)
SMALL_MODEL = (
    "The checks are about the stack, not the model's size: for a large model pass a small one of "
    "the same architecture family, e.g. actor_rollout_ref.model.path=Qwen/Qwen3.5-0.8B for "
    "Qwen3.5-9B."
)
FIXES = {  # for what a check did not foresee (its traceback is in the log) or an HTTP error
    "versions": "Reinstall agl with its extra, as the README's Install section does.",
    "cuda": "Check the NVIDIA driver (nvidia-smi) and that torch is a CUDA build "
    "(python -c 'import torch; print(torch.version.cuda)').",
    "backend": "Read the traceback above: Ray must start (`ray stop --force` clears a stale one), "
    "nothing else may hold the GPUs (nvidia-smi), and the model must load. " + SMALL_MODEL,
    "v1/models": "An engine did not answer /v1/models: read its log (on cuda, Ray's worker logs).",
    "generate": "An engine's /generate failed: read its log; check 1 names the sglang it needs.",
    "stream": "An engine's streamed /generate or /abort_request failed: read its log; check 1 "
    "names the sglang it needs.",
    "left stream": "The engine did not survive a stream left before the trainer's sleep: "
    "read its log (sglang: 'should be called only when server is idle' means it slept busy).",
    "weight push": "The trainer's weights did not reach the engines: read the traceback above (on "
    "cpu the engine loads them from trainer.default_local_dir, which it must be able to read).",
}


class CheckFailed(Exception):
    """A check found a problem: what it found, and the fix in one or two sentences."""

    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.fix = fix


class Skipped(Exception):
    """A check that does not apply to this config; the message says why."""


@dataclasses.dataclass(frozen=True)
class Result:
    """One row of the table."""

    check: str
    status: str  # OK, FAIL, SKIPPED or NOT_RUN
    detail: str
    fix: str = ""


def attempt(name: str, check: Callable[[], str]) -> Result:
    """One check's row: ok with its detail, skipped, or failed with its fix. A failure the check
    did not foresee gets its traceback logged and the check's general fix."""
    try:
        detail = check()
    except Skipped as e:
        return Result(check=name, status=SKIPPED, detail=str(e))
    except CheckFailed as e:
        return Result(check=name, status=FAIL, detail=e.detail, fix=e.fix)
    except Exception as e:
        log.exception("doctor: check %s raised", name)
        first_line = (str(e).strip().splitlines() or [""])[0][:300]
        detail = f"{type(e).__name__}: {first_line}"
        return Result(check=name, status=FAIL, detail=detail, fix=FIXES[name])
    return Result(check=name, status=OK, detail=detail)


def table(results: list[Result]) -> str:
    """The rows under a header and, for the first failure, its fix."""
    width = max(len(name) for name in ("check", *CHECKS))
    lines = [f"{'check':<{width}}  {'result':<7}  detail"]
    for r in results:
        lines.append(f"{r.check:<{width}}  {r.status:<7}  {r.detail}")
    failed = [r for r in results if r.status == FAIL]
    if failed:
        lines.append("")
        lines.append(f"fix ({failed[0].check}): {failed[0].fix}")
    return "\n".join(lines)
