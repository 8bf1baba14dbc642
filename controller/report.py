"""The last container of a rendered Job (`agl jobs render`): it reports the attempt's end to the gateway.

Runs in the pod as `python3 -c <manifests.reporter_program()> WORKSPACE graded|ungraded`: the
outcome rule's source (`outcome.py`), then this file's, standard library only. From the exit codes
`manifests.TIMED` left in the workspace and the rollout's final reward it posts, with the
rollout's token, the end the controller would record, by the same rule. Exits 1 if the gateway
never answers: a controller, if one runs, then sees an infra failure.
"""

import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# The outcome rule. In the pod there is no `controller` package: the rule's source ran just before
# this file's (`manifests.reporter_program`).
with contextlib.suppress(ModuleNotFoundError):
    from controller.outcome import exited, rewarded


def call(path: str, body: dict | None = None) -> dict:
    """A request to the rollout's own API with its token; the reply's JSON."""
    url = f"{os.environ['AGL_GATEWAY_URL']}/api/rollouts/{os.environ['AGL_ROLLOUT_ID']}{path}"
    headers = {
        "Authorization": f"Bearer {os.environ['AGL_TOKEN']}",
        "Content-Type": "application/json",
    }
    data = None
    if body is not None:
        data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, headers)
    with urllib.request.urlopen(request, timeout=30) as reply:
        return dict(json.load(reply))


def exit_code(path: Path) -> int | None:
    """The exit code `manifests.TIMED` kept in `path`; None if it wrote none."""
    if not path.exists():
        return None
    text = path.read_text().strip()
    if not text:
        return None
    return int(text)


def report(workspace: str, graded: bool, attempt: int) -> None:
    """Post the attempt's end; raises `OSError` (`HTTPError` too) if the gateway refuses it."""
    harness = exit_code(Path(workspace, ".agl-harness"))
    grader = exit_code(Path(workspace, ".agl-grader"))
    rollout = call("")
    outcome = rewarded(exited(harness, grader, graded=graded), rollout["reward"])
    if rollout["status"] == "queued":
        # Its harness never called the model.
        call("/status", {"status": "running", "attempt": attempt, "reason": "reported by its Job"})
    end = {
        "status": outcome.status,
        "failure_kind": outcome.failure_kind,
        "reason": outcome.reason,
        "attempt": attempt,
    }
    call("/status", end)


def main(workspace: str, graded: bool) -> int:
    attempt = int(os.environ["AGL_ATTEMPT"])
    # A minute for a gateway that is restarting.
    for _ in range(12):
        try:
            report(workspace, graded, attempt)
            return 0
        except urllib.error.HTTPError as e:
            # It ended elsewhere (a cancel), or moved on to another attempt.
            if e.code in (403, 409):
                return 0
            print(f"agl report: gateway {e.code}: {e.read()[:500]!r}", file=sys.stderr)
        except OSError as e:
            print(f"agl report: {e!r}", file=sys.stderr)
        time.sleep(5)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] == "graded"))
