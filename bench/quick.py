"""`--quick`: every benchmark's short run, so that a change which breaks one fails CI.

tests/bench/test_quick.py runs each benchmark with `--quick` and checks the names on its last
line. A quick run's figures are a smoke test of the benchmark, not a measurement: only a full run
is recorded in bench/README.md.
"""

from __future__ import annotations

import argparse
from typing import Any


def parse_args(parser: argparse.ArgumentParser, **quick: Any) -> argparse.Namespace:
    """Parses the command line. With `--quick`, the settings named in `quick` default to its
    smaller values; a flag given explicitly still wins."""
    shown = ", ".join(f"{name}={value}" for name, value in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"a short run for CI ({shown})")
    known, _ = parser.parse_known_args()
    if known.quick:
        parser.set_defaults(**quick)
    return parser.parse_args()
