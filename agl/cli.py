"""The `agl` command line: one subcommand per component, found through entry points.

`agl` imports none of the components (docs/architecture.md, "Layering"): each registers a `main(argv) -> int`
under `[project.entry-points."agl.commands"]` in pyproject.toml; this module only lists and
dispatches them, and configures logging, once, for every entry point.
"""

import ast
import logging
import os
import sys
from importlib.metadata import EntryPoint, entry_points
from importlib.util import find_spec


def main(argv: list[str] | None = None) -> int:
    """Run `agl COMMAND ARGS...`; without a known command, list the commands (status 2 for an
    unknown one)."""
    if argv is None:
        argv = sys.argv[1:]
    argv = list(argv)
    found = {ep.name: ep for ep in entry_points(group="agl.commands")}
    if not argv or argv[0] not in found:
        print("usage: agl COMMAND [ARGS...]  (agl COMMAND --help for its options)\n\ncommands:")
        for name, ep in sorted(found.items()):
            print(f"  {name:<12} {summary(ep)}")
        if argv and argv[0] not in ("-h", "--help"):
            return 2
        return 0
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=os.environ.get("AGL_LOG_LEVEL", "INFO"), format=fmt)
    return int(found[argv[0]].load()(argv[1:]) or 0)


def summary(ep: EntryPoint) -> str:
    """A command's one-line description: the first line of its module's docstring, read from the
    source without importing the module (the trainer's would load torch), less its "`agl X`:" head."""
    spec = find_spec(ep.module)
    if spec is None or spec.origin is None:
        return ep.value
    with open(spec.origin, encoding="utf-8") as source:
        doc = ast.get_docstring(ast.parse(source.read()))
    if not doc:
        return ep.value
    first = doc.splitlines()[0]
    if first.startswith("`") and "`: " in first:
        first = first.split("`: ", 1)[1]
    return first.rstrip(";:,.")


if __name__ == "__main__":
    sys.exit(main())
