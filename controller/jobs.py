"""`agl jobs render`: create rollouts in the gateway and print their Secret + Job manifests.

For `kubectl apply -f -`: each rollout has `metadata.spec` (a controller launches its retries) and
`metadata.launch = "manifest"` (the applied Job is attempt 1). Validates the spec first; no cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import yaml

from agl.client import GatewayClient, GatewayError
from agl.types import JSON
from controller.launcher import Credentials
from controller.manifests import manifests
from controller.spec import Spec, SpecError, load_spec


async def render(gateway: str, admin_key: str, spec: Spec, count: int, group: str, task: JSON) -> list[JSON]:
    """Create `count` rollouts; return their manifests, Secret before Job."""
    docs: list[JSON] = []
    metadata = {"spec": spec.model_dump(mode="json"), "launch": "manifest"}
    async with GatewayClient(gateway, admin_key) as gw:
        for _ in range(count):
            made = await gw.create_rollout(task, group, grader=bool(spec.grader) or None, metadata=metadata)
            docs.extend(manifests(spec, Credentials.from_reply(made, 1, task)))
    return docs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agl jobs", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("render", help="create rollouts and print their manifests")
    cmd.add_argument("--spec", required=True)
    cmd.add_argument("--count", type=int, default=1)
    cmd.add_argument("--group", default="manual")
    cmd.add_argument("--task", default="{}", help="the task, as a JSON object")
    cmd.add_argument("--gateway", default=os.environ.get("AGL_CONTROLLER_GATEWAY", "http://127.0.0.1:8000"))
    cmd.add_argument("--admin-key", default=os.environ.get("AGL_CONTROLLER_ADMIN_KEY", ""))
    args = parser.parse_args(argv)
    try:
        spec, task = load_spec(args.spec), json.loads(args.task)
    except (SpecError, ValueError) as e:
        parser.error(str(e))
    if not isinstance(task, dict) or args.count < 1 or not args.admin_key:
        parser.error("--task must be a JSON object, --count at least 1, and an admin key is required")
    try:
        docs = asyncio.run(render(args.gateway, args.admin_key, spec, args.count, args.group, task))
    except GatewayError as e:
        print(f"agl jobs render: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))
    return 0
