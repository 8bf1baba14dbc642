"""`agl jobs render`: create rollouts in the gateway and print their Secret + Job manifests;
`list` and `cancel` a group's rollouts (a running controller stops a cancelled rollout's Job);
`gc` their Secrets.

For `kubectl apply -f -`: each rollout has `metadata.spec` (a controller launches its retries)
and `metadata.launch = "manifest"` (the applied Job is attempt 1). The Job reports its own end
(`report.py`); no controller need run. Validates the spec first; only `gc` talks to the cluster.
"""

import argparse
import asyncio
import json
import os
import sys

import yaml

from agl.client import GatewayClient, GatewayError
from agl.types import JSON, Rollout, Status
from controller.launcher import Credentials
from controller.manifests import deadline_s, manifests
from controller.spec import Spec, SpecError, load_spec


async def render(args: argparse.Namespace, spec: Spec, task: JSON) -> list[JSON]:
    """Create `args.count` rollouts, whose tokens expire `args.apply_within_s` after the Job's
    deadline would if it started now; return their manifests, Secret before Job."""
    docs: list[JSON] = []
    metadata = {"spec": spec.model_dump(mode="json"), "launch": "manifest"}
    ttl_s = deadline_s(spec, reported=True) + args.apply_within_s
    async with GatewayClient(args.gateway, args.admin_key) as gw:
        for _ in range(args.count):
            made = await gw.create_rollout(
                task,
                args.group,
                grader=bool(spec.grader),
                metadata=metadata,
                token_ttl_s=ttl_s,
            )
            docs.extend(manifests(spec, Credentials.from_reply(made, 1, task), reported=True))
    return docs


async def manage(gateway: str, admin_key: str, group: str, *, cancel: bool) -> list[Rollout]:
    """The group's rollouts; with `cancel`, those that had not ended are cancelled first."""
    async with GatewayClient(gateway, admin_key) as gw:
        found = await gw.list_rollouts(group=group, limit=10_000)
        for i, r in enumerate(found):
            if cancel and not r.status.terminal:
                try:
                    found[i] = await gw.set_status(r.id, Status.CANCELLED, reason="agl jobs cancel")
                except GatewayError as e:
                    if e.status != 409:  # 409: it ended meanwhile
                        raise
        return found


async def gc(namespace: str, grace_s: float) -> list[str]:
    """Delete the namespace's Secrets whose Job is gone, once `grace_s` old; their names."""
    from controller.kube import KubeLauncher, config  # the one module that imports kubernetes

    try:
        return await KubeLauncher(namespace, secret_grace_s=grace_s).collect()
    except config.ConfigException as e:
        raise SystemExit(
            f"agl jobs gc: no Kubernetes cluster to use ({e}): set KUBECONFIG, or run in a pod"
        ) from e


def gateway_flags() -> argparse.ArgumentParser:
    """The flags of the commands that talk to the gateway: `render`, `list` and `cancel`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--group", default="manual", help="the rollouts' group (a name; default: %(default)s)"
    )
    common.add_argument(
        "--gateway",
        default=os.environ.get("AGL_CONTROLLER_GATEWAY", "http://127.0.0.1:8000"),
        help="the gateway's URL (default: $AGL_CONTROLLER_GATEWAY, else http://127.0.0.1:8000)",
    )
    common.add_argument(
        "--admin-key",
        default=os.environ.get("AGL_CONTROLLER_ADMIN_KEY", ""),
        help="the gateway's admin key (default: $AGL_CONTROLLER_ADMIN_KEY)",
    )
    return common


def parser() -> argparse.ArgumentParser:
    """`agl jobs`'s command line: `render`, `list` and `cancel` (gateway flags), `gc` (cluster)."""
    parser = argparse.ArgumentParser(
        prog="agl jobs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = gateway_flags()
    sub = parser.add_subparsers(dest="command", required=True)

    render = sub.add_parser(
        "render",
        parents=[common],
        help="create rollouts and print their manifests",
    )
    render.add_argument("--spec", required=True, help="the rollout spec (a YAML file)")
    render.add_argument(
        "--count", type=int, default=1, help="rollouts to create (count; default: %(default)s)"
    )
    render.add_argument(
        "--task", default="{}", help="the task, as a JSON object (default: %(default)s)"
    )
    render.add_argument(
        "--apply-within-s",
        type=float,
        default=3600,
        help=(
            "time to apply the manifests (seconds; default: %(default)s): the tokens expire"
            " this long after the rollout's deadline"
        ),
    )

    sub.add_parser(
        "list",
        parents=[common],
        help="the group's rollouts: id, status, attempt, reward",
    )
    sub.add_parser(
        "cancel",
        parents=[common],
        help="cancel the group's rollouts that have not ended",
    )

    gc = sub.add_parser(
        "gc",
        help="delete Secrets whose Job is gone (no controller runs to do it)",
    )
    gc.add_argument(
        "--namespace", default="default", help="the Kubernetes namespace (default: %(default)s)"
    )
    gc.add_argument(
        "--grace-s",
        type=float,
        default=300,
        help="spare Secrets younger than this (seconds; default: %(default)s): not yet applied",
    )
    return parser


def main(argv: list[str]) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.command == "gc":
        for name in asyncio.run(gc(args.namespace, args.grace_s)):
            print(f"deleted {name}")
        return 0
    if not args.admin_key:
        cli.error("an admin key is required: --admin-key or AGL_CONTROLLER_ADMIN_KEY")
    try:
        if args.command != "render":
            cancel = args.command == "cancel"
            found = asyncio.run(manage(args.gateway, args.admin_key, args.group, cancel=cancel))
            for r in found:
                print(f"{r.id} {r.status.value} {r.attempt} {r.reward}")
            return 0
        spec = load_spec(args.spec)
        task = json.loads(args.task)
        if not isinstance(task, dict) or args.count < 1:
            raise ValueError("--task must be a JSON object and --count at least 1")
        docs = asyncio.run(render(args, spec, task))
    except (SpecError, ValueError) as e:
        cli.error(str(e))
    except GatewayError as e:
        print(f"agl jobs {args.command}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))
    return 0
