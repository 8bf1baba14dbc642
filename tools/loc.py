"""Code lines of the control plane: per component, the core path, and each optional feature.

- A code line is neither blank nor a comment (docstrings count), as `tools/readability.py` counts.
- `FEATURES` names the modules of each optional feature: what a reader of the core path can skip.
  Every other module of the control plane is core; docs/architecture.md gives the reading path.
- `READING_PATH` is the core in the order a newcomer reads it, each module with what it owns;
  every core module is on it (`tests/tools/test_loc.py`), in docs/architecture.md's order.
- `python tools/loc.py` (`make loc`) prints the table; its last line is `control_plane_loc=N
  core_loc=N optional_loc=N engine_loc=N`. `--markdown` prints the features as a table,
  `--reading` the reading path.
- Size is reported, never targeted.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ["agl", "gateway", "controller", "trainer", "adapters"]
BLANK_OR_COMMENT = re.compile(r"^\s*(#|$)")

# feature: (what it adds, its modules); each module in one feature only
FEATURES: dict[str, tuple[str, list[str]]] = {
    "streaming": (
        "streamed replies, shown as sampled",
        ["gateway/stream.py"],
    ),
    "wire formats": (
        "Completions, Responses and Anthropic Messages beside Chat Completions",
        ["gateway/wire/completions.py", "gateway/wire/responses.py", "gateway/wire/messages.py"],
    ),
    "replicas": (
        "gateway replicas on one PostgreSQL",
        ["gateway/fleet.py", "agl/migrations/versions/0004_replicas.py"],
    ),
    "Kubernetes": (
        "rollouts as Jobs that report their own end; `agl jobs`",
        [
            "controller/kube.py",
            "controller/manifests.py",
            "controller/jobs.py",
            "controller/report.py",
        ],
    ),
    "doctor": (
        "`agl doctor`: the stack checked before a run",
        [
            "trainer/doctor/__init__.py",
            "trainer/doctor/cli.py",
            "trainer/doctor/checkup.py",
            "trainer/doctor/install.py",
            "trainer/doctor/replies.py",
            "trainer/doctor/probes.py",
            "trainer/doctor/report.py",
        ],
    ),
    "AIR": (
        "a reward for each tool call whose result came back failed (off by default)",
        ["gateway/air.py"],
    ),
    "CPU training": (
        "verl's FSDP workers on the CPU",
        ["trainer/cpu_platform.py", "trainer/fsdp_guard.py"],
    ),
}

# the core path in reading order: (module, what it owns); package __init__s and migrations left out
READING_PATH: list[tuple[str, str]] = [
    ("agl/types.py", "the domain records: rollout, call, event, version; the trained-on rule"),
    ("agl/settings.py", "settings groups read from the environment, and their flags"),
    ("agl/store/store.py", "`Store`, the API: opening a database, reads, each write's checks"),
    ("agl/store/writes.py", "what each write checks and changes, inside the writer's transaction"),
    ("agl/store/writer.py", "the writer thread: writes grouped, one transaction a group"),
    ("agl/store/chains.py", "a call stored as the extension of its agent's previous call"),
    ("agl/store/schema.py", "the tables, the engines, migrating"),
    ("agl/store/credentials.py", "a rollout's tokens and their stored hashes"),
    ("agl/store/errors.py", "the store's exceptions"),
    ("agl/client.py", "the admin API's client, for the controller and the trainer"),
    ("agl/cli.py", "the `agl` command: a subcommand per component"),
    ("gateway/app.py", "the HTTP app: routers, body limit, errors in the caller's format"),
    ("gateway/routes.py", "the routes: model calls, rollout records, admin API, health"),
    ("gateway/auth.py", "who may call what: the auth dependencies and their token cache"),
    ("gateway/proxy.py", "a model call: render, sample, record, answer"),
    ("gateway/gate.py", "pause, drain and maximum hold"),
    ("gateway/sampling.py", "the token budget, sampling parameters and stop strings"),
    ("gateway/rollouts.py", "what the gateway keeps of each rollout between its calls"),
    ("gateway/render.py", "messages to token IDs and back, with the model's chat template"),
    ("gateway/reply_parsing.py", "a sampled reply as a message: reasoning, content, tool calls"),
    ("gateway/engines.py", "the client of the engine replicas (sglang's HTTP API)"),
    ("gateway/engine_replies.py", "what the engine's replies, chunks and aborts mean"),
    ("gateway/wire/base.py", "what the wire formats share: requests, `Stream`, error objects"),
    ("gateway/wire/chat.py", "OpenAI Chat Completions: request, reply, stream"),
    ("gateway/types.py", "the shapes the gateway's modules hand each other"),
    ("gateway/errors.py", "how an error is answered and recorded"),
    ("gateway/metrics.py", "what `/metrics` counts"),
    ("gateway/settings.py", "the gateway's settings"),
    ("controller/loop.py", "the reconcile loop: which rollout runs when"),
    ("controller/outcome.py", "how an attempt ended, one constructor per way"),
    ("controller/launcher.py", "the launcher protocol and the local-process launcher"),
    ("controller/spec.py", "the rollout spec: what to run, validated"),
    ("adapters/merge.py", "recorded calls to token-faithful samples"),
    ("adapters/advantage.py", "one advantage per rollout"),
    ("adapters/batch.py", "rollouts to one training batch: loss shares, packing, staleness"),
    ("adapters/settings.py", "the adapter's settings"),
    ("trainer/loop.py", "`Trainer`: the training loop"),
    ("trainer/config.py", "`agl train`'s configuration: verl's config plus an `agl` section"),
    ("trainer/backend.py", "verl's workers train; the engines serve"),
    ("trainer/engines.py", "sleep, push the new weights, wake; idle first"),
    ("trainer/loss.py", "the policy loss in verl's registry"),
    ("trainer/checkpoints.py", "a run's checkpoints on disk"),
    ("trainer/metrics.py", "a step's metrics and the run's progress output"),
]


def code_lines(path: Path) -> int:
    lines = path.read_text().splitlines()
    return sum(1 for line in lines if not BLANK_OR_COMMENT.match(line))


def modules(component: str) -> list[Path]:
    return sorted((ROOT / component).rglob("*.py"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="the features as a table")
    parser.add_argument("--reading", action="store_true", help="the reading path as a table")
    args = parser.parse_args()
    optional = {ROOT / name for _, names in FEATURES.values() for name in names}
    reading = {ROOT / name for name, _ in READING_PATH}
    missing = sorted(
        str(path.relative_to(ROOT)) for path in optional | reading if not path.exists()
    )
    if missing:
        raise SystemExit(f"tools/loc.py: names modules that are gone: {missing}")
    if args.reading:
        print("| module | what it owns | code lines |")
        print("| --- | --- | ---: |")
        for name, owns in READING_PATH:
            print(f"| `{name}` | {owns} | {code_lines(ROOT / name)} |")
        return
    if args.markdown:
        print("| feature | what it adds | modules | code lines |")
        print("| --- | --- | --- | ---: |")
        for feature, (adds, names) in FEATURES.items():
            lines = sum(code_lines(ROOT / name) for name in names)
            shown = ", ".join(f"`{name}`" for name in names)
            print(f"| {feature} | {adds} | {shown} | {lines} |")
        return
    total = 0
    core = 0
    for component in COMPONENTS:
        paths = modules(component)
        lines = sum(code_lines(path) for path in paths)
        core += sum(code_lines(path) for path in paths if path not in optional)
        total += lines
        print(f"{component:<11} {lines:>5}")
    for feature, (_, names) in FEATURES.items():
        lines = sum(code_lines(ROOT / name) for name in names)
        print(f"  optional: {feature:<13} {lines:>5}")
    engine = sum(code_lines(path) for path in modules("engine"))
    print(f"engine      {engine:>5}")
    print(
        f"control_plane_loc={total} core_loc={core} optional_loc={total - core} engine_loc={engine}"
    )


if __name__ == "__main__":
    main()
