"""Settings, one small group per component, read from the environment (prefix `AGL_`).

Each group is a pydantic-settings class with its own prefix (`AGL_STORE_URL`, ...), each field
described with its unit and the reason for its default. `from_flags` reads the command line with
pydantic-settings' own parser (a flag per field), so a setting is declared once. There is
deliberately no global config file that collects every flag of every component.
"""

import sys
from collections.abc import Sequence
from typing import NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

S = TypeVar("S", bound=BaseSettings)


class Strict(BaseModel):
    """The base of input schemas (request bodies, specs, config sections): a misspelt field is an
    error, not silently ignored, and no string holds a NUL."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: object) -> object:
        """No NUL in a string: PostgreSQL's text columns refuse it, where SQLite stored it."""
        if isinstance(value, str) and "\x00" in value:
            raise ValueError("must not contain a NUL character")
        return value


def problems(e: ValidationError, prefix: str = "") -> str:
    """A pydantic error as one line naming each field: `prefix.field: message; ...`."""
    return "; ".join(
        f"{prefix}{'.'.join(map(str, err['loc'])) or 'body'}: {err['msg']}" for err in e.errors()
    )


def usage_error(prog: str, message: str) -> NoReturn:
    """Exit as argparse does on a bad command line: the message on stderr, status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def from_flags(cls: type[S], argv: Sequence[str], prog: str) -> S:
    """Settings of `cls` from the environment, overridden by a flag per field (`admin_key`:
    `--admin-key`; lists take commas or repeats), its description the help. A bad value exits as
    argparse does, naming the field."""
    try:
        return cls(_cli_parse_args=list(argv), _cli_prog_name=prog, _cli_kebab_case=True)
    except ValidationError as e:
        usage_error(prog, problems(e))


class StoreSettings(BaseSettings):
    """Where rollouts, calls, events and model versions are kept (`AGL_STORE_*`)."""

    model_config = SettingsConfigDict(env_prefix="AGL_STORE_", extra="forbid")

    url: str = Field(
        "sqlite:///agl.db", description="SQLAlchemy URL: SQLite (WAL), or postgresql+psycopg://..."
    )
    max_batch: int = Field(
        256, ge=1, description="Most writes in one group commit, sharing an fsync (count)."
    )
    group_wait_ms: float = Field(
        1.0, ge=0, description="Longest wait to fill a group, as large as the last (ms)."
    )
    max_tokens_per_array: int = Field(
        4_194_304, ge=1, description="Largest token array accepted (tokens)."
    )
    sqlite_checkpoint_s: float = Field(
        0.25,
        ge=0,
        description="How often a thread beside the writer copies SQLite's write-ahead log into the "
        "database (seconds); sooner when the log passes 16 MiB. 0: SQLite's own checkpoint, "
        "inside whichever commit takes the log past 1,000 pages, holding that group and every "
        "write queued behind it.",
    )
    sqlite_synchronous: str = Field(
        "NORMAL",
        pattern="^(OFF|NORMAL|FULL|EXTRA)$",
        description="SQLite PRAGMA synchronous. With WAL, NORMAL keeps every acknowledged write "
        "through a crash of any process (no fsync per commit: a few ms less per call); FULL also "
        "through a power loss or OS crash.",
    )
