"""The last container of a rendered Job (`agl jobs render`): it reports the attempt's end to the gateway.

Runs in the pod as `python3 -c <this file> WORKSPACE graded|ungraded`, so the standard library only. From the
exit codes `manifests.TIMED` left in the workspace it posts, with the rollout's token, the end the controller
would record. Exits 1 if the gateway never answers: a controller, if one runs, then sees an infra failure.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def call(path: str, body: dict | None = None) -> dict:
    url = f"{os.environ['AGL_GATEWAY_URL']}/api/rollouts/{os.environ['AGL_ROLLOUT_ID']}{path}"
    headers = {
        "Authorization": f"Bearer {os.environ['AGL_TOKEN']}",
        "Content-Type": "application/json",
    }
    request = urllib.request.Request(url, body and json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=30) as reply:
        return dict(json.load(reply))


def end(
    harness: str, grader: str, graded: bool, reward: float | None
) -> tuple[str, str | None, str]:
    """(status, failure kind, reason) from the exit codes ("" where none was written) and the final reward."""
    if harness in ("124", "137"):  # `timeout` ended it (137: it ignored SIGTERM)
        return "timed_out", None, f"the harness ran past its timeout (exit {harness})"
    if harness in ("", "126", "127"):
        return "failed", "infra", f"the harness did not start (exit {harness or 'unknown'})"
    if harness != "0":
        return "failed", "task", f"harness exited with {harness}"
    if graded and grader != "0":
        return "failed", "infra", f"grader exited with {grader or 'unknown'}"
    if reward is None:
        return "failed", "task", "the run ended without a final reward"
    return "succeeded", None, "reported by its Job"


def main(workspace: str, graded: bool) -> int:
    files = Path(workspace, ".agl-harness"), Path(workspace, ".agl-grader")
    harness, grader = (f.read_text().strip() if f.exists() else "" for f in files)
    attempt = int(os.environ["AGL_ATTEMPT"])
    for _ in range(12):  # a minute for a gateway that is restarting
        try:
            rollout = call("")
            status, kind, reason = end(harness, grader, graded, rollout["reward"])
            if rollout["status"] == "queued":  # its harness never called the model
                call(
                    "/status",
                    {"status": "running", "attempt": attempt, "reason": "reported by its Job"},
                )
            call(
                "/status",
                {"status": status, "failure_kind": kind, "reason": reason, "attempt": attempt},
            )
            return 0
        except urllib.error.HTTPError as e:
            if e.code in (
                403,
                409,
            ):  # it ended elsewhere (a cancel), or moved on to another attempt
                return 0
            print(f"agl report: gateway {e.code}: {e.read()[:500]!r}", file=sys.stderr)
        except OSError as e:
            print(f"agl report: {e!r}", file=sys.stderr)
        time.sleep(5)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] == "graded"))
