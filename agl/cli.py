"""The `agl` command line: one subcommand per component, found through entry points.

`agl` imports none of the components (DESIGN.md section 1): each registers a `main(argv) -> int`
under `[project.entry-points."agl.commands"]` in pyproject.toml; this module only lists and
dispatches them, and configures logging, once, for every entry point.
"""

import logging
import os
import sys
from importlib.metadata import entry_points


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = {ep.name: ep for ep in entry_points(group="agl.commands")}
    if not argv or argv[0] not in found:
        print("usage: agl COMMAND [ARGS...]  (agl COMMAND --help for its options)\n\ncommands:")
        for name, ep in sorted(found.items()):
            print(f"  {name:<12} {ep.value}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=os.environ.get("AGL_LOG_LEVEL", "INFO"), format=fmt)
    return int(found[argv[0]].load()(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
