"""`agl doctor CONFIG [key=value ...]`: a preflight of the training stack, before a long GPU run.

- Owns the command line: the config and overrides `agl train` takes, `--skip-versions`, the table
  printed, and the exit status (1 if a check failed).
- Runs no check itself: `checkup.Doctor` does, and `report.table` lays out the rows.
"""

import argparse
import logging

from trainer.config import ConfigError, load_config
from trainer.doctor.checkup import Doctor
from trainer.doctor.report import FAIL, SMALL_MODEL, table


def main(argv: list[str]) -> int:
    """`agl doctor`'s command line: the table printed; 1 if a check failed."""
    parser = argparse.ArgumentParser(
        prog="agl doctor", description=__doc__.split("\n")[0], epilog=SMALL_MODEL
    )
    parser.add_argument("config", help="the YAML `agl train` takes")
    parser.add_argument("overrides", nargs="*", help="key=value (Hydra syntax), as `agl train`'s")
    parser.add_argument(
        "--skip-versions",
        action="store_true",
        help="skip check 1, for an install that leaves a pin out on purpose (bench/gpu_kit's "
        "bundle has no flash-attn)",
    )
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per engine call otherwise
    try:
        cfg, agl = load_config(args.config, args.overrides)
    except ConfigError as e:
        parser.error(str(e))
    results = Doctor(cfg, agl, skip_versions=args.skip_versions).run()
    print(table(results))
    if any(r.status == FAIL for r in results):
        return 1
    return 0
